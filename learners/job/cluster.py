"""Which Ray a job runs on, and whether that Ray can hold the job.

- No ``--address`` and no ``RAY_ADDRESS`` (or the address ``local``): the job starts its own
  private local Ray (``ray.init(address="local")``), whatever else runs on the machine. A plain
  ``ray.init()`` would join a cluster that ``ray start --head`` left on the machine, and then
  refuse the ``num_cpus`` a local start passes.
- ``--address`` (``auto``, ``host:port``, ``ray://host:port``) or ``RAY_ADDRESS`` (as Ray sets
  it inside ``ray job submit``): the job joins that cluster and asks it for no resources of its
  own. The address is first probed, for at most ``angel.ray.connect.timeout.s`` in all, with
  TCP connections, a gRPC handshake and one call to the GCS: an unreachable address, a port
  that accepts connections but is not Ray, or a cluster that refuses this shell's Ray token
  (or its lack of one), is one clear error, not minutes (or forever) of Ray's connection
  warnings.

Then, before any actor starts, :func:`check_fits` compares what the workers and shards ask for
(CPUs, GPUs, shard memory) with what the cluster's live nodes have: an actor that no node can
hold would wait forever, silently. :func:`shortfalls` is that comparison as a plain function.

Invariant: nothing is launched on a cluster that cannot hold every actor of the job at once;
each shortfall is named by the keys that ask for it.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import ray
from ray._private import ray_constants
from ray._private import services as ray_services
from ray._private import utils as ray_private_utils
from ray._private import worker as ray_worker

from angelconf.config import ConfigError
from angelps import PSOptions
from learners.job import private_ray
from learners.job.loop_options import PS_RESOURCES, WORKER_RESOURCES, TrainPlan
from learners.job.placement import Placement
from learners.job.terminate import stops_held, unwinding

__all__ = [
    "Ask",
    "bundles",
    "check_fits",
    "job_address",
    "job_asks",
    "probe",
    "shortfalls",
    "start_label",
    "start_or_join",
    "stop",
]

NAMESPACE = "angelps"
#: The key that bounds the wait for a cluster's address (its Key is in learners.job.loop_options).
CONNECT_TIMEOUT_KEY = "angel.ray.connect.timeout.s"
#: How a resource is counted in messages (anything else: a custom resource).
_UNITS = {"CPU": "CPU(s)", "GPU": "GPU(s)", "memory": "MiB of memory"}


def job_address(cli_address: str | None) -> tuple[str | None, str]:
    """The cluster a job joins (None: a private local Ray) and where that came from."""
    address: str | None = cli_address
    source = "--address"
    if not address:
        address, source = os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"
    if address is None or address == "local":
        return None, ""
    return address, source


def start_label(cli_address: str | None) -> str:
    """The start-up line of :func:`start_or_join` (learners.job.startup)."""
    address, source = job_address(cli_address)
    if address is None:
        return "starting a private local Ray"
    return f"joining the Ray cluster at {address} ({source})"


def start_or_join(cli_address: str | None, timeout_s: float) -> None:
    """Start a private local Ray, or join the cluster of ``--address`` / ``RAY_ADDRESS``.

    On the command line a SIGTERM or Ctrl-C during the start stops the job cleanly (exit 143
    or 130, nothing left running): Ray's own SIGTERM handlers (``sys.exit`` at once, which
    left the agents of a half-started Ray running) are kept out, and a private Ray's start is
    finished first (learners.job.terminate.stops_held); a join is cut short at once (it starts
    nothing)."""
    with _keep_our_sigterm():
        if job_address(cli_address)[0] is None:
            with stops_held():
                _start_or_join(cli_address, timeout_s)
        else:
            _start_or_join(cli_address, timeout_s)


@contextmanager
def _keep_our_sigterm() -> Iterator[None]:
    """While the command line handles SIGTERM, ``ray.init`` may not replace its handler."""
    if not unwinding():
        yield
        return
    utils = ray_private_utils
    set_handler = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None  # Ray's own hook for it, not public
    try:
        yield
    finally:
        utils.set_sigterm_handler = set_handler


def _start_or_join(cli_address: str | None, timeout_s: float) -> None:
    address, source = job_address(cli_address)
    if address is None:
        # Ray warns, at every start, that a new local instance enables token authentication:
        # that is how a private Ray should be, and nothing the user must act on.
        auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = auth_log.level
        auth_log.setLevel(logging.ERROR)
        private_ray.plain_prefixes()
        # Its own 0700 folder (not the world-writable /tmp/ray), removed by stop().
        tmp = private_ray.new_tmp()
        private_ray.loopback_only(True)
        try:
            ray.init(
                address="local",  # a new instance even when another Ray runs on this machine
                num_cpus=os.cpu_count() or 1,
                include_dashboard=False,
                namespace=NAMESPACE,
                log_to_driver=True,
                configure_logging=False,
                _temp_dir=tmp,
            )
            # Ray makes its temp dir world-writable (for a Ray shared by several users); this
            # one serves this job's processes, all of this user.
            os.chmod(tmp, 0o700)
        except BaseException:
            private_ray.loopback_only(False)
            private_ray.remove_tmp()
            raise
        finally:
            auth_log.setLevel(level)
        return
    private_ray.plain_prefixes()
    what = f"--address {address}" if source == "--address" else f"RAY_ADDRESS={address}"
    probe(_resolve(address, what), timeout_s, what)
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True)
    except ConnectionError as e:
        # The port answered (probe), so the likely cause is Ray's token authentication: Ray
        # 2.60 sends the token only under RAY_AUTH_MODE=token, even with one at hand, and a
        # cluster started with tokens then refuses the job after ~25 s of GCS warnings.
        raise ConfigError(_token_text(what, f"Ray refused the connection ({e})")) from None


def _token_text(what: str, refused: str) -> str:
    """The error of a cluster that refuses this shell's Ray token (or its lack of one)."""
    mode = os.environ.get("RAY_AUTH_MODE") or "unset"
    if mode == "token":
        return (
            f"{what}: {refused}; this shell's Ray token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
            "~/.ray/auth_token, the first set) is not the one the cluster was started with"
        )
    return (
        f"{what}: {refused}; a cluster started with token authentication needs "
        f"RAY_AUTH_MODE=token (now {mode}) and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
        "~/.ray/auth_token) in this shell"
    )


def stop(at_once: bool = False) -> None:
    """``ray.shutdown``: disconnect, and end the processes of a private Ray this job started.

    ``at_once`` (a SIGTERM stops the job): every process of a private Ray is SIGKILLed and its
    folder removed, without Ray's shutdown (:data:`learners.job.private_ray.abandoned`).

    Ray gives each of its processes up to 1 s to end on SIGTERM, and its autoscaler monitor
    takes all of it (shutdown 1.4 s instead of 0.4 s on 2 cores, bench/startup.py). A private
    one-node Ray has nothing for it to do, so the monitor is killed first. Only processes this
    driver started are listed there: a joined cluster's are not touched.
    """
    try:  # Ray's own record of the processes it started (no public API for it)
        started = getattr(ray_worker._global_node, "all_processes", {})
        monitors = list(started.get(ray_constants.PROCESS_TYPE_MONITOR, []))
    except Exception:  # a Ray without that record: its plain shutdown does it all
        monitors = []
    if at_once and private_ray.tmp_dir is not None:
        # Ray's own shutdown would wait ~5 s for the raylet it just lost (the driver's core
        # worker); this process ends right after (learners.cli.main.end), so it is skipped.
        private_ray.kill()
        private_ray.abandoned = True
        private_ray.loopback_only(False)
        private_ray.remove_tmp()
        return
    for info in monitors:
        if info.process.poll() is None:
            info.process.kill()
            try:
                info.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass  # ray.shutdown waits for it once more
    ray.shutdown()
    private_ray.loopback_only(False)
    private_ray.remove_tmp()


def _resolve(address: str, what: str) -> str:
    """``auto``: the address of the cluster Ray would pick (the latest ``ray start``)."""
    if address != "auto":
        return address
    try:  # Ray's own lookup (no public API for it)
        return str(ray_services.canonicalize_bootstrap_address_or_die("auto"))
    except ConnectionError:
        raise ConfigError(
            f"{what}: no running Ray cluster found on this machine; start one "
            f"(ray start --head) or leave out --address and RAY_ADDRESS for a private local Ray"
        ) from None


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` of an address (``ray://`` allowed); None for a form Ray must judge."""
    rest = address.removeprefix("ray://")
    if "://" in rest:
        return None
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def probe(address: str, timeout_s: float, what: str) -> None:
    """Wait up to ``timeout_s`` until ``address`` accepts a TCP connection; else ConfigError."""
    hp = _host_port(address)
    if hp is None:
        raise ConfigError(
            f"{what}: not a Ray address; valid: auto, host:port or ray://host:port (or leave "
            f"out --address and RAY_ADDRESS for a private local Ray)"
        )
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(hp, timeout=max(0.05, min(left, 5.0))):
                pass
            _speaks_grpc(hp, deadline, timeout_s, what)
            return
        except OSError as e:
            reason = e.strerror or str(e) or type(e).__name__
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConfigError(
                f"{what}: no Ray cluster answers at {hp[0]}:{hp[1]} within "
                f"{CONNECT_TIMEOUT_KEY}={timeout_s:g} s ({reason}); check the address and that "
                f"the cluster runs, or leave out --address and RAY_ADDRESS for a private local Ray"
            )
        time.sleep(min(0.25, left))


def _speaks_grpc(hp: tuple[str, int], deadline: float, timeout_s: float, what: str) -> None:
    """ConfigError unless ``hp`` completes a gRPC (HTTP/2) handshake before ``deadline``: a
    port that accepts connections but is not Ray (or not yet) would hold ``ray.init`` forever.
    The channel is Ray's own (its TLS settings, RAY_USE_TLS, and its token where
    RAY_AUTH_MODE=token apply); a GCS that refuses the token is a ConfigError too."""
    from ray._private.grpc_utils import init_grpc_channel  # (no public API for it)

    host = f"[{hp[0]}]" if ":" in hp[0] else hp[0]
    channel = init_grpc_channel(f"{host}:{hp[1]}")
    ready = threading.Event()

    def watch(state: object) -> None:  # a grpc.ChannelConnectivity
        if getattr(state, "name", "") == "READY":
            ready.set()

    channel.subscribe(watch, try_to_connect=True)
    refused = False
    try:
        try:
            answered = ready.wait(max(0.05, deadline - time.monotonic()))
        finally:
            channel.unsubscribe(watch)
        if answered:
            refused = _refuses_token(channel, max(0.05, min(5.0, deadline - time.monotonic())))
    finally:
        channel.close()
    if not answered:
        raise ConfigError(
            f"{what}: {hp[0]}:{hp[1]} accepts connections but does not answer as Ray (no gRPC "
            f"handshake) within {CONNECT_TIMEOUT_KEY}={timeout_s:g} s; check the address (the "
            "head's GCS port, 6379 unless ray start --port says otherwise, or ray://host:10001) "
            "and that the cluster runs, or leave out --address and RAY_ADDRESS for a private "
            "local Ray"
        )
    if refused:
        # (said here at once: ray.init would print Ray's warning every second for ~20 s first)
        token = os.environ.get("RAY_AUTH_MODE") == "token"
        raise ConfigError(
            _token_text(
                what,
                "the cluster refused this shell's Ray token"
                if token
                else "the cluster requires a Ray token (token authentication)",
            )
        )


def _refuses_token(channel: object, timeout_s: float) -> bool:
    """Whether the GCS behind ``channel`` answers one call (``CheckAlive``, sent as ``ray.init``
    sends its calls: with this shell's token where RAY_AUTH_MODE=token) with UNAUTHENTICATED.
    Anything else (an answer, another error, a Ray Client port) leaves the verdict to Ray."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        request = gcs_service_pb2.CheckAliveRequest()  # type: ignore[attr-defined]
        stub.CheckAlive(request, timeout=timeout_s)
    except grpc.RpcError as e:
        return bool(e.code() == grpc.StatusCode.UNAUTHENTICATED)
    except Exception:  # (a Ray whose stubs differ: no verdict)
        return False
    return False


@dataclass(frozen=True)
class Ask:
    """``count`` actors of one kind (``what``: "worker", "shard"), each asking Ray for
    ``each`` (resource name → amount; memory in MiB); ``keys`` names the key of each amount."""

    what: str
    count: int
    each: Mapping[str, float]
    keys: Mapping[str, str]


def shortfalls(asks: Sequence[Ask], nodes: Sequence[Mapping[str, float]]) -> list[str]:
    """What the cluster (its live nodes' resources, memory in MiB) lacks to hold every actor
    of ``asks`` at once: one sentence per resource, naming the keys; [] when it fits."""
    out = []
    names = dict.fromkeys(r for a in asks for r, v in a.each.items() if v > 0)
    for r in names:
        unit = _UNITS.get(r, f"of resource {r!r}")
        parts = [a for a in asks if a.each.get(r, 0) > 0]
        total = sum(a.count * a.each[r] for a in parts)
        have = sum(float(n.get(r, 0)) for n in nodes)
        if total > have + 1e-9:
            asked = " and ".join(f"{_setting(a, r)} with {a.count} {a.what}(s)" for a in parts)
            out.append(f"{asked} needs {total:g} {unit} but the Ray cluster has {have:g}")
            continue
        largest = max((float(n.get(r, 0)) for n in nodes), default=0.0)
        for a in parts:
            if a.each[r] > largest + 1e-9:
                out.append(
                    f"{_setting(a, r)}: no node of the Ray cluster has {a.each[r]:g} "
                    f"{unit} for one {a.what} (the largest has {largest:g})"
                )
    return out


def _setting(a: Ask, resource: str) -> str:
    """The key and value that ask for ``resource``: ``angel.ps.cpus=2``, ``angel.ps.resources=ps:1``."""
    if resource in _UNITS:
        return f"{a.keys[resource]}={a.each[resource]:g}"
    return f"{a.keys[resource]}={resource}:{a.each[resource]:g}"


def bundles(asks: Sequence[Ask]) -> list[dict[str, float]]:
    """A placement group's bundles for ``asks``: one per actor, in order (memory in bytes; an
    actor that asks for nothing gets a token CPU share, as a bundle cannot be empty)."""
    out: list[dict[str, float]] = []
    for a in asks:
        b = {r: v * 2**20 if r == "memory" else v for r, v in a.each.items() if v > 0}
        out += [b or {"CPU": 0.01}] * a.count
    return out


def job_asks(plan: TrainPlan, ps: PSOptions, placement: Placement | None = None) -> list[Ask]:
    """What the job's workers and shards ask Ray for (as angelps.server.launch and the workers do),
    their custom resources (angel.worker.resources, angel.ps.resources) included."""
    place = placement or Placement()
    wres, pres = place.worker_resources, place.ps_resources
    return [
        Ask(
            "worker",
            plan.workers,
            {"CPU": plan.worker_cpus, "GPU": plan.worker_gpus, **wres},
            {"CPU": "angel.worker.cpus", "GPU": "angel.worker.gpus"}
            | dict.fromkeys(wres, WORKER_RESOURCES.name),
        ),
        Ask(
            "shard",
            ps.num_shards,
            {"CPU": ps.cpus, "GPU": ps.gpus, "memory": float(ps.memory_mib), **pres},
            {"CPU": "angel.ps.cpus", "GPU": "angel.ps.gpus", "memory": "angel.ps.memory"}
            | dict.fromkeys(pres, PS_RESOURCES.name),
        ),
    ]


def node_resources() -> list[dict[str, float]]:
    """Each live node's resources (memory in MiB, as angel.ps.memory counts it)."""
    out = []
    for n in ray.nodes():
        if n.get("Alive"):
            res = {k: float(v) for k, v in dict(n.get("Resources", {})).items()}
            if "memory" in res:
                res["memory"] /= 2**20
            out.append(res)
    return out


def check_fits(plan: TrainPlan, ps: PSOptions, placement: Placement | None = None) -> None:
    """ConfigError when the Ray cluster cannot hold the job's workers and shards at once
    (a custom resource that no node has included)."""
    missing = shortfalls(job_asks(plan, ps, placement), node_resources())
    if missing:
        custom = any(f"={r}:" in m for m in missing for r in _custom(placement))
        raise ConfigError(
            "the Ray cluster cannot hold this job (its actors would wait forever): "
            + "; ".join(missing)
            + (
                "; start nodes with the custom resources (ray start --resources) or change "
                "angel.ps.resources / angel.worker.resources"
                if custom
                else "; lower angel.workergroup.number, angel.ps.number or what each asks "
                "for, or join a larger cluster with --address"
            )
            + " (docs/cluster.md)"
        )


def _custom(placement: Placement | None) -> set[str]:
    """The custom resources a job's placement names."""
    if placement is None:
        return set()
    return set(placement.ps_resources) | set(placement.worker_resources)
