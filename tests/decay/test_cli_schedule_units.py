"""`angelps schedule` for schedules counted in samples or epochs, per table, and scaled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import decay
from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path, rows: int, text: str) -> str:
    data = tmp_path / "a.libsvm"
    with open(ROOT / "data/a9a/a9a_123d_train.libsvm") as f:
        data.write_text("".join(f.readline() for _ in range(rows)))
    job = tmp_path / "job.properties"
    job.write_text(
        f"angel.train.data.path={data}\nml.data.type=libsvm\nml.data.validate.ratio=0\n"
        "ml.minibatch.size=300\nml.epoch.num=2\n" + text
    )
    return str(job)


def test_a_job_counted_in_samples_shows_each_update_at_the_samples_seen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(
        tmp_path,
        1000,
        "ml.opt.decay.unit=samples\nml.opt.decay.class.name=CosineAnnealingLR\n"
        "ml.learn.rate=0.1\nml.learn.rate.bias=0.3\nml.opt.decay.bias.class.name=StepLR\n"
        "ml.opt.decay.bias.step.size=1000\n",
    )
    assert main(["schedule", "--conf", job]) == 0
    out, err = capsys.readouterr()
    cos = decay.CosineAnnealingLR(0.1, t_max=2000)  # told 2 epochs x 1000 rows
    step = decay.StepLR(0.3, step_size=1000)
    seen = [0, 300, 600, 900, 1000, 1300, 1600, 1900]  # 4 updates of 300 per epoch
    assert out.splitlines() == [
        "samples,lr,lr/bias",
        *(f"{s},{cos.lr_at(s)!r},{step.lr_at(s)!r}" for s in seen),
    ]
    assert "in samples (ml.opt.decay.unit=samples): 1000 training rows" in err


def test_epochs_unit_json_and_linear_scaling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(
        tmp_path,
        600,
        "ml.opt.decay.unit=epochs\nml.opt.decay.class.name=LinearLR\n"
        "ml.opt.decay.total.iters=2\nml.opt.decay.start.factor=0.5\nml.learn.rate=0.1\n"
        "ml.learn.rate.scaling=linear\nml.learn.rate.reference.batch=150\n",
    )
    assert main(["schedule", "--conf", job, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unit"] == "epochs" and doc["at"] == [0.0, 0.5, 1.0, 1.5]
    lin = decay.LinearLR(0.1, start_factor=0.5, total_iters=2)
    assert doc["lr"] == [2 * lin.value_at(x)[0] for x in doc["at"]]  # global batch 300 / 150


def test_plot_of_a_job_in_samples_with_a_table_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(
        tmp_path,
        1000,
        "ml.opt.decay.unit=samples\nml.opt.decay.class.name=OneCycleLR\n"
        "ml.learn.rate.weight=0.01\n",
    )
    png = tmp_path / "p.png"
    assert main(["schedule", "--conf", job, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[0] == "samples,lr,lr/weight"
