"""A worker's held tables written into a checkpoint in the background (:class:`HeldSaves`).

With ``angel.save.model.async`` (the default) the driver asks each worker to start its part of
the checkpoint: the worker copies its held tables' touched rows to host memory now
(:meth:`HeldTables.freeze`: copied down a chunk at a time, the rows of the save's moment) and a
thread writes the copy into the checkpoint's temporary directory, in the shards' format, while
the next epoch trains. The driver's commit asks for the files' manifest entries
(:meth:`HeldSaves.result`, without waiting: the worker is an actor serving one call at a time,
so a call that waited for the write would hold up the training calls queued behind it). A copy
that would take more than half of the host's available memory is not made: the files are
written before the worker answers, said once on stderr.
"""

from __future__ import annotations

from concurrent.futures import Future, wait
from typing import Any

from angelps import malloc
from angelps.background import say_no_copy, writer_pool
from learners.worker.held_tables import HeldTables, write_held

__all__ = ["HeldSaves"]


class HeldSaves:
    """Worker ``worker``'s checkpoint writes in the background (one at a time)."""

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self._fut: Future[dict[str, Any]] | None = None
        #: saves written before answering, for want of memory for the copy
        self.inline = 0

    def start(self, root: str, held: HeldTables) -> None:
        """Copy ``held``'s tables now and write the copy under ``root`` in a thread. A write
        whose result was never asked for (its checkpoint given up: another writer failed) is
        waited for first and dropped: one write at a time."""
        if self._fut is not None:
            wait([self._fut])
            self._fut = None
        need, free = held.frozen_nbytes(), malloc.available_bytes()
        fut: Future[dict[str, Any]]
        if need > free // 2:
            self._say_inline(need, free)
            fut = Future()
            fut.set_result(held.save(root))
        else:
            frozen = held.freeze()
            fut = writer_pool().submit(write_held, root, self.worker, frozen)
        self._fut = fut

    def _say_inline(self, need: int, free: int) -> None:
        if not self.inline:
            what = "a checkpoint of its held tables"
            say_no_copy(f"worker {self.worker}", what, need, free, "before training goes on")
        self.inline += 1

    def result(self, wait: bool = True) -> dict[str, Any] | None:
        """The files' manifest entries of the save started last once written (None while
        it is being written and ``wait`` is false); the write's error if it failed."""
        fut = self._fut
        if fut is None:
            raise RuntimeError(f"worker {self.worker}: no checkpoint is being written")
        if not wait and not fut.done():
            return None
        try:
            return fut.result()
        finally:
            self._fut = None
