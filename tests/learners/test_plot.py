"""learners.plot and the `angelps plot` verb: parsing metrics.jsonl, errors, the figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from learners.cli.main import main
from learners.plot import plot_metrics, read_metrics


def _lines(n_epochs: int = 3, steps_per_epoch: int = 4, lr0: float = 0.5) -> list[dict]:
    out: list[dict] = [{"kind": "start", "model": "lr"}]
    for e in range(n_epochs):
        for s in range(steps_per_epoch):
            step = e * steps_per_epoch + s + 1
            out.append(
                {
                    "kind": "step",
                    "epoch": e,
                    "step": step,
                    "lr": lr0 * 0.5**e,
                    "loss": 0.7 / step,
                    "samples_per_s": 1000.0 + step,
                    "pull_s": 0.01,
                    "compute_s": 0.02,
                    "push_s": 0.01,
                    "wait_s": 0.0,
                }
            )
        out.append(
            {
                "kind": "epoch",
                "epoch": e,
                "lr": lr0 * 0.5**e,
                "train_loss": 0.5 - 0.1 * e,
                "valid_auc": 0.8 + 0.03 * e,
                "valid_logloss": 0.45 - 0.05 * e if e != 1 else None,
                "valid_rows": 1000,
                "valid_true_recall": 0.5,
            }
        )
    out.append({"kind": "summary", "epochs": n_epochs})
    return out


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_read_metrics_splits_appended_runs_and_keeps_values(tmp_path: Path) -> None:
    f = _write(tmp_path / "m.jsonl", _lines() + _lines(n_epochs=2, lr0=0.1))
    runs = read_metrics(f)
    assert len(runs) == 2
    assert [len(r.steps) for r in runs] == [12, 8]
    assert [len(r.epochs) for r in runs] == [3, 2]
    xs, ys = runs[0].series("epoch", "epoch", "valid_auc")
    assert xs == [0.0, 1.0, 2.0]
    assert ys == pytest.approx([0.80, 0.83, 0.86])
    _, loss = runs[0].series("epoch", "epoch", "valid_logloss")
    assert loss[0] == pytest.approx(0.45) and math.isnan(loss[1])  # null: a gap, not a crash
    _, lr = runs[1].series("step", "step", "lr")
    assert lr[:4] == [0.1] * 4 and lr[4:] == [0.05] * 4
    assert runs[0].valid_keys() == [
        "valid_auc",
        "valid_logloss",
        "valid_rows",
        "valid_true_recall",
    ]
    # Counts and recalls are not drawn unless asked for.
    assert runs[0].headline_keys() == ["valid_auc", "valid_logloss"]


def test_a_run_without_summary_line_is_split_where_steps_restart(tmp_path: Path) -> None:
    first = [r for r in _lines() if r["kind"] != "summary"]  # killed before its summary
    f = _write(tmp_path / "m.jsonl", first + _lines(n_epochs=1))
    runs = read_metrics(f)
    assert [len(r.steps) for r in runs] == [12, 4]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"kind": "step", "step": 1, "loss": 0.5}\n{"kind": "step", "step": 2, "loss"\n',
            r"m\.jsonl:2: not a JSON object \(Expecting ':' delimiter\)",
        ),
        ("[1, 2]\n", r"m\.jsonl:1: expected a JSON object, found '\[1, 2\]'"),
        (
            '\n{"kind": "step", "step": 3}\n',
            r"m\.jsonl:2: a step line needs a number in 'loss', found None",
        ),
        (
            '{"kind": "epoch", "epoch": "one"}\n',
            r"m\.jsonl:1: a epoch line needs a number in 'epoch', found 'one'",
        ),
        (
            '{"kind": "epoch", "epoch": 0, "valid_auc": "high"}\n',
            r"m\.jsonl:1: 'valid_auc' should be a number or null, found 'high'",
        ),
        ('{"kind": "start"}\n', r"m\.jsonl: no step or epoch lines"),
        ("", r"m\.jsonl: no step or epoch lines"),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "m.jsonl"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_metrics(f)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.jsonl: no such metrics file"):
        read_metrics(tmp_path / "nope.jsonl")


def test_plot_writes_png_and_svg(tmp_path: Path) -> None:
    f = _write(tmp_path / "m.jsonl", _lines() + _lines(n_epochs=2))
    png = plot_metrics(f, tmp_path / "out" / "curves.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    svg = plot_metrics(f, tmp_path / "curves.svg", metrics=["valid_auc"], last_run_only=True)
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_plot_with_epoch_lines_only(tmp_path: Path) -> None:
    f = _write(tmp_path / "m.jsonl", [r for r in _lines() if r["kind"] == "epoch"])
    assert plot_metrics(f, tmp_path / "c.png").stat().st_size > 10_000


def test_unknown_metric_lists_what_is_there(tmp_path: Path) -> None:
    f = _write(tmp_path / "m.jsonl", _lines())
    with pytest.raises(
        ValueError,
        match="no valid_rmse in the epoch lines; present: valid_auc, valid_logloss, valid_rows, valid_true_recall",
    ):
        plot_metrics(f, tmp_path / "c.png", metrics=["valid_rmse"])


def test_unknown_image_format(tmp_path: Path) -> None:
    f = _write(tmp_path / "m.jsonl", _lines())
    with pytest.raises(ValueError, match=r"--out .*c\.xyz: Format 'xyz' is not supported"):
        plot_metrics(f, tmp_path / "c.xyz")


def test_cli_plot_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _write(tmp_path / "m.jsonl", _lines())
    out = tmp_path / "curves.png"
    assert main(["plot", str(f), "--out", str(out)]) == 0
    assert out.stat().st_size > 20_000
    assert f"wrote {out}" in capsys.readouterr().err

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "step", "step": 1, "loss": 0.5}\nnot json\n')
    assert main(["plot", str(bad), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert f"angelps: error: {bad}:2: not a JSON object" in err
    assert not (tmp_path / "x.png").exists()
