"""`ray job submit` end to end on loopback, through scripts/ray-cluster.

One head per module: started in its own process group with token authentication and the
dashboard on 127.0.0.1, ended (the group, nothing else) even when a test fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from learners.runs.folders import latest_run

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ray-cluster"
VENV_BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Head:
    def __init__(self, state: Path, env: dict[str, str], dashboard_port: int) -> None:
        self.state = state
        self.env = env
        self.dashboard_port = dashboard_port

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    if shutil.which("setsid") is None:
        pytest.skip("setsid is not available")
    # Short path: Ray puts Unix sockets under it (108-byte limit).
    state = Path(tempfile.mkdtemp(prefix="angelps-ray-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(ANGELPS_RAY_DIR=str(state), ANGELPS_VENV=str(VENV_BIN.parent))
    port = _free_port()
    h = Head(state, env, port)
    try:
        started = h.run(
            "start",
            "--num-cpus",
            "2",
            "--dashboard-port",
            str(port),
            "--",
            "--object-store-memory",
            str(300 * 1024 * 1024),
        )
        assert started.returncode == 0, started.stdout + started.stderr
        yield h
    finally:
        stopped = h.run("stop", timeout=60)
        pid_file = state / "pid"
        assert not pid_file.exists(), stopped.stdout + stopped.stderr
        shutil.rmtree(state, ignore_errors=True)


def test_head_requires_the_token_and_binds_the_dashboard_to_loopback(head: Head) -> None:
    env = {k: v for k, v in head.env.items() if not k.startswith("RAY_")}
    env["HOME"] = str(head.state)  # no ~/.ray/auth_token to fall back on
    anonymous = subprocess.run(
        [
            str(VENV_BIN / "ray"),
            "job",
            "list",
            "--address",
            f"http://127.0.0.1:{head.dashboard_port}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert anonymous.returncode != 0
    assert "Authentication required" in anonymous.stderr + anonymous.stdout

    log = (head.state / "head.log").read_text()
    node_ip = re.search(r"Local node IP\S*: \S*?(\d+\.\d+\.\d+\.\d+)", log)
    assert node_ip is not None, log
    if not node_ip.group(1).startswith("127."):
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect((node_ip.group(1), head.dashboard_port))


def test_a_second_head_on_the_same_port_is_refused(head: Head, tmp_path: Path) -> None:
    # (it came up "head up" with the first head's jobs API answering for it: every submit
    # then went to the other cluster)
    other = Head(tmp_path / "second", {**head.env, "ANGELPS_RAY_DIR": str(tmp_path / "second")}, 0)
    started = other.run("start", "--dashboard-port", str(head.dashboard_port), timeout=60)
    assert started.returncode == 2, started.stdout + started.stderr
    assert started.stderr.startswith(
        f"ray-cluster: port {head.dashboard_port} on 127.0.0.1 is in use (another head? "
    )
    assert not (tmp_path / "second" / "pid").exists()


def test_a_job_id_that_does_not_exist_is_one_line(head: Head) -> None:
    status = head.run("status", "nope", timeout=60)
    assert status.returncode != 0
    assert "Traceback" not in status.stderr, status.stderr
    lines = status.stderr.strip().splitlines()
    assert lines[-1].startswith("ray-cluster: status: ") and "nope" in lines[-1], status.stderr


def test_joining_without_the_token_is_one_line_at_once(head: Head, tmp_path: Path) -> None:
    # ray.init from a shell without the token prints Ray's GCS warning every second for ~20 s,
    # then fails; the address's probe asks the GCS once and says what is missing.
    env = {k: v for k, v in head.env.items() if not k.startswith("RAY_")}
    env["HOME"] = str(head.state)  # no ~/.ray/auth_token to fall back on
    address = (head.state / "gcs_address").read_text().strip()
    joined = subprocess.run(
        [
            *(str(VENV_BIN / "angelps"), "train", "--conf", "conf/lr_a9a.properties"),
            *("--address", address, "--set", f"angel.log.path={tmp_path / 'log'}"),
            *("--set", f"angel.save.model.path={tmp_path / 'model'}"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert joined.returncode == 2, joined.stdout + joined.stderr
    assert joined.stderr.strip().splitlines()[-1] == (
        f"angelps: error: --address {address}: the cluster requires a Ray token (token "
        "authentication); a cluster started with token authentication needs RAY_AUTH_MODE=token "
        "(now unset) and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) in "
        "this shell"
    )
    assert "Failed to get cluster ID" not in joined.stderr  # (Ray's warnings never started)
    assert not (tmp_path / "log").exists()


def test_submit_train_job_succeeds_and_writes_its_summary(head: Head) -> None:
    out = Path(tempfile.mkdtemp(prefix="angelps-job-"))
    try:
        summary = out / "summary.json"
        job_id = f"angelps_test_{os.getpid()}"
        # Outputs go to absolute paths: the job's working directory is Ray's unpacked copy.
        submitted = head.run(
            "submit",
            "--submission-id",
            job_id,
            "--",
            "python",
            "-m",
            "angelps",
            "train",
            "--conf",
            "conf/lr_a9a.properties",
            "--set",
            "ml.epoch.num=2",
            "--set",
            "ml.minibatch.size=1024",
            "--set",
            f"angel.log.path={out / 'log'}",
            "--summary-json",
            str(summary),
        )
        text = submitted.stdout + submitted.stderr
        assert submitted.returncode == 0, text
        assert f"Job '{job_id}' succeeded" in text

        status = head.run("status", job_id, timeout=60)
        assert f"Job '{job_id}' succeeded" in status.stdout + status.stderr

        logs = head.run("logs", job_id, timeout=60)
        assert logs.returncode == 0
        assert "auc" in logs.stdout.lower()

        result = json.loads(summary.read_text())
        assert result["epochs"] == 2
        assert result["valid_auc"] >= 0.88
        assert 0.0 < result["valid_logloss"] < 0.5
        assert result["train_samples_per_s"] > 0
        run = latest_run(out / "log")  # the run's own directory, where the job was told
        assert run is not None and Path(result["run_dir"]) == run
        metrics = (run / "metrics.jsonl").read_text().splitlines()
        epochs = [json.loads(line) for line in metrics if '"epoch"' in line]
        assert len([e for e in epochs if e.get("kind") == "epoch"]) == 2
    finally:
        shutil.rmtree(out, ignore_errors=True)


_PACKAGES = ("angelconf", "decay", "angelps", "learners")

# What the job lists: the Python files of the packages in its working directory, and where the
# package a nested folder named like an excluded one (learners/runs) is imported from.
_LIST_PACKAGE = """
import json, os, learners.runs
found = sorted(
    os.path.relpath(os.path.join(d, f))
    for p in %r
    for d, _, fs in os.walk(p)
    for f in fs
    if f.endswith(".py")
)
print("PACKAGE " + json.dumps({"files": found, "runs_from": learners.runs.__file__, "cwd": os.getcwd()}))
"""


def test_a_submitted_job_gets_every_file_of_the_packages(head: Head) -> None:
    """The script's excludes drop the repository's runs/ and bench/results only: Ray reads them
    as .gitignore patterns, where a bare "runs" also matched learners/runs (the job then failed
    at its import, or, where angelps is installed, silently imported the installed copy)."""
    job_id = f"angelps_files_{os.getpid()}"
    submitted = head.run(
        "submit", "--submission-id", job_id, "--", "python", "-c", _LIST_PACKAGE % (_PACKAGES,)
    )
    text = submitted.stdout + submitted.stderr
    assert submitted.returncode == 0, text
    line = next(x for x in text.splitlines() if x.startswith("PACKAGE "))
    got = json.loads(line[len("PACKAGE ") :])
    want = sorted(
        str(f.relative_to(REPO))
        for p in _PACKAGES
        for f in (REPO / p).rglob("*.py")
        if "__pycache__" not in f.parts
    )
    assert "learners/runs/__init__.py" in want
    assert sorted(set(want) - set(got["files"])) == []
    # The job imports the submitted copy, not an installed one.
    assert Path(got["runs_from"]).resolve().is_relative_to(Path(got["cwd"]).resolve())


def test_failing_job_is_reported_failed(head: Head) -> None:
    job_id = f"angelps_fail_{os.getpid()}"
    submitted = head.run(
        "submit",
        "--submission-id",
        job_id,
        "--",
        "python",
        "-c",
        "import sys; print('bad things'); sys.exit(3)",
    )
    assert submitted.returncode != 0
    status = head.run("status", job_id, timeout=60)
    assert f"Job '{job_id}' failed" in status.stdout + status.stderr
    assert "exit code 3" in status.stdout + status.stderr


@pytest.mark.slow
def test_ray_job_stop_interrupts_training_cleanly(head: Head) -> None:
    out = Path(tempfile.mkdtemp(prefix="angelps-job-"))
    try:
        job_id = f"angelps_stop_{os.getpid()}"
        submitted = head.run(
            "submit",
            "--no-wait",
            "--submission-id",
            job_id,
            "--",
            "python",
            "-m",
            "angelps",
            "train",
            "--conf",
            "conf/lr_a9a.properties",
            "--set",
            "ml.epoch.num=1000",
            "--set",
            f"angel.log.path={out / 'log'}",
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            run = latest_run(out / "log")
            metrics = run / "metrics.jsonl" if run is not None else out / "none"
            if metrics.exists() and '"kind": "epoch"' in metrics.read_text():
                break
            time.sleep(1)
        else:
            pytest.fail("no epoch finished within 180 s")
        stopped = head.run("stop-job", job_id, timeout=120)
        assert f"Job '{job_id}' was stopped" in stopped.stdout + stopped.stderr
        logs = head.run("logs", job_id, timeout=60).stdout
        # SIGINT reached the driver: the CLI's clean-stop path ran (not a SIGKILL).
        assert "angelps: interrupted; stopped cleanly" in logs
    finally:
        shutil.rmtree(out, ignore_errors=True)
