"""Two Ray nodes on this machine: shards pinned to one, workers to the other.

A head started with the custom resource ``ps`` and a second raylet with ``worker`` (each one
CPU, on loopback, in a private short temporary directory, each under ``setsid`` so that the
test ends exactly the process groups it started). The job joins with ``--address``, names its
data and outputs by paths relative to the command's directory, and asks for
``angel.ps.resources=ps:1`` and ``angel.worker.resources=worker:1``: the shard can only run
on the head and the worker only on the second node. Under BSP with the same seed its results
equal those of the same job on a private single-node Ray.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from learners.runs.folders import latest_run
from tests.child_env import python_path

REPO = Path(__file__).resolve().parents[2]
A9A = REPO / "data" / "a9a" / "a9a_123d_train.libsvm"
RAY = str(Path(sys.executable).with_name("ray"))

JOB = """\
ml.model.class.name = LogisticRegression
angel.train.data.path = data/a9a.libsvm
ml.data.type = libsvm
ml.feature.index.range = 123
ml.data.validate.ratio = 0.1
ml.epoch.num = 1
ml.minibatch.size = 512
ml.inputlayer.optimizer = Adam
ml.learn.rate = 0.02
ml.seed = 7
angel.job.name = multinode
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ports() -> list[str]:
    """Ports of a node's agents: Ray's fixed defaults would clash with other Rays here."""
    return [
        "--dashboard-agent-listen-port", str(_free_port()),
        "--dashboard-agent-grpc-port", str(_free_port()),
        "--metrics-export-port", str(_free_port()),
        "--runtime-env-agent-port", str(_free_port()),
    ]  # fmt: skip


class TwoNodes:
    """The cluster: its address, the environment its clients need, the processes to end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        token = root / "token"
        token.write_text(os.urandom(16).hex())
        token.chmod(0o600)
        self.env = {
            **os.environ,
            "PYTHONPATH": python_path(REPO),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, args: list[str], log: str) -> None:
        with open(self.root / log, "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", *args],
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # setsid: its own process group, ended below
                )
            )

    def start(self) -> None:
        self._start(
            ["--head", "--port", str(self.port), "--num-cpus", "1", "--resources",
             '{"ps": 1}', "--include-dashboard", "false", "--ray-client-server-port",
             str(_free_port()), "--temp-dir", str(self.root / "r"), *_ports()],
            "head.log",
        )  # fmt: skip
        self._start(
            ["--address", self.address, "--num-cpus", "1", "--resources", '{"worker": 1}',
             *_ports()],
            "node.log",
        )  # fmt: skip
        self._wait_for_nodes(2)

    def _wait_for_nodes(self, n: int, timeout_s: float = 180.0) -> None:
        code = (
            "import sys, time, ray\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
            f"end = time.monotonic() + {timeout_s}\n"
            f"while sum(1 for x in ray.nodes() if x['Alive']) < {n}:\n"
            "    if time.monotonic() > end: sys.exit(1)\n"
            "    time.sleep(0.5)\n"
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Ray node exited: {self.logs()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                time.sleep(0.5)
        r = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"the two nodes did not come up: {r.stderr[-2000:]!r}")

    def logs(self) -> str:
        return "".join(
            (self.root / f).read_text(errors="replace")[-2000:] for f in ("head.log", "node.log")
        )

    def stop(self) -> None:
        """End the process groups this test started (and only those): SIGTERM, then what is
        left of each group after 5 s gets SIGKILL."""
        for p in self.procs:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.pid, signal.SIGKILL)  # Ray's processes left in the group
            p.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    # Short: Ray puts Unix sockets under it (at most 107 bytes a path).
    root = Path(tempfile.mkdtemp(prefix="apmn-", dir="/tmp"))
    cluster = TwoNodes(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _job_dir(base: Path) -> Path:
    """The command's directory: the job file and the data, named by relative paths."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "data").mkdir(exist_ok=True)
    if not (base / "data" / "a9a.libsvm").exists():
        os.symlink(A9A, base / "data" / "a9a.libsvm")
    (base / "job.properties").write_text(JOB)
    return base


def _train(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "angelps", "train", "--conf", "job.properties", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_a_resource_no_node_has_is_refused_at_once(two_nodes: TwoNodes, tmp_path: Path) -> None:
    cwd = _job_dir(tmp_path / "job")
    r = _train(cwd, two_nodes.env, "--address", two_nodes.address,
               "--set", "angel.worker.resources=worker:1", "--set", "angel.ps.resources=ssd:1")  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert (
        "angelps: error: the Ray cluster cannot hold this job (its actors would wait forever): "
        "angel.ps.resources=ssd:1 with 1 shard(s) needs 1 of resource 'ssd' but the Ray "
        "cluster has 0;"
    ) in r.stderr
    assert "Traceback" not in r.stderr
    assert not (cwd / "runs").exists()  # nothing written


@pytest.mark.slow
def test_shards_on_one_node_workers_on_the_other_equal_single_node(
    two_nodes: TwoNodes, tmp_path: Path
) -> None:
    cwd = _job_dir(tmp_path / "job")
    placed = [
        "--set", "angel.ps.resources=ps:1",
        "--set", "angel.worker.resources=worker:1",
        "--set", "angel.placement.strategy=spread",
        "--set", "angel.save.model.path=out/model",
        "--set", "angel.log.path=out/log",
        "--summary-json", "out/summary.json",
    ]  # fmt: skip
    r = _train(cwd, two_nodes.env, "--address", two_nodes.address, *placed)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"joining the Ray cluster at {two_nodes.address} (--address) ... " in r.stdout
    assert "loading data on 1 worker, launching 1 shard ... " in r.stdout
    assert "reserving a placement group (spread) ... " in r.stdout
    # the relative outputs landed in the command's directory, written by actors on both nodes
    assert (cwd / "out" / "model" / "manifest.json").exists()
    run = latest_run(cwd / "out" / "log")
    assert run is not None and (run / "metrics.jsonl").exists()
    cluster_run: dict[str, Any] = json.loads((cwd / "out" / "summary.json").read_text())

    env = {k: v for k, v in two_nodes.env.items() if not k.startswith("RAY_AUTH")}
    r = _train(cwd, env, "--set", "angel.log.path=single/log",
               "--summary-json", "single/summary.json")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "starting a private local Ray ... " in r.stdout
    single: dict[str, Any] = json.loads((cwd / "single" / "summary.json").read_text())
    for k in ("valid_auc", "valid_logloss", "valid_accuracy", "train_loss", "updates_per_epoch"):
        assert cluster_run[k] == single[k], k
    assert cluster_run["valid_auc"] > 0.85


@pytest.mark.slow
def test_an_actor_error_is_one_line(two_nodes: TwoNodes, tmp_path: Path) -> None:
    """The worker (on the second node) cannot find the validation file: one line naming the
    absolute path, exit 2; the traceback only with ANGELPS_DEBUG=1."""
    cwd = _job_dir(tmp_path / "job")
    args = ["--address", two_nodes.address, "--set", "angel.worker.resources=worker:1",
            "--set", "angel.validate.data.path=data/missing.libsvm"]  # fmt: skip
    r = _train(cwd, two_nodes.env, *args)
    assert r.returncode == 2, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("angelps:")]
    assert [line for line in said if not line.startswith("angelps: note:")] == [
        f"angelps: error: {cwd / 'data' / 'missing.libsvm'}: no such input file or directory"
    ]
    # (each relative data path is noted first: other nodes would not see it)
    notes = [line.split(" (")[0] for line in said if line.startswith("angelps: note:")]
    assert "angelps: note: angel.train.data.path=data/a9a.libsvm" in notes
    assert "angelps: note: angel.validate.data.path=data/missing.libsvm" in notes
    assert "Traceback" not in r.stderr
    r = _train(cwd, {**two_nodes.env, "ANGELPS_DEBUG": "1"}, *args)
    assert r.returncode == 2
    assert "Traceback" in r.stderr
