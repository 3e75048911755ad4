"""Which Ray a job runs on, and whether that Ray can hold the job.

- No ``--address`` and no ``RAY_ADDRESS`` (or the address ``local``): the job starts its own
  private local Ray (``ray.init(address="local")``), whatever else runs on the machine. A plain
  ``ray.init()`` would join a cluster that ``ray start --head`` left on the machine, and then
  refuse the ``num_cpus`` a local start passes.
- ``--address`` (``auto``, ``host:port``, ``ray://host:port``) or ``RAY_ADDRESS`` (as Ray sets
  it inside ``ray job submit``): the job joins that cluster and asks it for no resources of its
  own. The address is first probed, for at most ``angel.ray.connect.timeout.s`` in all, with
  TCP connections and then a gRPC handshake: an unreachable address, or a port that accepts
  connections but is not Ray, is one clear error, not minutes (or forever) of Ray's connection
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
import shutil
import socket
import subprocess
import sys
import tempfile
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
from learners.placement import Placement
from learners.plan import PS_RESOURCES, WORKER_RESOURCES, TrainPlan
from learners.terminate import stops_held, unwinding

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
#: The key that bounds the wait for a cluster's address (its Key is in learners.plan).
CONNECT_TIMEOUT_KEY = "angel.ray.connect.timeout.s"
#: Where a private Ray's folder goes (RAY_TMPDIR when set): short, as Ray's Unix socket paths
#: must stay under 107 bytes.
_TMP_ROOT = "/tmp" if os.path.isdir("/tmp") else None
#: The folder of the private Ray this process started (None: none, or a joined cluster).
_private_tmp: str | None = None
#: Set when :func:`stop` ended a private Ray at once without Ray's shutdown: the process must
#: then end without Ray's exit handler (learners.cli.main.end), which would wait for it.
abandoned = False
#: Ray's cluster switch as it was before a private Ray set it (learners.cluster._loopback_only).
_saved_cluster_env: tuple[str | None, bool] | None = None
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
    """The start-up line of :func:`start_or_join` (learners.startup)."""
    address, source = job_address(cli_address)
    if address is None:
        return "starting a private local Ray"
    return f"joining the Ray cluster at {address} ({source})"


def start_or_join(cli_address: str | None, timeout_s: float) -> None:
    """Start a private local Ray, or join the cluster of ``--address`` / ``RAY_ADDRESS``.

    On the command line a SIGTERM or Ctrl-C during the start stops the job cleanly (exit 143
    or 130, nothing left running): Ray's own SIGTERM handlers (``sys.exit`` at once, which
    left the agents of a half-started Ray running) are kept out, and a private Ray's start is
    finished first (learners.terminate.stops_held); a join is cut short at once (it starts
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
        _plain_prefixes()
        global _private_tmp
        # Its own 0700 folder (not the world-writable /tmp/ray), removed by stop().
        root = os.environ.get("RAY_TMPDIR") or _TMP_ROOT
        _private_tmp = tempfile.mkdtemp(prefix="angelps-ray-", dir=root)
        _loopback_only(True)
        try:
            ray.init(
                address="local",  # a new instance even when another Ray runs on this machine
                num_cpus=os.cpu_count() or 1,
                include_dashboard=False,
                namespace=NAMESPACE,
                log_to_driver=True,
                configure_logging=False,
                _temp_dir=_private_tmp,
            )
            # Ray makes its temp dir world-writable (for a Ray shared by several users); this
            # one serves this job's processes, all of this user.
            os.chmod(_private_tmp, 0o700)
        except BaseException:
            _loopback_only(False)
            _remove_private_tmp()
            raise
        finally:
            auth_log.setLevel(level)
        return
    _plain_prefixes()
    what = f"--address {address}" if source == "--address" else f"RAY_ADDRESS={address}"
    probe(_resolve(address, what), timeout_s, what)
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True)
    except ConnectionError as e:
        # The port answered (probe), so the likely cause is Ray's token authentication: Ray
        # 2.60 sends the token only under RAY_AUTH_MODE=token, even with one at hand, and a
        # cluster started with tokens then refuses the job after ~25 s of GCS warnings.
        mode = os.environ.get("RAY_AUTH_MODE") or "unset"
        raise ConfigError(
            f"{what}: Ray refused the connection ({e}); a cluster started with token "
            f"authentication needs RAY_AUTH_MODE=token (now {mode}) and its token "
            "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) in this shell"
        ) from None


def _plain_prefixes() -> None:
    """No colour codes around Ray's ``(Actor pid=...)`` prefixes when the output is not a
    terminal (a log file, a pipe) or NO_COLOR is set; a RAY_COLOR_PREFIX of the user wins."""
    tty = all(getattr(f, "isatty", lambda: False)() for f in (sys.stdout, sys.stderr))
    if not tty or os.environ.get("NO_COLOR"):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def _loopback_only(on: bool) -> None:
    """A private Ray on 127.0.0.1 only (``on``), or Ray's own choice of address again.

    Ray replaces a node address of 127.0.0.1 by the machine's own (``_node_ip_address`` is
    "resolved for localhost"), and its gRPC servers (GCS, raylet, object manager, every worker
    and driver) then listen on all interfaces. Its switch for machines that run no clusters
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: the node address is the loopback one) makes every
    process of the node, the dashboard agent and the metrics exporters included, listen on
    127.0.0.1 only: set for this process (Ray read it at import: its constant too) and, through
    the environment, for every process the private Ray starts; undone by :func:`stop`, so that
    a later join of a cluster registers the driver at a reachable address."""
    global _saved_cluster_env
    if on:
        _saved_cluster_env = (
            os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR),
            ray_constants.ENABLE_RAY_CLUSTER,
        )
        os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
        return
    if _saved_cluster_env is None:
        return
    env, const = _saved_cluster_env
    _saved_cluster_env = None
    if env is None:
        os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
    else:
        os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = env
    ray_constants.ENABLE_RAY_CLUSTER = const


def _remove_private_tmp() -> None:
    """Remove the folder of the private Ray this process started (its session: logs, sockets,
    spilled objects), once that Ray is down."""
    global _private_tmp
    tmp, _private_tmp = _private_tmp, None
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def private_ray_gone(wait_s: float = 0.0) -> bool:
    """Whether the private Ray this process started has lost its GCS or raylet (a SIGTERM to
    the whole process group reaches them with the driver), waiting up to ``wait_s`` for them to
    exit: then no call to an actor can be answered, and a stop must not wait for any."""
    try:  # Ray's own record of the processes it started (no public API for it)
        started = getattr(ray_worker._global_node, "all_processes", {})
        core = [
            info.process
            for kind in (ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET)
            for info in started.get(kind, [])
        ]
    except Exception:
        return False
    deadline = time.monotonic() + wait_s
    while core:
        if any(p.poll() is not None for p in core):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return False


def _kill_private_ray() -> None:
    """SIGKILL every process of the private Ray this driver started (Ray's own record) and the
    workers below its raylet, and reap them: what a SIGTERM to the whole process group leaves
    half-stopped (each of them in its own slow shutdown), so that ray.shutdown does not wait
    seconds for answers that will not come."""
    try:
        started = getattr(ray_worker._global_node, "all_processes", {})
        procs = [info.process for infos in started.values() for info in infos]
    except Exception:
        return
    pids = {p.pid for p in procs}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, below = list(pids), []
    while todo:
        for c in children.get(todo.pop(), []):
            below.append(c)
            todo.append(c)
    for pid in [*below, *pids]:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass


def stop(at_once: bool = False) -> None:
    """``ray.shutdown``: disconnect, and end the processes of a private Ray this job started.

    ``at_once`` (a SIGTERM stops the job): every process of a private Ray is SIGKILLed and its
    folder removed, without Ray's shutdown (see :data:`abandoned`).

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
    global abandoned
    if at_once and _private_tmp is not None:
        # Ray's own shutdown would wait ~5 s for the raylet it just lost (the driver's core
        # worker); this process ends right after (learners.cli.main.end), so it is skipped.
        _kill_private_ray()
        abandoned = True
        _loopback_only(False)
        _remove_private_tmp()
        return
    for info in monitors:
        if info.process.poll() is None:
            info.process.kill()
            try:
                info.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass  # ray.shutdown waits for it once more
    ray.shutdown()
    _loopback_only(False)
    _remove_private_tmp()


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
    The channel is Ray's own (its TLS settings, RAY_USE_TLS, apply)."""
    from ray._private.grpc_utils import init_grpc_channel  # (no public API for it)

    host = f"[{hp[0]}]" if ":" in hp[0] else hp[0]
    channel = init_grpc_channel(f"{host}:{hp[1]}")
    ready = threading.Event()

    def watch(state: object) -> None:  # a grpc.ChannelConnectivity
        if getattr(state, "name", "") == "READY":
            ready.set()

    channel.subscribe(watch, try_to_connect=True)
    try:
        answered = ready.wait(max(0.05, deadline - time.monotonic()))
    finally:
        channel.unsubscribe(watch)
        channel.close()
    if not answered:
        raise ConfigError(
            f"{what}: {hp[0]}:{hp[1]} accepts connections but does not answer as Ray (no gRPC "
            f"handshake) within {CONNECT_TIMEOUT_KEY}={timeout_s:g} s; check the address (the "
            "head's GCS port, 6379 unless ray start --port says otherwise, or ray://host:10001) "
            "and that the cluster runs, or leave out --address and RAY_ADDRESS for a private "
            "local Ray"
        )


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
    """What the job's workers and shards ask Ray for (as angelps.launch and the workers do),
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
