"""When and how one shard actor writes its backups (:class:`ShardBackups`), and its restore.

A backup holds the shard's rows, optimizer state and clocks (:meth:`ParameterShard.save` under
a new version, :mod:`angelps.checkpoint.backups`). It is written at start-up, then after every
``angel.ps.backup.interval`` applied updates. With ``angel.ps.backup.async`` (the default) the
shard copies its tables between two calls (:meth:`ParameterShard.image`: clocks and rows
agree, since no call runs meanwhile) and a thread writes the copy while the shard goes on
serving; otherwise it writes the backup before it serves the next call. A copy that would
take more than half of the memory still available is not made: that backup is written inline
(with a warning, once).

Invariants: one backup is written at a time (an interval that ends while one is being
written starts the next after it); the clocks a backup holds (:attr:`ShardBackups.clocks`,
which each reply reports and by which the clients drop the pushes they keep for a replay)
change only once its files and pointer are in place; a backup written now (a load, an
explicit one) waits for the one in the background first, so an older one never lands last; a
background write that fails is reported to the next step call, and the job stops, the previous
backup untouched (``write_backup`` leaves no temporary behind); at the job's end
(:meth:`ShardBackups.stop`) the write stops between two chunks, before the backups are removed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from angelps import malloc
from angelps.background import run_writing, say_no_copy
from angelps.checkpoint.backups import read_backup, shard_dir, write_backup
from angelps.options import ShardOptions
from angelps.server.shard import ParameterShard, SaveStopped, ShardImage

__all__ = ["ShardBackups", "memory_short"]


def memory_short(shard: ParameterShard, backup: bool = False) -> tuple[int, int] | None:
    """(bytes a copy of ``shard`` (``backup``: of the tables a backup holds) would take, bytes
    of memory available) when the copy would take more than half of what is available (the
    copy is then not made: the files are written from the live tables instead, the caller
    waiting); None when it fits."""
    need, free = shard.snapshot_nbytes(backup), malloc.available_bytes()
    return (need, free) if need > free // 2 else None


class ShardBackups:
    """The backups of ``shard`` under ``options.backup_dir`` ("" : off)."""

    def __init__(self, shard: ParameterShard, options: ShardOptions) -> None:
        self.shard = shard
        self.interval = options.backup_interval
        self.background = options.backup_async
        root = options.backup_dir
        self.dir = shard_dir(root, shard.shard_id) if root else ""
        #: Per worker, the clock the latest backup in place holds.
        self.clocks = [0] * shard.clocks.num_workers
        self.error: str | None = None  # a background write's failure, for the next call
        self._since = 0
        self._task: asyncio.Task[None] | None = None
        self._image: ShardImage | None = None  # the copy being written
        self._stopped = False
        self._counts = _counts()

    def restore(self) -> bool:
        """Load the latest backup into the shard (a restarted actor); False without one."""
        info = read_backup(self.dir)  # LATEST checked: it names a version in the dir
        if info is None:
            return False  # died before its first backup: clients replay from clock 0
        root, meta = info
        self.shard.load(root, meta)  # (the device tiers' tables it does not hold stay empty)
        self.shard.restore_state(meta)
        self.shard.unbacked = set(meta.get("unbacked", ()))
        self.clocks = list(meta["clocks"]["pushed"])
        return True

    def first(self) -> None:
        """The backup at clock 0, written at start-up: its one-time cost (~0.3 s: Parquet's
        writer warming up) is paid there, not in the middle of training
        (bench/backup_cost.py); its seconds are kept apart (``start_s``)."""
        self.write_now()
        self._counts = _counts(start_s=self._counts["seconds"])

    def write_now(self) -> list[int]:
        """Write a backup on the caller's thread; the per-worker clocks it holds. An async
        caller awaits :meth:`written` first."""
        if not self.dir:
            raise ValueError(
                "shard backups are off: set angel.ps.backup.interval > 0 (and "
                "angel.ps.backup.path) to enable them"
            )
        t0 = time.perf_counter()
        meta = self.shard.backup_meta()
        write_backup(self.dir, self.shard.image(backup=True), meta)
        self._since = 0
        self._done(meta, t0)
        return self.clocks

    def due(self) -> bool:
        """Whether the next update applied starts (or writes) a backup."""
        return self.interval > 0 and not self._stopped and self._since + 1 >= self.interval

    def after_update(self) -> None:
        """One more update applied: a backup when the interval is reached."""
        if self.interval <= 0 or self._stopped:
            return
        self._since += 1
        if self._since < self.interval:
            return
        if not self.background:
            self.write_now()
        elif self._task is None:  # (else the next update after it starts one)
            short = memory_short(self.shard, backup=True)
            if short is not None:
                self._inline_for_memory(*short)
            else:
                self._start()

    def _inline_for_memory(self, need: int, free: int) -> None:
        """A copy that would take more than half the memory left: written inline instead
        (slower, but it cannot run the machine out of memory); said once, counted always."""
        if not self._counts["inline"]:
            then = "inline (training waits for them; angel.ps.backup.async=false: always)"
            say_no_copy(f"shard {self.shard.shard_id}", "a backup", need, free, then)
        self._counts["inline"] += 1
        self.write_now()

    def _start(self) -> None:
        """Copy the shard now and write the copy in a thread (on the running event loop)."""
        t0 = time.perf_counter()
        meta = self.shard.backup_meta()
        image = self.shard.image(copy=True, backup=True)
        self._since = 0
        self._counts["copy_s"] += time.perf_counter() - t0
        self._image = image
        self._task = asyncio.get_running_loop().create_task(self._write(image, meta, t0))

    async def _write(self, image: ShardImage, meta: dict[str, Any], t0: float) -> None:
        try:
            await run_writing(write_backup, self.dir, image, meta)
        except SaveStopped:
            pass  # the job is shutting down (stop()): the temporary is gone, LATEST as it was
        except Exception as e:
            why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            self.error = (
                f"shard {self.shard.shard_id}: its backup under {self.dir} failed ({why}); "
                "the job stops rather than train on without one: make room there, choose "
                "another angel.ps.backup.path or set angel.ps.backup.interval=0"
            )
        else:
            self._done(meta, t0)
        finally:
            self._task = self._image = None

    def _done(self, meta: dict[str, Any], t0: float) -> None:
        self.clocks = list(meta["clocks"]["pushed"])
        # What backups cost this shard (stats(); bench/backup_cost.py reads it).
        self._counts["count"] += 1
        self._counts["seconds"] += time.perf_counter() - t0

    async def written(self) -> None:
        """Wait for the backup being written in the background, if any."""
        task = self._task
        if task is not None:
            await asyncio.shield(task)

    async def stop(self) -> None:
        """No more backups: the one being written stops after its current chunk, leaving the
        previous backup (the job is over, its backups about to be removed: none may land
        after that)."""
        self._stopped = True
        if self._image is not None:
            self._image.stop.set()
        await self.written()

    def stats(self) -> dict[str, Any]:
        """Backups written since the start-up one: ``count``, ``seconds`` (each from its
        start to its pointer in place), ``start_s`` (the start-up one's seconds), ``copy_s``
        (the calls' wait for the copies of the background ones), ``inline`` (those written
        inline instead for want of memory for the copy), ``writing`` (one now)."""
        return dict(self._counts, writing=self._task is not None)


def _counts(start_s: float = 0.0) -> dict[str, Any]:
    return {"count": 0, "seconds": 0.0, "start_s": start_s, "copy_s": 0.0, "inline": 0}
