"""The processes of this Ray job that Ray killed because their node ran low on memory.

Ray's memory monitor kills worker processes (a shard, a worker) when its node's memory passes a
threshold (``RAY_memory_usage_threshold``, 0.95 of the node's memory by default). Seen from the
job such a kill is only a lost process, and Ray restarts a shard actor it killed: restored from
its backup, it grows into the same limit again. So a client asks here, before it recovers a
shard, and the job's failover before it restarts the workers (learners/job/memory_kills.py says
what the job then reports).

Ray records each worker process's end in its control store's worker table (exit type
``NODE_OUT_OF_MEMORY``, the process's memory at its death, Ray's account of the node). That
table is read through Ray's internal state accessor, the same one its own ``ray.nodes()`` uses;
where it cannot be read (another Ray version, no connection), no kill is reported and the
caller behaves as without this check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["SETTLE_S", "MemoryKill", "memory_kills", "now_ms"]

#: How long :func:`memory_kills` looks again for a kill not recorded yet (a process's death can
#: reach the job before Ray's table has its cause).
SETTLE_S = 1.0


@dataclass(frozen=True)
class MemoryKill:
    """One process Ray killed for memory: its pid, its memory then (bytes, 0 where unknown),
    and Ray's account of the node (``Memory on the node (IP: ...) was ... used / ... limit``)."""

    pid: int
    used_bytes: int
    node: str


def now_ms() -> int:
    """Wall-clock milliseconds, as Ray's worker table stamps a process's end."""
    return int(time.time() * 1000)


def memory_kills(since_ms: int, settle_s: float = SETTLE_S) -> list[MemoryKill]:
    """This job's worker processes that Ray killed for memory and that ended at or after
    ``since_ms``; looked for again for up to ``settle_s`` while none is found. Empty where
    Ray's table cannot be read."""
    deadline = time.monotonic() + settle_s
    while True:
        kills = _read(since_ms)
        if kills or time.monotonic() >= deadline:
            return kills
        time.sleep(0.25)


def _read(since_ms: int) -> list[MemoryKill]:
    try:  # (Ray's internals: any failure means "not known", never a second error)
        import ray
        from ray._private import state
        from ray.core.generated import common_pb2, gcs_pb2

        job = bytes.fromhex(ray.get_runtime_context().get_job_id())
        oom = common_pb2.WorkerExitType.Value("NODE_OUT_OF_MEMORY")  # type: ignore[attr-defined]
        table = state.state._connect_and_get_accessor().get_worker_table()
        kills = []
        for raw in table:
            w = gcs_pb2.WorkerTableData.FromString(raw)  # type: ignore[attr-defined]
            if w.is_alive or w.exit_type != oom or w.job_id != job:
                continue
            if w.end_time_ms and w.end_time_ms < since_ms:
                continue
            kills.append(MemoryKill(int(w.pid), int(w.memory_used_bytes_at_death), _node(w)))
        return kills
    except Exception:
        return []


def _node(w: object) -> str:
    """Ray's line about the node's memory in a kill's detail ("" where it has none)."""
    detail = str(getattr(w, "exit_detail", "") or "")
    line = next((ln for ln in detail.splitlines() if "Memory on the node" in ln), "")
    return line[line.find("Memory on the node") :].strip().rstrip(".") if line else ""
