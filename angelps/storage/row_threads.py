"""Row work split over threads: a gather, a scatter or a key lookup of many rows cut into
contiguous parts run at once, each on its own slice of the output (:class:`RowThreads`).

numpy releases the GIL inside ``take`` and ``put``, so the parts run in parallel. A swap of a
device tier at a shard is bound by memory latency, not bandwidth (66,000 random rows of 64
bytes gathered at ~45 ns a row from a table of 1M rows), so more loads in flight at once make
it shorter: on 2 cores, with nothing else running, 2 threads took a 66,000-row gather from 3.5
to 2.5 ms and the scatter from 2.2 to 1.0 ms (``bench/swap_lane.py`` measures a whole swap).
The pools are shared per thread count within a process (a shard actor holds one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["MIN_PART_ROWS", "RowThreads", "auto_threads", "each", "row_threads"]

T = TypeVar("T")

#: The fewest rows a part gets: below this a thread's hand-off (tens of microseconds) costs
#: more than it saves.
MIN_PART_ROWS = 4096

_pools: dict[int, RowThreads] = {}
_pools_lock = threading.Lock()


def auto_threads(cores: int | None = None) -> int:
    """The threads a shard gives a swap by default: a quarter of the node's cores, 1 to 4 (one
    on a 2-core machine, where the worker needs the other core; four on a 16-core GPU node)."""
    n = os.cpu_count() if cores is None else cores
    return max(1, min(4, (n or 1) // 4))


class RowThreads:
    """Run ``fn(a, b)`` over ``[0, n)`` cut into up to ``threads`` contiguous parts of at least
    :data:`MIN_PART_ROWS` rows: the calling thread runs the first part, a pool the others.
    The parts must write disjoint outputs (the rows of a swap's keys are distinct)."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"row threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool = (
            ThreadPoolExecutor(threads - 1, thread_name_prefix="angelps-rows")
            if threads > 1
            else None
        )

    def run(self, n: int, fn: Callable[[int, int], object]) -> None:
        parts = min(self.threads, n // MIN_PART_ROWS)
        if self._pool is None or parts <= 1:
            fn(0, n)
            return
        cuts = [n * i // parts for i in range(parts + 1)]
        futures = [self._pool.submit(fn, cuts[i], cuts[i + 1]) for i in range(1, parts)]
        try:
            fn(cuts[0], cuts[1])
        finally:
            # Every part ends before this returns (or raises): none writes after its caller
            # moved on; the first error is raised.
            errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e


def each(par: RowThreads | None, tasks: Sequence[Callable[[], T]]) -> list[T]:
    """``[task() for task in tasks]``, at once on ``par``'s threads where given (the calling
    thread runs the first); the first task's error in order is raised, once all have ended."""
    if par is None or par._pool is None or len(tasks) < 2:
        return [task() for task in tasks]
    futures = [par._pool.submit(task) for task in tasks[1:]]
    first: BaseException | None = None
    out: list[T] = []
    try:
        out.append(tasks[0]())
    except BaseException as e:  # (raised once the others have ended)
        first = e
    errors = [f.exception() for f in futures]
    if first is not None:
        raise first
    for f, err in zip(futures, errors, strict=True):
        if err is not None:
            raise err
        out.append(f.result())
    return out


def row_threads(threads: int) -> RowThreads | None:
    """The process's :class:`RowThreads` of ``threads`` threads (None for one: no pool)."""
    if threads <= 1:
        return None
    with _pools_lock:
        got = _pools.get(threads)
        if got is None:
            got = _pools[threads] = RowThreads(threads)
        return got
