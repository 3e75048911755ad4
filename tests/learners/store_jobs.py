"""Shared by the object-storage job tests (S3, GCS): a small a9a sample, a logistic-regression
job file, and running ``angelps train`` / ``predict`` in-process on a local Ray started after
the store's environment is set (Ray's workers inherit it)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from learners.cli.main import main
from tests.short_tmp import short_tmp

__all__ = ["ROWS", "bad", "job", "local_ray", "metrics", "predict", "sample", "train"]

ROOT = Path(__file__).resolve().parents[2]
ROWS = 1200
LR = "com.tencent.angel.ml.classification.LogisticRegression"


def sample(tmp: Path) -> Path:
    """A directory ``tmp/a9a`` holding ``part-0.libsvm``: the first ``ROWS`` rows of a9a."""
    data = tmp / "a9a"
    data.mkdir()
    lines = (ROOT / "data/a9a/a9a_123d_train.libsvm").read_text().splitlines(keepends=True)
    (data / "part-0.libsvm").write_text("".join(lines[:ROWS]))
    return data


@contextmanager
def local_ray() -> Iterator[None]:
    """A local Ray (2 CPUs, no GPU, no dashboard) for the block; start it after setting the
    store's environment, so that its workers have it."""
    import ray

    tmp = short_tmp()
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, namespace="angelps", _temp_dir=tmp)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def job(tmp: Path, data: str, model: str, log: str, epochs: int = 2) -> Path:
    """A new job file in ``tmp``: LR on ``data`` (BSP, 2 workers, 2 shards, fixed seed)."""
    conf = tmp / f"job-{time.time_ns()}.properties"
    conf.write_text(
        f"ml.model.class.name = {LR}\nangel.train.data.path = {data}\n"
        "ml.data.type = libsvm\nml.feature.index.range = 123\nml.data.validate.ratio = 0.1\n"
        f"ml.epoch.num = {epochs}\nml.minibatch.size = 128\nml.inputlayer.optimizer = Adam\n"
        "ml.learn.rate = 0.05\nangel.workergroup.number = 2\nangel.ps.number = 2\n"
        f"angel.save.model.path = {model}\nangel.log.path = {log}\nangel.job.name = objstore\n"
    )
    return conf


def train(conf: Path, *more: str) -> dict:
    """``angelps train --conf conf ...`` (it must succeed); its summary."""
    out = conf.with_suffix(f".{time.time_ns()}.json")
    assert main(["train", "--conf", str(conf), "--summary-json", str(out), *more]) == 0
    return json.loads(out.read_text())


def metrics(summary: dict) -> list:
    """The numbers two runs of one job must share: losses and validation metrics per epoch."""
    keep = ("train_loss", "valid_auc", "valid_logloss")
    return [{k: row.get(k) for k in keep} for row in summary.get("history", [])] or [
        {k: v for k, v in summary.items() if k.startswith(("valid_", "best_value"))}
    ]


def predict(model: str, data: str, out: str) -> None:
    """``angelps predict`` (it must succeed)."""
    assert main(["predict", "--model", model, "--input", data, "--out", out]) == 0


def bad(conf: Path, capsys, key: str, value: str, log: Path) -> str:
    """The one error line of ``angelps train --conf conf --key value``: exit 2 in seconds, and
    nothing written at the job's local ``log`` path."""
    t = time.monotonic()
    code = main(["train", "--conf", str(conf), f"--{key}", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert time.monotonic() - t < 25
    assert len(err) == 1 and f"{key}={value}" in err[0], err
    assert not log.exists()
    return err[0]
