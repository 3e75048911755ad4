"""Fault matrix: the driver SIGKILLed while a checkpoint is being written, then ``--resume``.

``angelps train`` runs LogisticRegression on a slice of a9a (BSP, ``ml.seed`` 0, a checkpoint
after every epoch) as a subprocess in its own session, so that its private Ray is in its process
group. A small wrapper (test code only: nothing in angelps waits for a test) runs the same
command line but parks the driver at one point of the second epoch's save and says so in a
marker file (the save is written in the background, so it parks the driver's commit thread,
while the third epoch may train); the test then SIGKILLs the whole process group:

- ``write`` (default): the shards have written their table files into ``<path>.tmp-<id>``, the
  manifest is not written yet;
- ``commit`` (slow): the temporary is complete (manifest included) but not renamed into place;
- ``rename`` (slow): in the middle of the commit, ``<path>`` already renamed to ``<path>.prev``,
  the temporary not yet renamed to ``<path>``.

Then: every process of the killed job (its private Ray's included) is gone; the last committed
checkpoint (epoch 1) verifies; ``angelps train --resume`` finishes the job, removes the killed
save's temporary, and ends with exactly the uninterrupted run's per-epoch metrics and model
(every table file and the dense layers, by SHA-256): this fault is bit-exact. Only the killed
launch's shard backups are left, under ``<angel.log.path>/ps-backup``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from angelps.checkpoint import files as checkpoint
from learners.cli.main import main
from learners.runs.folders import latest_run
from tests.faults.procs import alive, descendants, identity
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")
EPOCHS = 3
# The fields of an epoch's record that a run must reproduce (not its timings).
SAME = ("epoch", "step", "lr", "train_loss", "skipped_updates", "valid_auc", "valid_logloss")
SAME += ("valid_accuracy", "valid_loss", "valid_rows")

pytestmark = pytest.mark.usefixtures("ray_local")

# `angelps train` with the driver parked at POINT of save number NTH (from 1): it writes its pid
# to MARKER and sleeps until it is killed. argv: POINT NTH MARKER train-arguments...
_PARKED = r"""
import os, sys, time
from angelps.checkpoint import files as checkpoint
from learners.cli.main import main

point, nth, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
saves = []

def park(where):
    if where == point and len(saves) == nth:
        with open(marker + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.rename(marker + ".part", marker)
        time.sleep(3600)

def write_manifest(root, manifest, real=checkpoint.write_manifest):
    if ".tmp-" in os.path.basename(root):  # a save's temporary (not a shard's backup)
        saves.append(root)
        park("write")
    return real(root, manifest)

def commit_dir(tmp, path, real=checkpoint.commit_dir):
    park("commit")
    return real(tmp, path)

def rename(src, dst, real=os.rename):
    real(src, dst)
    if dst.endswith(".prev"):
        park("rename")

checkpoint.write_manifest = write_manifest
checkpoint.commit_dir = commit_dir
os.rename = rename
sys.exit(main(sys.argv[4:]))
"""


def _data(d: Path) -> Path:
    data = d / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(3000)))
    return data


def _args(d: Path, data: Path) -> list[str]:
    sets = {
        "angel.train.data.path": data,
        "angel.save.model.path": d / "model",
        # the latest checkpoint alone (no <path>.best copy): its commit is what is tested
        "angel.save.model.keep.best": "false",
        "angel.log.path": d / "log",
        "angel.job.name": "killed",
        "ml.epoch.num": EPOCHS,
        "angel.staleness": 0,
        "ml.seed": 0,
    }
    return ["train", "--conf", CONF, *(f"--set={k}={v}" for k, v in sets.items())]


def _epochs(run: Path | None) -> list[dict[str, Any]]:
    assert run is not None
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in SAME} for r in rows if r["kind"] == "epoch"]


def _model(path: Path) -> tuple[int, dict[str, str]]:
    """(epoch saved after, 0-based; SHA-256 of every file): the checkpoint's model."""
    manifest = checkpoint.read_manifest(str(path))
    learner = manifest["extra"]["learner"]
    files = {f: e["sha256"] for f, e in manifest["files"].items()}
    return int(learner["epoch"]), {**files, "dense": learner["dense"]["sha256"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> Any:
    """(data file, the uninterrupted run's epoch records, its final model)."""
    d = tmp_path_factory.mktemp("ref")
    data = _data(d)
    assert main(_args(d, data)) == 0
    return data, _epochs(latest_run(d / "log")), _model(d / "model")


def _kill_while_parked(d: Path, data: Path, point: str) -> list[tuple[int, int]]:
    """Run the job parked at ``point`` of its second save, SIGKILL its process group there;
    returns the processes it had (all of them SIGKILLed or ended since)."""
    marker, ray_tmp = d / "parked", short_tmp()
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    with open(d / "out.txt", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PARKED, point, "2", str(marker), *_args(d, data)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: the job and its private Ray in one group
        )
    procs: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, (d / "out.txt").read_text()
            assert time.monotonic() < deadline, "the job did not reach its second save in 240 s"
            time.sleep(0.05)
        assert int(marker.read_text()) == proc.pid
        procs = [p for p in map(identity, [proc.pid, *descendants(proc.pid)]) if p]
        assert len(procs) > 3  # the driver, Ray's own processes, the worker and the shard
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        # Ray's processes belong to the group; any started outside it dies with its parent.
        assert alive(procs, wait_s=30) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid, _ in alive(procs):  # only this job's own processes, had any survived
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return procs


@pytest.mark.parametrize(
    "point",
    [
        "write",
        pytest.param("commit", marks=pytest.mark.slow),
        pytest.param("rename", marks=pytest.mark.slow),
    ],
)
def test_a_driver_killed_mid_save_resumes_as_if_uninterrupted(
    tmp_path: Path, reference: Any, capsys: pytest.CaptureFixture[str], point: str
) -> None:
    data, ref_epochs, ref_model = reference
    model, prev = tmp_path / "model", tmp_path / "model.prev"
    _kill_while_parked(tmp_path, data, point)

    # What the kill left: the killed save's temporary beside the last committed checkpoint
    # (epoch 1), which verifies; mid-commit, that checkpoint is at <path>.prev.
    tmps = sorted(p.name for p in tmp_path.glob("model.tmp-*"))
    assert len(tmps) == 1
    has_manifest = (tmp_path / tmps[0] / "manifest.json").exists()
    assert has_manifest == (point != "write")
    last = prev if point == "rename" else model
    # (and the killed job's lock on the save path, stale: the resume below takes it over)
    assert sorted(p.name for p in tmp_path.glob("model*")) == sorted(
        [last.name, "model.lock", *tmps]
    )
    checkpoint.verify(str(last))
    assert _model(last)[0] == 0
    killed_run = latest_run(tmp_path / "log")
    # The killed launch's shard backups stay behind (nothing ran to remove them), alone.
    backups = os.listdir(tmp_path / "log" / "ps-backup")
    assert len(backups) == 1 and backups[0].startswith("killed-")
    # The second epoch ended, its save did not; the third may have trained meanwhile (the
    # checkpoint is written in the background) and waited for it to save its own.
    assert _epochs(killed_run) in (ref_epochs[:2], ref_epochs[:3])

    assert main([*_args(tmp_path, data), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"angelps: note: removing the stale lock {tmp_path / 'model.lock'} of job 'killed'" in err
    )
    note = f"angelps: note: resuming from {prev} (the latest save did not complete)\n"
    assert (note in err) == (point == "rename")
    resumed = latest_run(tmp_path / "log")
    assert resumed != killed_run
    assert _epochs(resumed) == ref_epochs[1:]  # epochs 2 and 3, exactly as uninterrupted
    assert _model(model) == ref_model
    # The killed save's temporary is gone; the latest and the previous checkpoint remain.
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model", "model.prev"]
    assert _model(prev)[0] == 1
    # The resumed launch removed its own backups; the killed one's are still the only ones.
    assert os.listdir(tmp_path / "log" / "ps-backup") == backups
