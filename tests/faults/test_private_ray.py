"""A private local Ray, as a job starts and stops it (learners.job.cluster), in a fresh interpreter
(the suite's own Ray stays up): started without Ray's token-authentication warning on stderr,
stopped with every process it started ended."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import python_path
from tests.short_tmp import short_tmp

REPO = Path(__file__).resolve().parents[2]

_START = """
import ray
from learners.job import cluster
cluster.start_or_join(None, 5.0)
ray.shutdown()
print("started")
"""

# A private Ray, started and stopped by learners.job.cluster in a fresh interpreter (the suite's
# own Ray stays up): every process it started ends, the autoscaler monitor by SIGKILL before
# ray.shutdown (which would give it a whole second after SIGTERM).
_STOP_PRIVATE_RAY = """
import signal
import ray
from ray._private import worker
from learners.job import cluster
cluster.start_or_join(None, 10.0)
started = {t: [i.process for i in infos] for t, infos in worker._global_node.all_processes.items()}
shutdown = ray.shutdown
def recorded():
    print("monitor ended first:", all(p.poll() is not None for p in started["monitor"]))
    shutdown()
ray.shutdown = recorded
cluster.stop()
assert not ray.is_initialized()
alive = sorted(t for t, ps in started.items() for p in ps if p.poll() is None)
print("alive:", ",".join(alive) or "none")
print("monitor:", [p.returncode for p in started["monitor"]] == [-signal.SIGKILL])
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` with no RAY_* of this shell, Ray's files in a short temp dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=python_path(REPO), RAY_TMPDIR=short_tmp())
    try:
        return subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)


@pytest.mark.slow  # starts a Ray
def test_a_private_ray_starts_without_the_token_warning() -> None:
    run = _python(_START)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "started"
    assert "Token authentication" not in run.stderr, run.stderr


def test_stopping_a_private_ray_ends_its_processes_monitor_first() -> None:
    run = _python(_STOP_PRIVATE_RAY)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-3:] == [
        "monitor ended first: True",
        "alive: none",
        "monitor: True",
    ], run.stdout


# A private Ray whose task prints a line (relayed by Ray with its "(task pid=...)" prefix), then
# stopped: where its folder was and whether anything of it is left.
_SAY_AND_STOP = """
import os, time
import ray
from ray._private import worker
from learners.job import cluster
cluster.start_or_join(None, 10.0)
session = worker._global_node.get_session_dir_path()
print("mode:", oct(os.stat(os.path.dirname(session)).st_mode & 0o777))

@ray.remote
def say():
    import sys
    print("hello from a task", file=sys.stderr, flush=True)

ray.get(say.remote())
time.sleep(2.0)  # Ray's log monitor relays the line to this driver
cluster.stop()
print("session left:", os.path.exists(session), os.path.exists(os.path.dirname(session)))
print("under RAY_TMPDIR:", session.startswith(os.environ["RAY_TMPDIR"] + "/angelps-ray-"))
"""


def test_a_private_ray_leaves_no_session_folder_and_no_colour_codes_in_files() -> None:
    run = _python(_SAY_AND_STOP)  # stdout and stderr are pipes, not terminals
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-3:] == [
        "mode: 0o700",  # its own folder, not the world-writable /tmp/ray
        "session left: False False",
        "under RAY_TMPDIR: True",
    ], run.stdout
    line = [ln for ln in run.stderr.splitlines() if "hello from a task" in ln]
    assert len(line) == 1 and line[0].startswith("(say pid="), run.stderr
    assert "\x1b[" not in run.stderr


_UNHANDLED = """
import logging, sys
from learners.job import private_ray
private_ray.plain_prefixes()  # stderr here is a file
logging.getLogger("ray._private.worker").error(
    "Unhandled error: %s", "\\x1b[36mray::WorkerActor.call()\\x1b[39m (pid=1, ip=127.0.0.1)"
)
"""


def test_ray_s_own_log_lines_lose_their_colours_in_a_file(tmp_path: Path) -> None:
    """The "Unhandled error" line Ray's driver-side logger writes quotes a remote traceback,
    whose header Ray colours."""
    err = tmp_path / "err.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = python_path(REPO)
    with open(err, "wb") as f:
        run = subprocess.run(
            [sys.executable, "-c", _UNHANDLED], cwd=REPO, env=env, stderr=f, timeout=120
        )
    assert run.returncode == 0, err.read_text()
    text = err.read_text()
    assert "Unhandled error: ray::WorkerActor.call() (pid=1, ip=127.0.0.1)" in text, text
    assert "\x1b" not in text


def test_the_debug_traceback_of_a_worker_s_error_has_no_colour_codes(tmp_path: Path) -> None:
    """ANGELPS_DEBUG=1 with stderr into a file: the remote traceback's header (which Ray
    colours) and the quoted bad line are written plain, escaped where needed."""
    data = tmp_path / "bad.libsvm"
    data.write_bytes(b"1 3:1 11:1\n-1 5:1 7:1\n" * 20 + b"1 3:1 \x1b[31mred\n")
    sets = {
        "angel.train.data.path": data,
        "angel.save.model": "false",
        "angel.log.path": tmp_path / "log",
        "ml.epoch.num": 1,
    }
    cmd = [sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=python_path(REPO), ANGELPS_DEBUG="1", RAY_TMPDIR=short_tmp())
    err = tmp_path / "err.log"
    with open(err, "wb") as f:
        run = subprocess.run(
            [*cmd, *(f"--set={k}={v}" for k, v in sets.items())],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=f,
            timeout=240,
        )
    shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    text = err.read_text()
    assert run.returncode == 2, text
    assert "Traceback (most recent call last)" in text
    assert "ray::WorkerActor.call() (pid=" in text, text  # was \x1b[36mray::...\x1b[39m
    assert "got '1 3:1 \\x1b[31mred'" in text
    assert "\x1b" not in text
