"""A checkpoint's files of one shard written in the background (:class:`ShardSaves`).

``PSClient.save(..., background=True)`` asks every shard to start its part: the shard copies
its tables now, between two calls (:meth:`ParameterShard.image`: the rows of the save's
moment, the client having waited for its pushes first), answers, and a thread writes the copy
into the checkpoint's temporary directory while the shard goes on serving the next epoch's
steps; :meth:`ShardSaves.result` (the ``saved`` call) waits for the files and returns their
manifest info, or raises the write's error. A copy that would take more than half of the
memory still available is not made: that shard writes its files before it answers (as an
inline save does), said once on stderr.

Invariants: one checkpoint at a time per shard (a second start before the first's result is
refused); the files are those of the rows at the start, whatever the shard applies meanwhile;
:meth:`ShardSaves.stop` (the job is ending) stops a write between two chunks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from angelps.background import run_writing, say_no_copy
from angelps.server.shard import ParameterShard, ShardImage
from angelps.server.shard_backups import memory_short

__all__ = ["ShardSaves"]


class ShardSaves:
    """The checkpoint writes of ``shard`` in the background (one at a time)."""

    def __init__(self, shard: ParameterShard) -> None:
        self.shard = shard
        self._task: asyncio.Future[dict[str, Any]] | None = None
        self._image: ShardImage | None = None
        #: saves written inline for want of memory for the copy
        self.inline = 0

    @property
    def started(self) -> bool:
        """A save was started in this process and its result not taken yet."""
        return self._task is not None

    def start(self, root: str) -> None:
        """Copy the tables now and write the copy under ``root`` in a thread (on the running
        event loop); without the memory for the copy, write the files now."""
        if self._task is not None:
            raise RuntimeError(
                f"shard {self.shard.shard_id}: a checkpoint is being written already (its "
                "result has not been asked for): one at a time"
            )
        loop = asyncio.get_running_loop()
        short = memory_short(self.shard)
        if short is not None:
            self._inline(*short)
            done: asyncio.Future[dict[str, Any]] = loop.create_future()
            done.set_result(self.shard.save(root))
            self._task = done
            return
        image = self._image = self.shard.image(copy=True)
        self._task = loop.create_task(run_writing(image.save, root))

    def _inline(self, need: int, free: int) -> None:
        if not self.inline:
            then = "before training goes on (angel.save.model.async=false: always)"
            say_no_copy(f"shard {self.shard.shard_id}", "a checkpoint", need, free, then)
        self.inline += 1

    async def result(self) -> dict[str, Any]:
        """The files' manifest info of the save started last (:meth:`ParameterShard.save`'s),
        once written; the write's error if it failed."""
        task = self._task
        if task is None:
            raise RuntimeError(f"shard {self.shard.shard_id}: no checkpoint is being written")
        try:
            return await asyncio.shield(task)
        finally:
            if self._task is task and task.done():
                self._task = self._image = None

    async def stop(self) -> None:
        """The job is ending: a write in progress stops after its current chunk."""
        task, image = self._task, self._image
        if image is not None:
            image.stop.set()
        if task is not None:
            try:
                await asyncio.shield(task)
            except Exception:
                pass  # (SaveStopped, or the write's error: nothing waits for it any more)
            self._task = self._image = None
