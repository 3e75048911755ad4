"""Fault matrix: a checkpoint write that really fails (the shard's file system refuses it).

On a real local Ray, LogisticRegression trains on a slice of a9a with a checkpoint after every
epoch. Before the second checkpoint, the parameter shards' processes get a file-size limit of
one byte (``prlimit(RLIMIT_FSIZE)``, as a full disk answers: every write of a shard's table file
fails with EFBIG). With ``angel.save.failure=stop`` the job ends with one line naming the path,
the reason and the last good checkpoint, which is intact and resumable; with ``continue`` it
warns, trains on, and the next checkpoint (the limit lifted) is written.
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from angelps.checkpoint import files as checkpoint
from learners.cli.main import main
from learners.job import saved_model
from learners.job.learner import GraphLearner
from learners.runs.folders import latest_run
from learners.runs.retention import CheckpointWriteError
from tests.faults.procs import descendants

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")

pytestmark = pytest.mark.usefixtures("ray_local")


def _shard_pids() -> list[int]:
    pids = []
    for p in descendants(os.getpid()):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"ShardServer" in f.read():
                    pids.append(p)
        except OSError:
            continue
    assert pids, "no parameter shard process found below this test"
    return pids


@contextmanager
def _disk_full(pids: list[int]) -> Iterator[None]:
    """A one-byte file-size limit on ``pids``: their writes of files fail with EFBIG."""
    old = {p: resource.prlimit(p, resource.RLIMIT_FSIZE) for p in pids}
    for p in pids:
        resource.prlimit(p, resource.RLIMIT_FSIZE, (1, old[p][1]))
    try:
        yield
    finally:
        for p, limits in old.items():
            resource.prlimit(p, resource.RLIMIT_FSIZE, limits)


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(3000)))
    return data


def _sets(tmp_path: Path, **more: object) -> dict[str, object]:
    return {
        "angel.train.data.path": str(_data(tmp_path)),
        "angel.save.model.path": str(tmp_path / "model"),
        # the latest checkpoint alone (no <path>.best copy): its failures are what is tested
        "angel.save.model.keep.best": "false",
        "angel.log.path": str(tmp_path / "log"),
        "angel.job.name": "diskfull",
        "ml.epoch.num": 3,
        **more,
    }


def _fail_saves(monkeypatch: pytest.MonkeyPatch, failing: set[int]) -> list[int]:
    """Make the shards' disk full during the saves numbered in ``failing`` (0-based): until
    the save's files are written, in the background too."""
    real = saved_model.save
    calls: list[int] = []

    def save(path, ps, workers, section, held=(), background=False):
        calls.append(int(section["epoch"]))
        if len(calls) - 1 not in failing:
            return real(path, ps, workers, section, held, background)
        full = _disk_full(_shard_pids())
        full.__enter__()
        try:
            pending = real(path, ps, workers, section, held, background)
        except BaseException:
            full.__exit__(None, None, None)
            raise
        if pending is None:
            full.__exit__(None, None, None)
            return None
        return _FullUntilWritten(pending, full)

    monkeypatch.setattr(saved_model, "save", save)
    return calls


class _FullUntilWritten:
    """A checkpoint being written in the background, the disk full until its result."""

    def __init__(self, pending, full) -> None:
        self.pending, self.full = pending, full

    def result(self) -> None:
        try:
            self.pending.result()
        finally:
            self.full.__exit__(None, None, None)


def _epochs_trained(tmp_path: Path) -> int:
    """Epoch records in the latest run's metrics."""
    run = latest_run(tmp_path / "log")
    assert run is not None
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return sum(1 for line in lines if json.loads(line)["kind"] == "epoch")


def _epoch_of(path: Path) -> int:
    return int(checkpoint.read_manifest(str(path))["extra"]["learner"]["epoch"])


#: The checkpoint written in the background (the default: its failure is seen at the next
#: save or the job's end) or before training goes on.
HOW = pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])


@HOW
def test_stop_keeps_the_last_good_checkpoint_and_names_it(
    tmp_path, monkeypatch, capsys, background
):
    calls = _fail_saves(monkeypatch, failing={1})
    model = tmp_path / "model"
    sets = _sets(tmp_path, **{"angel.save.model.async": str(background).lower()})
    learner = GraphLearner.from_properties(CONF, sets, quiet=True)
    try:
        with pytest.raises(CheckpointWriteError) as e:
            learner.train()
    finally:
        learner.shutdown()
    message = str(e.value)
    # Stopped at the failed save (inline), or at the next one (in the background: the third
    # epoch trained meanwhile, its save refused): no third save either way.
    assert calls == [0, 1]
    assert _epochs_trained(tmp_path) == (3 if background else 2)
    assert message.startswith(
        f"the checkpoint of epoch 2 could not be written to {model}: OSError: "
    )
    assert "File too large" in message
    assert message.endswith(
        f"; the last good checkpoint is {model} (epoch 1); stopped (angel.save.failure=stop): "
        "make room or fix the path, then continue with --resume"
    )
    # The previous checkpoint is intact (every checksum verified) and nothing half-written is
    # left beside it.
    checkpoint.verify(str(model))
    assert _epoch_of(model) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model")) == ["model"]

    # The command line: one line, exit 1; then --resume finishes the job from that checkpoint.
    monkeypatch.undo()
    calls = _fail_saves(monkeypatch, failing={0})
    args = ["train", "--conf", CONF, *(f"--set={k}={v}" for k, v in sets.items())]
    assert main([*args, "--resume"]) == 1
    err = capsys.readouterr().err
    assert (
        f"angelps: failed: CheckpointWriteError: the checkpoint of epoch 2 could not be written "
        f"to {model}: OSError: "
    ) in err
    assert "Traceback" not in err
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0
    assert _epoch_of(model) == 2


@HOW
def test_continue_warns_and_trains_on(tmp_path, monkeypatch, capsys, background):
    calls = _fail_saves(monkeypatch, failing={1})
    model = tmp_path / "model"
    sets = _sets(
        tmp_path,
        **{"angel.save.failure": "continue", "angel.save.model.async": str(background).lower()},
    )
    learner = GraphLearner.from_properties(CONF, sets, quiet=True)
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    assert calls == [0, 1, 2] and result.summary["epochs"] == 3
    err = capsys.readouterr().err
    assert (
        f"angelps: warning: the checkpoint of epoch 2 could not be written to {model}: OSError: "
    ) in err
    assert (
        f"; the last good checkpoint is {model} (epoch 1); training goes on "
        "(angel.save.failure=continue)\n"
    ) in err
    # The next save (the disk has room again) is written; the summary counts the failure.
    assert _epoch_of(model) == 2 and _epoch_of(Path(f"{model}.prev")) == 0
    assert result.summary["checkpoint_failures"] == 1
    assert result.summary["checkpoint"] == str(model)
    summary = json.loads((Path(result.summary["run_dir"]) / "summary.json").read_text())
    assert summary["checkpoint_failures"] == 1
