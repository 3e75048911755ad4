"""A job whose processes Ray kills because their node runs low on memory stops at once, with an
error that says so (learners/job/memory_kills.py), rather than restarting into the same limit
and ending on a lost connection.

Ray's memory monitor is made to act early: this job's private Ray kills its workers once the
node's memory passes what it uses now plus a few hundred MiB, which the job's own processes
(a shard, a worker, each importing torch) pass as they start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _threshold(margin_mib: int) -> float:
    """The share of the node's memory in use now plus ``margin_mib``, as Ray's memory monitor
    counts it (a container's own use where it is in one)."""
    try:
        from ray._private.utils import get_system_memory, get_used_memory

        used, total = get_used_memory(), get_system_memory()
    except ImportError:  # (Ray's internals moved: the node's own count, total less available)
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
        used, total = info["MemTotal"] - info["MemAvailable"], info["MemTotal"]
    return (used + margin_mib * 2**20) / total


def test_a_job_whose_processes_ray_kills_for_memory_stops_at_once_and_says_so(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "RAY_memory_usage_threshold": f"{_threshold(300):.4f}",
        "RAY_memory_monitor_refresh_ms": "100",
    }
    cmd = [sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties"]
    cmd += ["--set", "ml.epoch.num=3", "--set", f"angel.log.path={tmp_path / 'log'}"]
    cmd += ["--set", f"angel.save.model.path={tmp_path / 'model'}"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    err = out.stderr
    assert out.returncode == 1, err
    line = next(ln for ln in err.splitlines() if ln.startswith("angelps: failed: "))
    assert line.startswith("angelps: failed: NodeOutOfMemory: "), err
    assert "because the node ran low on memory (Memory on the node (IP: " in line, line
    assert "A restart would run the same steps into the same limit, so the job stops here" in line
    assert f"its last checkpoint, if it wrote one, is kept in {tmp_path / 'model'}" in line
    assert "angel.ps.number" in line and "RAY_memory_usage_threshold" in line
    assert "restarting the workers" not in err, err  # (not restarted into the same limit)


def test_after_a_python_train_stopped_for_memory_save_says_the_failure_stopped_the_workers(
    tmp_path: Path,
) -> None:
    """GraphLearner.train() raises NodeOutOfMemory; save() after it used to call the workers
    left alive and end on a raw Ray error about a dead actor (with Ray's colour codes)."""
    script = tmp_path / "job.py"
    script.write_text(
        "import sys\n"
        "from learners import GraphLearner\n"
        "from learners.job.memory_kills import NodeOutOfMemory\n"
        f"sets = {{'ml.epoch.num': 3, 'angel.log.path': {str(tmp_path / 'log')!r}, "
        f"'angel.save.model.path': {str(tmp_path / 'model')!r}}}\n"
        "with GraphLearner.from_properties('conf/lr_a9a.properties', sets, quiet=True) as l:\n"
        "    try:\n"
        "        l.train()\n"
        "    except NodeOutOfMemory:\n"
        "        print('train: NodeOutOfMemory', file=sys.stderr)\n"
        "    try:\n"
        f"        l.save({str(tmp_path / 'm')!r})\n"
        "    except RuntimeError as e:\n"
        "        print(f'save: {e}', file=sys.stderr)\n"
    )
    env = {
        **os.environ,
        "RAY_memory_usage_threshold": f"{_threshold(300):.4f}",
        "RAY_memory_monitor_refresh_ms": "100",
    }
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = out.stderr.splitlines()
    assert out.returncode == 0, out.stderr
    assert "train: NodeOutOfMemory" in lines, out.stderr
    assert (
        "save: save(): the last train() failed (NodeOutOfMemory); nothing to save: fix its "
        "cause and train again, or load a checkpoint"
    ) in lines, out.stderr
