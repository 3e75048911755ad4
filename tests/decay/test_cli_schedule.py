"""The `angelps schedule` verb."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from learners.cli.main import main


def test_csv_prints_every_update_at_full_precision(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "schedule",
            "--set",
            "ml.opt.decay.class.name=ExponentialLR",
            "--set",
            "ml.opt.decay.gamma=0.9",
            "--set",
            "ml.learn.rate=0.1",
            "--steps",
            "4",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [  # numbered from 1, as a job's sequence (update n: lr_at(n - 1))
        "update,lr",
        "1,0.1",
        f"2,{0.1 * 0.9!r}",
        f"3,{0.1 * 0.9**2!r}",
        f"4,{0.1 * 0.9**3!r}",
    ]


def test_conf_file_and_set_and_json_with_momentum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "job.properties"
    f.write_text("ml.opt.decay.class.name=CyclicLR\nml.opt.decay.max.lr=1.0\nml.learn.rate=0.5\n")
    rc = main(
        [
            "schedule",
            "--conf",
            str(f),
            "--set",
            "ml.opt.decay.step.size.up=2",
            "--steps",
            "5",
            "--format",
            "json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["lr"] == [0.5, 0.75, 1.0, 0.75, 0.5]
    assert doc["momentum"][0] == 0.9 and doc["momentum"][2] == 0.8
    assert doc["schedule"].startswith("CyclicLR(lr=0.5, max_lr=1.0")


def test_steps_is_the_total_for_schedules_that_need_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "schedule",
                "--set",
                "ml.opt.decay.class.name=CosineAnnealingLR",
                "--steps",
                "3",
                "--set",
                "ml.learn.rate=1",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "1,1.0" and lines[3] == f"3,{(1 + math.cos(math.pi * 2 / 3)) / 2!r}"


def test_bad_schedule_parameter_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "--set", "ml.opt.decay.class.name=ExponentialLR"]) == 2
    assert "ExponentialLR: ml.opt.decay.gamma is required" in capsys.readouterr().err
    assert main(["schedule", "--set", "ml.opt.decay.class.name=Cosine"]) == 2
    assert "unknown schedule; valid names (closest first): WarmupCosine" in capsys.readouterr().err
    assert main(["schedule", "--set", "ml.opt.decay.gama=1"]) == 2
    assert "did you mean ml.opt.decay.gamma" in capsys.readouterr().err


def test_plot_writes_png_with_title(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.png"
    assert (
        main(
            [
                "schedule",
                "--set",
                "ml.opt.decay.class.name=OneCycleLR",
                "--steps",
                "50",
                "--plot",
                str(out),
            ]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 5000


def test_subprocess_entry_point() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "angelps",
            "schedule",
            "--set",
            "ml.opt.decay.class.name=StepLR",
            "--set",
            "ml.opt.decay.step.size=2",
            "--steps",
            "3",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "update,lr\n1,0.5\n2,0.5\n3,0.05\n"
    h = subprocess.run(
        [sys.executable, "-m", "angelps", "schedule", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "examples:" in h.stdout and "--plot" in h.stdout


def test_a_job_s_table_schedule_for_a_table_the_model_lacks_is_refused_as_train_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    keys = ["--set", "ml.opt.decay.embedding.class.name=StepLR"]
    keys += ["--set", "ml.opt.decay.embedding.step.size=3"]
    assert main(["schedule", "--conf", "conf/lr_a9a.properties", *keys]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "angelps: error: ml.opt.decay.embedding.class.name: this model has no table 'embedding'; "
        "valid table names: weight, bias"
    )
    assert main(["schedule", "--conf", "conf/fm_census.properties", *keys]) == 0  # FM has one
    assert capsys.readouterr().out.splitlines()[0] == "epoch,lr,lr/embedding"


def test_a_schedule_that_overflows_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["schedule", "--set", "ml.opt.decay.class.name=ExponentialLR"]
    assert main([*argv, "--set", "ml.opt.decay.gamma=1.5", "--steps", "3000"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "angelps: error: ExponentialLR: the step size at update 1751 is inf (overflow); use a "
        "smaller gamma or fewer updates"
    )
