"""learners.runs.curves and .plot, and the `angelps plot` verb: parsing metrics.jsonl, errors, the figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from learners.cli.main import main
from learners.runs.curves import panels, read_metrics, run_labels, title_of
from learners.runs.plot import plot_metrics, plot_runs


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
    assert [r.name for r in runs] == ["m #1", "m #2"]  # an old file: several runs appended
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
    assert runs[0].headline_keys() == ["valid_logloss", "valid_auc"]  # in panel order


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


def test_plotting_a_local_run_loads_no_pyarrow(tmp_path: Path, heavy_after) -> None:
    # angelps.fs (pyarrow) is for a run on object storage only; numpy is matplotlib's.
    f = _write(tmp_path / "m.jsonl", _lines())
    argv = ["plot", str(f), "--out", str(tmp_path / "c.png")]
    assert heavy_after(f"from learners.cli.main import main\nassert main({argv!r}) == 0") == [
        "numpy"
    ]
    assert (tmp_path / "c.png").stat().st_size > 20_000


def _by_key(ps):
    return {p.key: p for p in ps}


def test_each_family_of_metrics_has_its_panel_on_one_epoch_axis(tmp_path: Path) -> None:
    (run,) = read_metrics(_write(tmp_path / "m.jsonl", _lines()))
    ps = panels([run])
    assert [p.key for p in ps] == ["loss", "auc", "lr", "speed"]
    loss = _by_key(ps)["loss"]
    assert [(s.style, s.label) for s in loss.series] == [
        ("interval", "training (per log interval)"),
        ("epoch", "training (epoch mean)"),
        ("valid", "validation logloss"),
    ]
    interval, epoch, valid = loss.series
    # 4 updates per epoch (where epoch 1's steps end): update u at u / 4, epochs from 1.
    assert interval.xs == [u / 4 for u in range(1, 13)]
    assert epoch.xs == valid.xs == [1.0, 2.0, 3.0]
    assert math.isnan(valid.ys[1])
    (auc,) = _by_key(ps)["auc"].series
    assert (auc.label, auc.xs) == ("validation AUC", [1.0, 2.0, 3.0])
    assert auc.ys == pytest.approx([0.8, 0.83, 0.86])
    (lr,) = _by_key(ps)["lr"].series
    assert lr.xs[:2] == [0.25, 0.5] and lr.ys[:4] == [0.5] * 4 and lr.ys[4] == 0.25


def _regression(n: int = 2) -> list[dict]:
    rows: list[dict] = [
        {"kind": "start", "run": "reg-1", "job": "reg", "model": "LinearRegression",
         "updates_per_epoch": 10, "lr": 0.3, "decay": "CosineAnnealingLR", "global_batch": 64,
         "workers": 2},
    ]  # fmt: skip
    for e in range(n):
        rows.append({"kind": "step", "epoch": e, "step": 10 * e + 10, "updates": 10,
                     "loss": 5.0 - e, "lr": 0.3})  # fmt: skip
        rows.append({"kind": "epoch", "epoch": e, "step": 10 * e + 10, "lr": 0.3,
                     "train_loss": 5.0 - e, "valid_loss": 4.5 - e, "valid_mse": 4.5 - e,
                     "valid_rmse": 2.1 - e / 10, "valid_mae": 1.6, "valid_r2": 0.4 + e / 10,
                     "valid_count": 400.0, "valid_rows": 400})  # fmt: skip
    return rows


def test_regression_errors_apart_from_r2_and_the_loss_with_the_losses(tmp_path: Path) -> None:
    (run,) = read_metrics(_write(tmp_path / "m.jsonl", _regression()))
    assert run.name == "reg-1"  # the run's own name, from its start line
    ps = _by_key(panels([run]))
    assert list(ps) == ["loss", "error", "r2", "lr"]  # no samples/s logged: no throughput
    assert [s.label for s in ps["loss"].series] == [
        "training (every 10 updates)",
        "training (epoch mean)",
        "validation loss",
    ]
    assert [s.label for s in ps["error"].series] == ["RMSE", "MAE"]
    assert [s.label for s in ps["r2"].series] == ["R²"]
    assert ps["r2"].series[0].xs == [1.0, 2.0]
    # The step size holds over the updates a line covers: the first from update 0.
    assert ps["lr"].series[0].xs == [0.0, 1.0, 2.0]
    # updates per epoch from the start line: the step at update 10 ends epoch 1.
    assert ps["loss"].series[0].xs == [1.0, 2.0]
    assert title_of([run]) == (
        "reg · LinearRegression · lr 0.3 · CosineAnnealingLR · batch 64 · 2 workers · "
        "10 updates/epoch\nreg-1"
    )


def test_a_metric_asked_for_gets_its_own_panel(tmp_path: Path) -> None:
    (run,) = read_metrics(_write(tmp_path / "m.jsonl", _lines()))
    ps = panels([run], ["valid_auc", "valid_true_recall"])
    assert [p.key for p in ps] == ["loss", "auc", "valid_true_recall", "lr", "speed"]
    # The logloss was not asked for: the loss panel has the training curves only.
    assert [s.style for s in ps[0].series] == ["interval", "epoch"]
    assert ps[2].title == "true_recall (validation)"


def _run_dir(root: Path, name: str, lr0: float, epochs: int = 3) -> Path:
    d = root / name
    d.mkdir(parents=True)
    rows = _lines(n_epochs=epochs, lr0=lr0)
    rows[0] = {"kind": "start", "run": name, "job": "lr", "model": "LogisticRegression",
               "lr": lr0, "updates_per_epoch": 4, "workers": 1}  # fmt: skip
    _write(d / "metrics.jsonl", rows)
    (root / "latest").write_text(name + "\n")
    return d


def test_cli_plots_the_latest_run_or_compares_named_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    _run_dir(root, "lr-20261123-120000", 0.5)
    _run_dir(root, "lr-20261123-130000", 0.1, epochs=2)
    drawn: list[tuple[list[str], list[str], str]] = []

    def spy(ps, runs, out, title):
        drawn.append(([p.key for p in ps], [r.name for r in runs], title))
        return out

    monkeypatch.setattr("learners.runs.plot_draw.draw", spy)
    assert main(["plot", "--log-dir", str(root), "--out", str(tmp_path / "a.png")]) == 0
    assert drawn[-1][1] == ["lr-20261123-130000"]  # the latest
    args = ["plot", "lr-20261123-120000", str(root / "lr-20261123-130000")]
    assert main([*args, "--log-dir", str(root), "--out", str(tmp_path / "b.png")]) == 0
    keys, names, title = drawn[-1]
    assert names == ["lr-20261123-120000", "lr-20261123-130000"]
    assert keys == ["loss", "auc", "lr", "speed"]
    # What both runs share heads the title; what differs (the lr) is left to the legend.
    assert title == "lr · LogisticRegression · 1 worker · 4 updates/epoch\n2 runs compared"
    assert main(["plot", "nope", "--log-dir", str(root)]) == 2
    assert (
        "angelps: error: nope: no such run, run directory or metrics file; runs under "
        f"{root}: lr-20261123-120000, lr-20261123-130000"
    ) in capsys.readouterr().err
    assert main(["plot", "lr-20261123-120000", "lr-20261123-120000", "--log-dir", str(root)]) == 2
    assert "lr-20261123-120000: the same run named more than once" in capsys.readouterr().err


def test_compared_runs_draw_to_a_png(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    a = read_metrics(_run_dir(root, "a", 0.5) / "metrics.jsonl")
    b = read_metrics(_run_dir(root, "b", 0.1, epochs=2) / "metrics.jsonl")
    assert run_labels(a + b) == ["a (lr 0.5)", "b (lr 0.1)"]  # the legend: what differs
    png = plot_runs(a + b, tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_out_the_figure_goes_into_the_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = tmp_path / "runs"
    for name in ("job-20261123-120000", "job-20261123-130000"):
        (logs / name).mkdir(parents=True)
        _write(logs / name / "metrics.jsonl", _lines())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "curves.png").write_text("a file of the current directory")
    assert main(["plot", "--log-dir", str(logs), "job-20261123-120000"]) == 0
    out = logs / "job-20261123-120000" / "curves.png"
    assert out.stat().st_size > 20_000 and f"wrote {out}" in capsys.readouterr().err
    assert (tmp_path / "curves.png").read_text() == "a file of the current directory"
    names = ["job-20261123-120000", "job-20261123-130000"]
    assert main(["plot", "--log-dir", str(logs), *names]) == 0
    assert (logs / "compare.png").stat().st_size > 20_000
