"""No hangs: what used to wait forever (or for minutes) now fails at once with one clear line.

- a job asking for more than the Ray cluster has (CPUs, GPUs, shard memory): ConfigError before
  any actor starts, naming the keys (learners.job.cluster.shortfalls, then one real case);
- an unreachable --address: one line after angel.ray.connect.timeout.s, exit 2;
- a shard dead after its last allowed restart: reported at once, naming the shard and
  angel.ps.max-attempts (angelps.client.recovery), not after the 120 s request timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray

from angelconf.config import ConfigError
from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.server.launch import actor_name
from angelps.table import OptimizerSpec, TableSpec
from learners.job import cluster, private_ray
from learners.job.cluster import Ask, shortfalls

REPO = Path(__file__).resolve().parents[2]

WORKERS = {"CPU": "angel.worker.cpus", "GPU": "angel.worker.gpus"}
SHARDS = {"CPU": "angel.ps.cpus", "GPU": "angel.ps.gpus", "memory": "angel.ps.memory"}


def _asks(w: int, w_cpu: float, s: int, s_cpu: float = 0.0, **more: float) -> list[Ask]:
    return [
        Ask("worker", w, {"CPU": w_cpu, "GPU": more.get("w_gpu", 0.0)}, WORKERS),
        Ask(
            "shard",
            s,
            {"CPU": s_cpu, "GPU": more.get("s_gpu", 0.0), "memory": more.get("mem", 0.0)},
            SHARDS,
        ),
    ]


# --- the resource check as a plain function ---------------------------------------------------


def test_a_job_that_fits_has_no_shortfall() -> None:
    nodes = [{"CPU": 2.0, "memory": 4096.0}]
    assert shortfalls(_asks(2, 1.0, 3), nodes) == []  # shards reserving 0 CPUs still fit
    assert shortfalls(_asks(1, 1.0, 2, 0.5, mem=2048.0), nodes) == []


def test_more_workers_than_cpus_is_named_with_its_keys() -> None:
    assert shortfalls(_asks(4, 1.0, 1), [{"CPU": 2.0}]) == [
        "angel.worker.cpus=1 with 4 worker(s) needs 4 CPU(s) but the Ray cluster has 2"
    ]
    # Workers and shards share the CPUs; each part is named.
    assert shortfalls(_asks(2, 1.0, 2, 0.5), [{"CPU": 2.0}, {"CPU": 0.5}]) == [
        "angel.worker.cpus=1 with 2 worker(s) and angel.ps.cpus=0.5 with 2 shard(s) needs "
        "3 CPU(s) but the Ray cluster has 2.5"
    ]


def test_gpus_and_shard_memory_the_cluster_lacks() -> None:
    nodes = [{"CPU": 8.0, "memory": 1024.0}]
    assert shortfalls(_asks(2, 1.0, 2, w_gpu=0.5, mem=600.0), nodes) == [
        "angel.worker.gpus=0.5 with 2 worker(s) needs 1 GPU(s) but the Ray cluster has 0",
        "angel.ps.memory=600 with 2 shard(s) needs 1200 MiB of memory but the Ray cluster has 1024",
    ]


def test_an_actor_larger_than_every_node_is_named() -> None:
    # 4 CPUs in total, but no node can hold one worker of 3.
    assert shortfalls(_asks(1, 3.0, 1), [{"CPU": 2.0}, {"CPU": 2.0}]) == [
        "angel.worker.cpus=3: no node of the Ray cluster has 3 CPU(s) for one worker "
        "(the largest has 2)"
    ]


# --- which Ray: a private local one unless an address is given -------------------------------


def test_which_ray_a_job_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster.job_address(None) == (None, "")
    assert cluster.job_address("local") == (None, "")
    assert cluster.job_address("auto") == ("auto", "--address")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster.job_address(None) == ("10.0.0.1:6379", "RAY_ADDRESS")
    assert cluster.job_address("10.0.0.2:6379") == ("10.0.0.2:6379", "--address")


def test_start_or_join_forces_a_new_local_ray_and_joins_without_resources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster.start_or_join(None, 1.0)
    # address="local": a new instance even when `ray start --head` runs on the machine (a
    # plain ray.init() would join it and refuse num_cpus).
    assert calls[-1]["address"] == "local"
    assert calls[-1]["num_cpus"] == (os.cpu_count() or 1)
    # On 127.0.0.1 only (Ray's switch for machines without clusters), undone by its stop.
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    private_ray.loopback_only(False)
    private_ray.remove_tmp()
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    monkeypatch.setattr(cluster, "_speaks_grpc", lambda *a: None)  # as a real Ray port does
    with socket.socket() as srv:  # something that accepts connections, as a head would
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        address = f"127.0.0.1:{srv.getsockname()[1]}"
        cluster.start_or_join(address, 1.0)
    assert calls[-1] == {"address": address, "namespace": "angelps", "log_to_driver": True}


def test_a_cluster_that_refuses_the_job_names_ray_s_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What Ray raises, after ~25 s of GCS warnings, when a cluster started with token
    # authentication is joined from a shell without RAY_AUTH_MODE=token.
    def refused(**kw: object) -> None:
        raise ConnectionError(f"Failed to connect to Ray cluster at {kw['address']}")

    monkeypatch.setattr(cluster.ray, "init", refused)
    monkeypatch.setattr(cluster, "_speaks_grpc", lambda *a: None)  # as a real Ray port does
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        address = f"127.0.0.1:{srv.getsockname()[1]}"
        with pytest.raises(ConfigError) as e:
            cluster.start_or_join(address, 1.0)
    assert str(e.value) == (
        f"--address {address}: Ray refused the connection (Failed to connect to Ray cluster "
        f"at {address}); a cluster started with token authentication needs "
        "RAY_AUTH_MODE=token (now unset) and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
        "~/.ray/auth_token) in this shell"
    )


class _Gcs:
    """A gRPC server with Ray's GCS node service, its CheckAlive answering as ``refuse`` says:
    a cluster started with token authentication, met by a shell without the token."""

    def __init__(self, refuse: bool) -> None:
        from concurrent import futures

        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        class Node(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):  # type: ignore[misc]
            def CheckAlive(self, request: object, context: grpc.ServicerContext) -> object:
                if refuse:
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken")
                return gcs_service_pb2.CheckAliveReply()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(Node(), self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None)


@pytest.mark.parametrize("mode", [None, "token"])
def test_a_cluster_that_refuses_the_shell_s_token_is_said_at_the_probe(
    monkeypatch: pytest.MonkeyPatch, mode: str | None
) -> None:
    # ray.init would print Ray's warning every second for ~20 s before failing: the probe asks
    # the GCS once, as ray.init would (with this shell's token where RAY_AUTH_MODE=token).
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
        monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-cluster-s")
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: pytest.fail("ray.init called"))
    gcs = _Gcs(refuse=True)
    try:
        t0 = time.monotonic()
        with pytest.raises(ConfigError) as e:
            cluster.start_or_join(gcs.address, 10.0)
        assert time.monotonic() - t0 < 9  # (the probe's own deadline is not what ended it)
    finally:
        gcs.stop()
    if mode is None:
        assert str(e.value) == (
            f"--address {gcs.address}: the cluster requires a Ray token (token authentication); "
            "a cluster started with token authentication needs RAY_AUTH_MODE=token (now unset) "
            "and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) in this shell"
        )
    else:
        assert str(e.value) == (
            f"--address {gcs.address}: the cluster refused this shell's Ray token; this shell's "
            "Ray token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, the first set) "
            "is not the one the cluster was started with"
        )


def test_a_cluster_that_answers_the_probe_is_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    gcs = _Gcs(refuse=False)
    try:
        cluster.start_or_join(gcs.address, 10.0)
    finally:
        gcs.stop()
    assert calls == [{"address": gcs.address, "namespace": "angelps", "log_to_driver": True}]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_address_is_one_error_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = _closed_port()
    with pytest.raises(ConfigError) as e:
        cluster.probe(f"127.0.0.1:{port}", 0.3, f"--address 127.0.0.1:{port}")
    assert str(e.value) == (
        f"--address 127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port} within "
        f"angel.ray.connect.timeout.s=0.3 s (Connection refused); check the address and that "
        f"the cluster runs, or leave out --address and RAY_ADDRESS for a private local Ray"
    )
    with pytest.raises(ConfigError, match=r"^--address nowhere: not a Ray address; valid: auto"):
        cluster.probe("nowhere", 0.3, "--address nowhere")
    # From the environment, as ray job submit sets it: named as such; Ray is never asked.
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: pytest.fail("ray.init called"))
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(
        ConfigError, match=rf"^RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster answers"
    ):
        cluster.start_or_join(None, 0.3)


def test_train_with_an_unreachable_address_exits_2_with_one_line() -> None:
    port = _closed_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    run = subprocess.run(
        [
            *(sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties"),
            *("--address", f"127.0.0.1:{port}", "--set", "angel.ray.connect.timeout.s=1"),
            *("--set", "angel.save.model.path="),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    # (the notes on relative path keys under --address come first: learners/job/paths.py)
    lines = [
        ln for ln in run.stderr.splitlines() if ln.strip() and not ln.startswith("angelps: note:")
    ]
    assert len(lines) == 1, run.stderr
    assert f"--address 127.0.0.1:{port}: no Ray cluster answers" in lines[0]
    assert "angel.ray.connect.timeout.s=1 s" in lines[0]


def test_a_port_that_accepts_and_holds_is_one_error_after_the_timeout() -> None:
    """A TCP listener that accepts every connection and never answers (not Ray): Ray's own
    join waited forever on it; now one line after angel.ray.connect.timeout.s, exit 2."""
    held: list[socket.socket] = []
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)
        port = srv.getsockname()[1]

        def accept() -> None:
            while True:
                try:
                    held.append(srv.accept()[0])
                except OSError:
                    return

        threading.Thread(target=accept, daemon=True).start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        run = subprocess.run(
            [
                *(sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties"),
                *("--address", f"127.0.0.1:{port}", "--set", "angel.ray.connect.timeout.s=1"),
                *("--set", "angel.save.model.path="),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    for c in held:
        c.close()
    assert held  # it did connect: the port accepted
    assert run.returncode == 2, run.stderr
    errors = "".join(
        ln for ln in run.stderr.splitlines(True) if not ln.startswith("angelps: note:")
    )
    assert errors == (
        f"angelps: error: --address 127.0.0.1:{port}: 127.0.0.1:{port} accepts connections but "
        "does not answer as Ray (no gRPC handshake) within angel.ray.connect.timeout.s=1 s; "
        "check the address (the head's GCS port, 6379 unless ray start --port says otherwise, "
        "or ray://host:10001) and that the cluster runs, or leave out --address and "
        "RAY_ADDRESS for a private local Ray\n"
    )


# --- on a real local Ray -----------------------------------------------------------------------


def test_a_job_larger_than_the_cluster_fails_before_any_actor_starts(ray_local: None) -> None:
    from learners.job.learner import GraphLearner

    learner = GraphLearner.from_properties(
        REPO / "conf" / "lr_a9a.properties",
        [
            "angel.workergroup.number=4",
            f"angel.train.data.path={REPO}/data/a9a/a9a_123d_train.libsvm",
            "angel.save.model.path=",
        ],
        quiet=True,
    )
    try:
        with pytest.raises(ConfigError) as e:
            learner.train()
    finally:
        learner.shutdown()
    assert str(e.value) == (
        "the Ray cluster cannot hold this job (its actors would wait forever): "
        "angel.worker.cpus=1 with 4 worker(s) needs 4 CPU(s) but the Ray cluster has 2; lower "
        "angel.workergroup.number, angel.ps.number or what each asks for, or join a larger "
        "cluster with --address (docs/cluster.md)"
    )
    assert learner.actors.workers is None and learner.actors.ps is None  # nothing was launched


X = TableSpec("x", rows=8, cols=1, init="zeros", optimizer=OptimizerSpec("sgd"))


def _kill(job: str, client: PSClient, shard: int) -> None:
    """Kill a shard's process as Ray would lose it (Ray may restart it) and wait until gone."""
    pid = client.stats()[shard]["pid"]
    ray.kill(ray.get_actor(actor_name(job, shard), namespace="angelps"), no_restart=False)
    for _ in range(400):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def test_a_shard_dead_after_its_last_restart_is_reported_at_once(
    ray_local: None, tmp_path: Path
) -> None:
    job = "dead-for-good"
    c = PSClient.launch(
        [X],
        PSOptions.from_config(
            {
                "angel.job.name": job,
                "angel.ps.number": 1,
                "angel.ps.backup.interval": 1,
                "angel.ps.backup.path": str(tmp_path),
                "angel.ps.max-attempts": 2,  # one restart allowed
            }
        ),
    )
    keys = np.arange(8)
    try:
        c.push("x", keys, -np.ones((8, 1)), 1.0)
        _kill(job, c, 0)  # the one restart: recovered
        np.testing.assert_array_equal(c.pull("x", keys)[:, 0], np.ones(8))
        assert [s["restarted"] for s in c.stats()] == [True]
        _kill(job, c, 0)  # no restart left
        with pytest.raises(RuntimeError) as e:
            c.pull("x", keys)
    finally:
        c.shutdown()
    msg = str(e.value)
    assert msg.startswith(
        "parameter shard 0 died and Ray will not restart it again: the starts "
        "angel.ps.max-attempts allows are used up (or its restart failed); Ray says: "
        "The actor is dead because"
    ), msg
    assert msg.endswith("; raise angel.ps.max-attempts to survive more failures"), msg
    assert "\n" not in msg


# --- a job beside a `ray start --head` on the same machine -------------------------------------


def _head_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # RAY_TMPDIR: Ray's default temp dir becomes <state>/ray, where the head writes
    # ray_current_cluster: a plain ray.init() there finds the head, as it finds a head
    # started with `ray start --head` under /tmp/ray.
    env.update(ANGELPS_RAY_DIR=str(state), ANGELPS_VENV=str(Path(sys.executable).parent.parent))
    env["RAY_TMPDIR"] = str(state)
    return env


@pytest.mark.slow  # ~60 s on 2 cores: a head, then a 1-epoch job beside it
def test_a_job_without_address_trains_on_its_own_ray_beside_a_running_head(
    tmp_path: Path,
) -> None:
    if shutil.which("setsid") is None:
        pytest.skip("setsid is not available")
    state = Path(tempfile.mkdtemp(prefix="angelps-h-"))  # short: Ray's Unix sockets live here
    env = _head_env(state)
    script = str(REPO / "scripts" / "ray-cluster")

    def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )

    try:
        started = run(
            [
                *(script, "start", "--num-cpus", "1", "--dashboard-port", str(_closed_port())),
                *("--", "--temp-dir", str(state / "ray")),
            ]
        )
        assert started.returncode == 0, started.stdout + started.stderr
        current = state / "ray" / "ray_current_cluster"
        for _ in range(600):  # written at the end of `ray start`
            if current.exists():
                break
            time.sleep(0.1)
        head_pid = int((state / "pid").read_text())
        # The job can see the head: with its token, a plain ray.init() joins it (the old
        # failure: "When connecting to an existing cluster, num_cpus ... must not be provided").
        env["RAY_AUTH_TOKEN_PATH"] = str(state / "auth_token")
        plain = run([sys.executable, "-c", "import ray; ray.init(num_cpus=1)"])
        assert "When connecting to an existing cluster" in plain.stderr, plain.stderr[-2000:]

        summary = tmp_path / "summary.json"
        job = run(
            [
                *(sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties"),
                *("--set", "ml.epoch.num=1", "--set", f"angel.log.path={tmp_path / 'log'}"),
                *("--summary-json", str(summary)),
            ]
        )
        assert job.returncode == 0, job.stderr[-3000:]
        assert json.loads(summary.read_text())["epochs"] == 1
        # The head is untouched: still running, and no driver but the one asking now ever
        # connected to it (the head's GCS lists every driver that did).
        os.kill(head_pid, 0)
        env["RAY_AUTH_MODE"] = "token"
        drivers = run([sys.executable, "-c", _COUNT_DRIVERS, (state / "gcs_address").read_text()])
        assert drivers.returncode == 0, drivers.stderr[-2000:]
        assert drivers.stdout.split()[-1] == "1", drivers.stdout
    finally:
        run([script, "stop"], timeout=120)
        shutil.rmtree(state, ignore_errors=True)


# The number of drivers that ever connected to the cluster at argv[1], this one included.
_COUNT_DRIVERS = """
import sys, ray
from ray._private import state
ray.init(address=sys.argv[1].strip(), log_to_driver=False)
print(sum(1 for j in state.jobs() if not j.get("IsSubmissionJob", False)))
"""
