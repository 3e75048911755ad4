"""Fault matrix: a checkpoint with one flipped byte is never used silently.

On a real local Ray: LogisticRegression trains two epochs on a slice of a9a, checkpointing after
each (so ``model`` holds epoch 1 and ``model.prev`` epoch 0). One byte of a table file of
``model`` is flipped. ``--resume`` says so on the console, moves the damaged checkpoint aside and
resumes from ``model.prev``, bit-identical to the first run's epoch 1 (the default case);
``predict`` and ``evaluate`` refuse it with exit 2 and one line naming the file, and a resume
with no sound previous checkpoint does too (slow).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from learners.cli.main import main
from learners.job.learner import GraphLearner
from learners.runs.folders import latest_run

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, ray_local):
    """(directory, data file, history) of a 2-epoch run with checkpoints model, model.prev."""
    d = tmp_path_factory.mktemp("trained")
    data = d / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(3000)))
    learner = GraphLearner.from_properties(CONF, _sets(d, data, 2), quiet=True)
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    return d, data, result.history


def _sets(d: Path, data: Path, epochs: int) -> dict[str, object]:
    return {
        "angel.train.data.path": str(data),
        "angel.save.model.path": str(d / "model"),
        "angel.log.path": str(d / "log"),
        "angel.job.name": "corrupt",
        "ml.epoch.num": epochs,
    }


def _copy(trained, tmp_path: Path) -> Path:
    src = trained[0]
    for name in ("model", "model.prev"):
        shutil.copytree(src / name, tmp_path / name)
    return tmp_path / "model"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _table_file(model: Path) -> Path:
    """The largest table file of the checkpoint."""
    files = json.loads((model / "manifest.json").read_text())["files"]
    return model / max(files, key=lambda f: files[f]["bytes"])


def _epoch(model: Path) -> int:
    return json.loads((model / "manifest.json").read_text())["extra"]["learner"]["epoch"]


def test_resume_falls_back_to_the_previous_checkpoint(trained, tmp_path, capsys):
    model = _copy(trained, tmp_path)
    assert (_epoch(model), _epoch(tmp_path / "model.prev")) == (1, 0)
    bad = _table_file(model)
    _flip(bad)
    args = ["train", "--conf", CONF, "--resume"]
    for k, v in _sets(tmp_path, trained[1], 2).items():
        args += ["--set", f"{k}={v}"]
    assert main(args) == 0
    err = capsys.readouterr().err
    aside = [p for p in os.listdir(tmp_path) if p.startswith("model.damaged-")]
    assert len(aside) == 1
    assert (
        f"angelps: warning: checkpoint file {bad} is damaged: its SHA-256 does not match the "
        f"manifest; resuming from the previous checkpoint {tmp_path / 'model.prev'} "
        f"(the damaged one is kept as {tmp_path / aside[0]})\n"
    ) in err
    # It re-ran epoch 1 from epoch 0's checkpoint, exactly as the first run did.
    run = latest_run(tmp_path / "log")  # the resumed run's own directory
    assert run is not None
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["kind"] == "epoch"]
    first = trained[2][1]
    assert row["epoch"] == 2  # the second epoch: metrics.jsonl counts from 1
    assert row["valid_auc"] == pytest.approx(first["valid_auc"], rel=1e-6)
    assert row["valid_logloss"] == pytest.approx(first["valid_logloss"], rel=1e-6)
    assert (_epoch(model), _epoch(tmp_path / "model.prev")) == (1, 0)


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["predict", "evaluate"])
def test_predict_and_evaluate_refuse_a_damaged_checkpoint(trained, tmp_path, capsys, verb):
    model = _copy(trained, tmp_path)
    bad = _table_file(model)
    _flip(bad)
    args = [verb, "--model", str(model), "--input", str(trained[1])]
    args += ["--out", str(tmp_path / "p.csv")] if verb == "predict" else []
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        f"angelps: error: checkpoint file {bad} is damaged: its SHA-256 does not match the "
        "manifest\n"
    )
    assert err.count("angelps:") == 1 and "Traceback" not in err
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.slow
def test_resume_without_a_sound_previous_checkpoint_is_refused(trained, tmp_path, capsys):
    model = _copy(trained, tmp_path)
    bad, prev_bad = _table_file(model), _table_file(tmp_path / "model.prev")
    _flip(bad)
    _flip(prev_bad)
    before = {p: p.read_bytes() for p in (bad, prev_bad)}
    args = ["train", "--conf", CONF, "--resume"]
    for k, v in _sets(tmp_path, trained[1], 2).items():
        args += ["--set", f"{k}={v}"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"angelps: error: checkpoint file {bad} is damaged: its SHA-256 does not match the "
        f"manifest; the previous checkpoint is damaged too: checkpoint file {prev_bad} is "
        "damaged: its SHA-256 does not match the manifest\n"
    )
    assert {p: p.read_bytes() for p in before} == before  # both kept as they were
    shutil.rmtree(tmp_path / "model.prev")
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"angelps: error: checkpoint file {bad} is damaged: its SHA-256 does not match the "
        "manifest\n"
    )
