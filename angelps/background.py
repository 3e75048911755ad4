"""The threads that write checkpoints and backups while training goes on, at a lower CPU
priority than training.

A shard's backup or its part of a checkpoint, and a worker's held tables, are written from
copies in the background (angelps/server/shard_backups.py, angelps/server/shard_saves.py,
learners/worker/held_save.py). Where training keeps every core busy (two cores: a worker and
a shard), a writer at the same priority takes its share of them from training; at
:data:`NICE` it gets the cores training leaves idle, and training waits for it only where it
asks for its result (the next save), when it has the cores to itself. On Linux a thread's
nice value is its own (``setpriority`` on its thread id); elsewhere the writers run at the
process's priority.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from angelconf.printable import printable

__all__ = ["LOWEST", "NICE", "lower_priority", "run_writing", "say_no_copy", "writer_pool"]

T = TypeVar("T")

#: How far below training the writers run, in nice values (capped at 19, the lowest): yet
#: still a share of a busy machine (CFS gives a thread 10 nice values below another about a
#: tenth of the core the other gets). Relative to the process's own: Ray starts its workers,
#: the shards and the training workers, at nice 15 (``RAY_worker_niceness``), so a fixed 10
#: would put the writers above training there.
NICE = 10
LOWEST = 19

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def lower_priority(by: int = NICE) -> bool:
    """Run the calling thread (Linux) ``by`` nice values below where it runs now (at most
    at :data:`LOWEST`); whether it could."""
    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(LOWEST, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError:
        return False
    return True


def writer_pool() -> ThreadPoolExecutor:
    """This process's writer threads (two: a checkpoint and a backup may be written at once),
    each :data:`NICE` below the thread that first asked for them (a new thread starts at its
    creator's nice value)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                2, thread_name_prefix="angelps-writer", initializer=lower_priority
            )
        return _pool


async def run_writing(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a writer thread, awaited on the running event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(writer_pool(), partial(fn, *args))


def say_no_copy(who: str, what: str, need: int, free: int, then: str) -> None:
    """The one warning of a copy for a write in the background that memory cannot hold
    (``need`` bytes, more than half of the ``free`` available): ``who``'s ``what`` is written
    ``then`` instead, and the next ones while memory stays short."""
    print(
        printable(
            f"angelps: warning: {who}: {what} in the background would copy "
            f"{need / 2**20:,.0f} MiB with {free / 2**20:,.0f} MiB of memory available: it and "
            f"the next ones while memory stays short are written {then}"
        ),
        file=sys.stderr,
        flush=True,
    )
