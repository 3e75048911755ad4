"""The job's processes that Ray killed because their node ran low on memory.

Ray's memory monitor kills worker processes (a shard, a worker) when its node's memory passes a
threshold (``RAY_memory_usage_threshold``, 0.95 of the node's memory by default), and a table
that outgrows its nodes is the usual way a parameter-server job gets there. Seen from the job,
such a kill is only a lost process: a dead shard under a device tier, a worker's lost
connection. A restart from the last checkpoint runs the same steps into the same limit (three
times over, minutes to hours each), and the job's last error named a lost connection, not the
memory. So the failover (:mod:`learners.job.failover`) asks here whether Ray killed any of this
job's processes for memory since the attempt began, and if it did the job stops at once with an
error that says so (:class:`NodeOutOfMemory`), what each killed process held, and what to change.

Ray records each worker process's end in its control store's worker table (exit type
``NODE_OUT_OF_MEMORY``, the process's memory at its death, Ray's account of the node). That
table is read through Ray's internal state accessor, the same one its own ``ray.nodes()`` uses;
where it cannot be read (another Ray version, no connection), no kill is reported and the
failover behaves as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from angelps.memory_kills import SETTLE_S, MemoryKill, memory_kills, now_ms

__all__ = [
    "MemoryKill",
    "NodeOutOfMemory",
    "explained",
    "memory_kills",
    "now_ms",
    "out_of_memory",
]

#: What a job can change so that its rows fit (said in :class:`NodeOutOfMemory`'s message).
REMEDIES = (
    "spread the tables over more memory (more shard actors on more nodes: angel.ps.number, "
    "angel.ps.memory to reserve each one's share), keep fewer rows (a device tier's budget, "
    "angel.worker.table.capacity, instead of tables held whole on the workers; feature "
    "admission, angel.ps.admission.min.count; expiry, angel.ps.eviction.ttl.updates), or let "
    "Ray use more of the node before it kills (RAY_memory_usage_threshold, set where Ray starts)"
)


class NodeOutOfMemory(RuntimeError):
    """The job stopped because Ray killed its processes for lack of memory on their node."""


def out_of_memory(
    what: str,
    kills: Sequence[MemoryKill],
    names: Mapping[int, str] | None = None,
    save_path: str | None = None,
) -> NodeOutOfMemory:
    """The error that ends a job after ``what`` (the failure the job saw: a worker died, a
    call failed) where Ray killed ``kills`` for memory (``names``: a process's name by pid,
    e.g. ``parameter shard 1``; ``save_path``: where the job's checkpoints are, kept)."""
    names = names or {}
    named = [k for k in kills if k.pid in names]
    others = [k for k in kills if k.pid not in names]
    parts = [f"{names[k.pid]} (pid {k.pid}{_gib(k.used_bytes, ', ')})" for k in named]
    if others:
        pids = ", ".join(str(k.pid) for k in others)
        held = _gib(sum(k.used_bytes for k in others), "; ", " together" if len(others) > 1 else "")
        what_else = "another process" if named else "a process"
        if len(others) > 1:
            what_else = f"{len(others)} {'other ' if named else ''}processes"
        parts.append(f"{what_else} (pid{'s' if len(others) > 1 else ''} {pids}{held})")
    each = ", ".join(parts)
    # (Ray's account of each node, as of its last kill there)
    last: dict[str, str] = {}
    for k in kills:
        if k.node:
            last[k.node.split(")")[0]] = k.node
    where = f" ({'; '.join(last.values())})" if last else ""
    kept = f"; its last checkpoint, if it wrote one, is kept in {save_path}" if save_path else ""
    return NodeOutOfMemory(
        f"{what}: Ray killed {each} because the node ran low on memory{where}. A restart would "
        f"run the same steps into the same limit, so the job stops here{kept}. To fit: {REMEDIES}"
    )


def _gib(n: int, before: str, after: str = "") -> str:
    """``n`` bytes in GiB with its punctuation, or nothing where Ray did not say (0)."""
    return f"{before}{n / 2**30:.2f} GiB{after}" if n else ""


def explained(
    e: BaseException,
    since_ms: int,
    names: Mapping[int, str] | None = None,
    save_path: str | None = None,
) -> NodeOutOfMemory | None:
    """``e``, a job's failure, as :class:`NodeOutOfMemory` where Ray killed any of the job's
    processes for memory since ``since_ms`` (waited for only after Ray's own errors: a bad
    input fails before any kill); None where it did not (or ``e`` says so already)."""
    if isinstance(e, NodeOutOfMemory):
        return None
    from ray.exceptions import RayError

    kills = memory_kills(since_ms, SETTLE_S if isinstance(e, RayError) else 0.0)
    if not kills:
        return None
    # (the failure's first sentence: Ray's own OutOfMemoryError goes on about the node, said
    # once, after, from the kills)
    first = next((ln for ln in str(e).splitlines() if ln.strip()), "").strip()
    first = first.split(". ")[0].rstrip(".")
    return out_of_memory(f"{type(e).__name__}: {first}", kills, names, save_path)
