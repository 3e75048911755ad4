"""Fault matrix: a real full disk (ENOSPC) under the checkpoints.

``angelps train`` (LogisticRegression on a slice of a9a, a checkpoint after every epoch) runs in
a private mount namespace (``unshare -Urm``) where ``angel.save.model.path`` lies on a tmpfs of
its own, sized so that one checkpoint fits and a second beside it does not: the first epoch's
save is written, the second epoch's runs out of room while its table files are written
(``[Errno 28] No space left on device``), in the shard's process or the driver's. The job, its
private Ray and everything it writes on that disk live inside the namespace; after each run the
namespace copies the disk's content out for the test to check (the tmpfs ends with the
namespace).

- ``angel.save.failure=stop``: exit 1, one line naming the path, the reason and the last good
  checkpoint (epoch 1), which verifies, with nothing half-written beside it; once the disk is
  larger (a remount), ``--resume`` finishes the job (slow: a second job).
- ``continue``: a warning for each failed save (epochs 2 and 3), the job finishes, the summary
  counts both failures, the first checkpoint is intact and alone on the disk.

Where user namespaces with a tmpfs mount are not permitted, the tests fail saying so (they are
marked ``namespaces``: ``-m "not namespaces"`` leaves them out there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from angelps.checkpoint import files as checkpoint
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")
EPOCHS = 3
# One checkpoint of this model takes 8 pages of a tmpfs (its table files 3, the dense layers 2,
# the manifest 3); 10 pages hold the first but not the table files of a second beside it.
SMALL, LARGE = "40k", "1m"
NO_SPACE = "OSError: [Errno 28] No space left on device"

# Runs inside the namespace. argv: MOUNT OUT PLAN, PLAN a JSON list of [tmpfs size, argv]: for
# each, (re)mount the tmpfs at MOUNT with that size, run argv (its output to OUT/<i>.out, .err,
# its exit code to OUT/<i>.rc), then copy the disk's content to OUT/disk-<i>.
_IN_NAMESPACE = r"""
import json, shutil, subprocess, sys
mount, out, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for i, (size, argv) in enumerate(plan):
    opts = ["-t", "tmpfs", "-o", f"size={size}", "tmpfs"] if i == 0 else ["-o", f"remount,size={size}"]
    subprocess.run(["mount", *opts, mount], check=True)
    with open(f"{out}/{i}.out", "w") as o, open(f"{out}/{i}.err", "w") as e:
        rc = subprocess.run(argv, stdout=o, stderr=e).returncode
    shutil.copytree(mount, f"{out}/disk-{i}", symlinks=True)
    with open(f"{out}/{i}.rc", "w") as f:
        f.write(str(rc))
"""


pytestmark = pytest.mark.namespaces


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory: pytest.TempPathFactory) -> None:
    """This user may create a mount namespace with a tmpfs (``unshare -Urm``); else the test
    fails naming what is missing (a machine without them deselects ``-m "not namespaces"``)."""
    d = tmp_path_factory.mktemp("probe")
    argv = ["unshare", "-Urm", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1"', "sh", str(d)]
    try:
        probe = subprocess.run(argv, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.fail('no unshare here: run with -m "not namespaces" to leave these tests out')
    assert probe.returncode == 0, (
        "a user and mount namespace with a tmpfs (unshare -Urm, mount -t tmpfs) is not "
        f'permitted here: {probe.stderr.strip()}; run with -m "not namespaces" to leave these '
        "tests out"
    )


def _data(d: Path) -> Path:
    data = d / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(3000)))
    return data


def _train(d: Path, *more: str, **sets: object) -> list[str]:
    base = {
        "angel.train.data.path": _data(d),
        "angel.save.model.path": d / "disk" / "model",
        # the latest checkpoint alone (no <path>.best copy): its failures are what is tested
        "angel.save.model.keep.best": "false",
        "angel.log.path": d / "log",
        "angel.job.name": "diskfull",
        "ml.epoch.num": EPOCHS,
        **sets,
    }
    args = [sys.executable, "-m", "angelps", "train", "--conf", CONF]
    return [*args, *(f"--set={k}={v}" for k, v in base.items()), *more]


def _run(d: Path, plan: list[tuple[str, list[str]]]) -> list[dict[str, Any]]:
    """Each run of ``plan`` in one namespace: its exit code, stderr and the disk after it."""
    (d / "disk").mkdir()
    out = d / "out"
    out.mkdir()
    ray_tmp = short_tmp()
    try:
        subprocess.run(
            [
                *("unshare", "-Urm", sys.executable, "-c", _IN_NAMESPACE),
                *(str(d / "disk"), str(out), json.dumps(plan)),
            ],
            cwd=ROOT,
            env={**os.environ, "RAY_TMPDIR": ray_tmp},
            check=True,
            timeout=600,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return [
        {
            "rc": int((out / f"{i}.rc").read_text()),
            "err": (out / f"{i}.err").read_text(),
            "disk": out / f"disk-{i}",
        }
        for i in range(len(plan))
    ]


def _epoch_of(path: Path) -> int:
    return int(checkpoint.read_manifest(str(path))["extra"]["learner"]["epoch"])


def _listing(disk: Path) -> list[str]:
    return sorted(p.name for p in disk.iterdir())


def _first_checkpoint_alone(disk: Path) -> None:
    """The first epoch's checkpoint is on the disk, intact, and nothing beside it."""
    assert _listing(disk) == ["model"]
    checkpoint.verify(str(disk / "model"))
    assert _epoch_of(disk / "model") == 0


@pytest.mark.usefixtures("namespaces")
@pytest.mark.parametrize(
    "resume", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["stop", "then-resume"]
)
def test_stop_on_a_full_disk_names_the_last_good_checkpoint(tmp_path: Path, resume: bool) -> None:
    model = tmp_path / "disk" / "model"
    plan = [(SMALL, _train(tmp_path))]
    if resume:  # a larger disk, then --resume
        plan.append((LARGE, _train(tmp_path, "--resume")))
    stopped, *resumed = _run(tmp_path, plan)
    assert stopped["rc"] == 1, stopped["err"]
    failed = [x for x in stopped["err"].splitlines() if x.startswith("angelps: failed:")]
    assert failed == [
        f"angelps: failed: CheckpointWriteError: the checkpoint of epoch 2 could not be written "
        f"to {model}: {NO_SPACE}; the last good checkpoint is {model} (epoch 1); stopped "
        "(angel.save.failure=stop): make room or fix the path, then continue with --resume"
    ], stopped["err"]
    assert "Traceback" not in stopped["err"]
    _first_checkpoint_alone(stopped["disk"])  # the failed save's temporary is removed
    for done in resumed:  # with room on the disk, --resume finishes the job from it
        assert done["rc"] == 0, done["err"]
        assert _listing(done["disk"]) == ["model", "model.prev"]
        assert _epoch_of(done["disk"] / "model") == EPOCHS - 1
        checkpoint.verify(str(done["disk"] / "model"))


@pytest.mark.usefixtures("namespaces")
def test_continue_on_a_full_disk_warns_and_counts_the_failures(tmp_path: Path) -> None:
    model = tmp_path / "disk" / "model"
    summary = tmp_path / "summary.json"
    job = _train(tmp_path, "--summary-json", str(summary), **{"angel.save.failure": "continue"})
    (done,) = _run(tmp_path, [(SMALL, job)])
    assert done["rc"] == 0, done["err"]
    warnings = [x for x in done["err"].splitlines() if x.startswith("angelps: warning:")]
    assert warnings == [
        f"angelps: warning: the checkpoint of epoch {n} could not be written to {model}: "
        f"{NO_SPACE}; the last good checkpoint is {model} (epoch 1); training goes on "
        "(angel.save.failure=continue)"
        for n in (2, 3)
    ], done["err"]
    assert "Traceback" not in done["err"]
    result = json.loads(summary.read_text())
    assert result["epochs"] == EPOCHS
    assert result["checkpoint_failures"] == 2
    assert result["checkpoint"] == str(model)
    _first_checkpoint_alone(done["disk"])
