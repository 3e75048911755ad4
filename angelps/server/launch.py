"""Starting the shard actors of one job from its :class:`~angelps.options.PSOptions`.

:func:`launch_shards` creates ``num_shards`` Ray actors named ``<job>-ps-<i>`` in the Ray
namespace ``angelps`` (so a second job with the same name fails at once instead of sharing
shards), hands each the same :class:`~angelps.options.ShardOptions`, and waits until all of
them answer. It returns their handles and the :class:`~angelps.options.ClientOptions` that every
client of the job shares. :meth:`angelps.client.ps_client.PSClient.launch` is the user-facing entry.

Invariants: either every shard started or none is left running; each launch with backups on
gets a backup directory of its own, readable by this user only (0700: under
``angel.ps.backup.path`` when set, else a fresh private temporary directory; on a URL a prefix
of its own, read by whom the bucket allows), so a fresh job
never restores an older job's backup and no other user reads one; the data-plane token is new
at every launch.
"""

from __future__ import annotations

import secrets
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import ray
from ray.actor import ActorClass, ActorHandle
from ray.exceptions import GetTimeoutError, RayTaskError

from angelps.checkpoint.backups import launch_dir
from angelps.client import wire
from angelps.client.transport import remote_error
from angelps.options import ClientOptions, PSOptions, ShardOptions
from angelps.server.shard_server import ShardServer
from angelps.table import TableSpec, check_unique_names

__all__ = [
    "NAMESPACE",
    "PendingShards",
    "actor_name",
    "launch_shards",
    "shard_options",
    "start_shards",
    "wait_started",
]

NAMESPACE = "angelps"

_ShardActor: ActorClass[ShardServer] = ray.remote(ShardServer)


def actor_name(job: str, shard: int) -> str:
    """Ray actor name of shard ``shard`` of job ``job``."""
    return f"{job}-ps-{shard}"


def _single_node() -> bool:
    """True when the Ray cluster is this one machine (shards then listen on loopback)."""
    try:
        return sum(1 for n in ray.nodes() if n.get("Alive")) <= 1
    except Exception:  # no node list (an old or a remote-client Ray): assume a cluster
        return False


def shard_options(ps: PSOptions, num_workers: int) -> ShardOptions:
    """The options every shard of this launch gets (a new token, a new backup directory)."""
    backup_dir = _backup_dir(ps) if ps.backup_interval > 0 else ""
    return ShardOptions.of(
        ps,
        num_workers,
        backup_dir=backup_dir,
        # The data plane's password, handed to clients with their options.
        token=secrets.token_hex(wire.TOKEN_BYTES // 2),
        # Ray sets CUDA_VISIBLE_DEVICES for the actor: its device is always "cuda".
        device="cuda" if ps.gpus > 0 else None,
    )


def _backup_dir(ps: PSOptions) -> str:
    """A new directory for this launch's backups, 0700: ``<angel.ps.backup.path>/<job>-<id>``,
    or without a path a private temporary directory (never a shared one under /tmp); on a URL
    the prefix ``<angel.ps.backup.path>/<job>-<id>``, nothing created yet."""
    if not ps.backup_path:
        return tempfile.mkdtemp(prefix=f"angelps-backup-{ps.job}-")  # made 0700
    return launch_dir(ps.backup_path, f"{ps.job}-{uuid.uuid4().hex[:12]}")


def _actor_options(ps: PSOptions) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "namespace": NAMESPACE,
        "num_cpus": ps.cpus,
        "max_concurrency": 1000,
        # Ray restarts a dead shard only when it can restore a backup.
        "max_restarts": ps.max_attempts - 1 if ps.backup_interval > 0 else 0,
    }
    if ps.memory_mib > 0:
        opts["memory"] = ps.memory_mib * 2**20
    if ps.gpus > 0:
        opts["num_gpus"] = ps.gpus
    return opts


@dataclass
class PendingShards:
    """Shard actors created but perhaps not started yet (:func:`start_shards`): their handles,
    the options their clients share, and one ``ping`` per shard that answers once it runs."""

    handles: list[ActorHandle]
    options: ClientOptions
    pings: list[ray.ObjectRef]
    ps: PSOptions

    def kill(self) -> None:
        """End every shard of this launch (those already running and those still starting)."""
        for h in self.handles:
            ray.kill(h)


def start_shards(
    tables: Sequence[TableSpec],
    ps: PSOptions,
    num_workers: int,
    placement: Sequence[Mapping[str, Any]] | None = None,
) -> PendingShards:
    """Create the shard actors (Ray must be initialised) without waiting for them, so that a
    job can start its workers at the same time; :func:`wait_started` then waits.
    ``placement[i]``: Ray actor options that place shard ``i`` (custom ``resources``, a
    ``scheduling_strategy``)."""
    if not ray.is_initialized():
        raise RuntimeError("PSClient.launch needs a running Ray: call ray.init() first")
    check_unique_names(tables)
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    options = ClientOptions(
        shard=shard_options(ps, num_workers),
        transport=ps.transport,
        # One node: listen on loopback only (nothing exposed beyond the machine); a
        # cluster: on the shard's node address, for workers on other nodes.
        data_host="127.0.0.1" if _single_node() else "",
        shared_bytes=ps.shared_mib << 20,
    )
    actor_opts = _actor_options(ps)
    pending = PendingShards([], options, [], ps)
    try:
        for i in range(ps.num_shards):
            where = dict(placement[i]) if placement is not None else {}
            handle = _start(i, list(tables), ps, options.shard, actor_opts | where)
            pending.handles.append(handle)
            pending.pings.append(handle.ping.remote())
    except BaseException:
        pending.kill()
        raise
    return pending


def wait_started(pending: PendingShards) -> tuple[list[ActorHandle], ClientOptions]:
    """Wait until every shard of ``pending`` answers (at most ``angel.ps.timeout``); on any
    failure end them all. Their handles and the options their clients share."""
    try:
        _wait_started(pending.pings, pending.ps)
    except BaseException:
        pending.kill()
        raise
    return pending.handles, pending.options


def launch_shards(
    tables: Sequence[TableSpec], ps: PSOptions, num_workers: int
) -> tuple[list[ActorHandle], ClientOptions]:
    """Start the shard actors (Ray must be initialised) and wait until they answer."""
    return wait_started(start_shards(tables, ps, num_workers))


def _start(
    i: int,
    tables: list[TableSpec],
    ps: PSOptions,
    options: ShardOptions,
    actor_opts: dict[str, Any],
) -> ActorHandle:
    name = actor_name(ps.job, i)
    try:
        handle = _ShardActor.options(name=name, **actor_opts).remote(
            i, ps.num_shards, tables, options
        )
    except ValueError as e:
        raise ValueError(
            f"cannot create shard actor {name!r} in namespace {NAMESPACE!r}: {e} "
            f"(is a job with angel.job.name={ps.job!r} still running? shut it down "
            f"or choose another angel.job.name)"
        ) from None
    return cast(ActorHandle, handle)


def _wait_started(pings: list[ray.ObjectRef], ps: PSOptions) -> None:
    try:
        ray.get(pings, timeout=ps.timeout_s)
    except GetTimeoutError:
        raise RuntimeError(
            f"the {ps.num_shards} shard actor(s) did not start within {ps.timeout_s:g} s: can "
            f"the Ray cluster place them? Each asks for angel.ps.cpus={ps.cpus:g}, "
            f"angel.ps.gpus={ps.gpus:g}, angel.ps.memory={ps.memory_mib} MiB"
        ) from None
    except RayTaskError as e:
        raise remote_error(e) from None
