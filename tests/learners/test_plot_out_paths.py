"""The image paths of `angelps plot --out` and `angelps schedule --plot`: a path that cannot be
written is one error line naming the option and the value (exit 2), told before any work, and
a missing directory is not created (as `export --out` and `predict --out` refuse it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learners.cli.main import main

RUN = "lr-20261123-120000"
SCHEDULE = ["schedule", "--conf", str(Path("conf/lr_a9a.properties").resolve()), "--steps", "2"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (before the fix a URL was made a relative folder, s3:/bucket: never in the checkout)
    monkeypatch.chdir(tmp_path)


def _valid() -> str:
    from matplotlib.backend_bases import FigureCanvasBase

    rest = sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"png", "pdf", "svg"})
    return ", ".join(f".{f}" for f in ["png", "pdf", "svg", *rest])


def _log_dir(tmp_path: Path) -> Path:
    """A log directory holding one run's metrics.jsonl, written without training."""
    run = tmp_path / "runs" / RUN
    run.mkdir(parents=True)
    lines = [{"kind": "start", "model": "lr"}]
    for e in range(3):
        lines.append({"kind": "step", "epoch": e, "step": e + 1, "lr": 0.5, "loss": 0.7 / (e + 1)})
        lines.append({"kind": "epoch", "epoch": e, "train_loss": 0.5 - 0.1 * e, "valid_auc": 0.8})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return tmp_path / "runs"


def _bad_paths(tmp_path: Path) -> list[tuple[str, str]]:
    """(path, what is wrong with it) for each kind of image path that cannot be written."""
    data = tmp_path / "small.libsvm"
    data.write_text("1 1:1\n")
    return [
        (f"{data}/x.png", f"{data} is a file, not a directory"),
        (f"{tmp_path}/x.txt", f"matplotlib cannot write .txt; valid: {_valid()}"),
        (f"{tmp_path}/x", f"no suffix to tell the image format; valid: {_valid()}"),
        (f"{tmp_path}/missing/dir/x.png", f"the directory {tmp_path}/missing/dir does not exist"),
        ("s3://bucket/x.png", "a figure is written to the local disk only"),
    ]


@pytest.mark.parametrize("case", range(5), ids=["file", "txt", "nosuffix", "missing", "url"])
def test_schedule_bad_plot_path_is_one_line_and_prints_nothing(
    case: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, why = _bad_paths(tmp_path)[case]
    assert main([*SCHEDULE, "--plot", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # checked before the values are printed
    assert err == f"angelps: error: --plot {path}: {why}\n"
    assert not (tmp_path / "missing").exists()  # a missing directory is not made


def test_schedule_plot_into_a_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SCHEDULE, "--plot", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"angelps: error: --plot {tmp_path} is a directory: expected a file name\n"


@pytest.mark.parametrize("case", range(5), ids=["file", "txt", "nosuffix", "missing", "url"])
def test_plot_bad_out_path_is_one_line(
    case: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, why = _bad_paths(tmp_path)[case]
    assert main(["plot", "--log-dir", str(_log_dir(tmp_path)), RUN, "--out", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"angelps: error: --out {path}: {why}\n"
    assert not (tmp_path / "missing").exists()


def test_plot_out_is_checked_before_the_runs_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No such run either: the path is told first, before any run is looked for.
    path = f"{tmp_path}/x.txt"
    assert main(["plot", "--log-dir", str(tmp_path), "nope", "--out", path]) == 2
    assert capsys.readouterr().err.startswith(f"angelps: error: --out {path}: matplotlib cannot")


@pytest.mark.parametrize("name", ["s.png", "s.SVG", "s.pdf"])
def test_good_paths_still_write_the_image(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / f"schedule-{name}"
    assert main([*SCHEDULE, "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("epoch,lr\n1,") and f"wrote {plot}" in err
    curves = tmp_path / f"curves-{name}"
    assert main(["plot", "--log-dir", str(_log_dir(tmp_path)), RUN, "--out", str(curves)]) == 0
    assert f"wrote {curves}" in capsys.readouterr().err
    for image in (plot, curves):
        head = image.read_bytes()[:8]
        assert {
            "png": head == b"\x89PNG\r\n\x1a\n",
            "svg": b"<?xml" in head,
            "pdf": head[:4] == b"%PDF",
        }[name.rsplit(".", 1)[1].lower()]
