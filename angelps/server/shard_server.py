"""The shard actor: :class:`ShardServer`, the body of the Ray actor around a
:class:`~angelps.server.shard.ParameterShard`.

It adds what needs a process of its own: waiting for other workers' clocks (BSP/SSP), the TCP
data plane (:mod:`angelps.client.wire`, one connection per client process) and backups with restart
recovery. It receives typed :class:`~angelps.options.ShardOptions`, never configuration keys.

Invariants: one operation at a time touches a table's rows (an asyncio actor: the numpy work
runs on the event loop, only clock waits yield; a device tier's swap runs on a thread of its own,
and a call touching its tables, or starting a backup, waits for it), so socket calls and Ray
calls interleave exactly as Ray calls interleave with each other; after a
restart no update is silently dropped (see :class:`ShardServer`); a data-plane peer cannot
take the shard down (:mod:`angelps.server.data_plane`). Backups live in a directory only this
user can read (0700), restored only from a ``LATEST`` naming a version inside it.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from angelps.checkpoint.backups import backup_version, private_dir
from angelps.client import wire
from angelps.malloc import keep_freed_memory
from angelps.options import ShardOptions
from angelps.server.actor_env import connection_cap, was_restarted
from angelps.server.data_plane import AUTHENTICATED, MAX_UNREAD, DataPlane
from angelps.server.shard import NotReplayed, ParameterShard, SaveLost, ShardRestarted
from angelps.server.shard_backups import ShardBackups
from angelps.server.shard_saves import ShardSaves
from angelps.step_call import StepCall, StepResult
from angelps.table import TableSpec

__all__ = ["MAX_UNREAD", "ShardServer", "backup_version", "private_dir"]

_AUTHENTICATED = AUTHENTICATED


class ShardServer(DataPlane):
    """Body of the Ray actor around a :class:`ParameterShard`.

    An asyncio actor: the numpy work runs on the event loop (one operation at a time, so no
    locks around the arrays), while calls that must wait for other workers' clocks park on a
    condition variable without blocking the actor. ``step`` is the one call per shard per step:
    apply a push (if any), then serve a pull (if any).

    Backups (``angel.ps.backup.interval`` > 0): at start, then every ``interval`` applied
    updates, the shard writes its partition, optimizer state and clocks under its backup
    directory (Parquet, a new version directory, then an atomic ``LATEST`` pointer), by
    default from a copy written in the background (:mod:`angelps.server.shard_backups`); a
    reply reports a backup's clock only once it is in place. When Ray restarts a dead shard,
    the constructor restores the latest backup, and every worker whose calls are ahead of the
    restored clock gets :class:`ShardRestarted` until its client has replayed the pushes it
    logged since that backup (the client learns the backup clock from each reply and trims its
    log). Updates are thus redone, never silently dropped.
    """

    def __init__(
        self,
        shard_id: int,
        num_shards: int,
        tables: Sequence[TableSpec],
        options: ShardOptions,
    ) -> None:
        keep_freed_memory()  # (a shard's calls free megabytes each: angelps/malloc.py)
        self.shard = ParameterShard(
            shard_id,
            num_shards,
            tables,
            partitioner=options.partitioner,
            num_workers=options.num_workers,
            staleness=options.staleness,
            nan_policy=options.nan_policy,
            device=options.device,
            admission_min_count=options.admission_min_count,
            eviction_ttl_updates=options.eviction_ttl_updates,
            swap_threads=options.swap_threads,
        )
        self.timeout_s = options.timeout_s
        self.backups = ShardBackups(self.shard, options)
        self.saves = ShardSaves(self.shard)
        self.restarted = False
        self._awaiting_replay: set[int] = set()
        self._cond: asyncio.Condition | None = None
        self._swap_lock: asyncio.Lock | None = None
        self._swap_tables: frozenset[str] = frozenset()
        self._swap_thread: ThreadPoolExecutor | None = None
        # The data plane (angelps.client.wire): a TCP server opened by serve(), guarded by the token.
        self._token = options.token.encode()
        self._server: asyncio.Server | None = None
        self._limits = wire.FrameLimits.of(tables, num_shards)
        self._token_timeout_s = options.token_timeout_s
        self._max_connections = connection_cap(options.max_connections)
        self._conns = {"open": 0, "refused": 0, "dropped": 0}
        #: Calls served and the seconds their rows' work took (clock waits left out).
        self._served = {"steps": 0, "step_s": 0.0, "swaps": 0, "swap_s": 0.0}
        if self.backups.dir and was_restarted():
            self.restarted = True
            self._awaiting_replay = set(range(self.shard.clocks.num_workers))
            self.backups.restore()
        elif self.backups.dir:
            self.backups.first()

    # --- waiting -------------------------------------------------------------------------------

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def _wait(self, pred: Callable[[], bool], what: str) -> None:
        if pred():
            return
        cond = self._condition()
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(pred), self.timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"shard {self.shard.shard_id}: {what} waited {self.timeout_s:g} s for other "
                    f"workers ({self.shard.clocks.describe()}); raise "
                    f"angel.matrixtransfer.request.timeout.ms or check that every worker "
                    f"pushes (or calls clock()) once per step"
                ) from None

    async def _notify(self) -> None:
        cond = self._condition()
        async with cond:
            cond.notify_all()

    # --- remote methods ------------------------------------------------------------------------

    async def step(self, call: StepCall, secret: Any = "") -> StepResult:
        """Push (``call.pushes``: the worker's gradients for ``call.clock``), then pull at the
        clock after it; the result's ``backed_up`` is the clock of this worker held by the
        latest backup. A call the client did not check (``call.checked``: one from the
        network) is validated by the shard before any row is touched; ``secret``: the job's,
        which a Ray call must carry (server._check_secret).

        ``call.pull_clock`` (SSP, ASP): a prefetch, the rows of a batch the worker computes at
        that later clock; it waits as SSP asks for a read at that clock, but only for this
        worker's pushes so far (the calls of its later clocks come behind it on the same
        connection).

        After a restart, a worker's calls are refused with :class:`ShardRestarted` until one
        arrives that its client sent knowing of the restart (``call.recovering``: a replayed
        push or a redone pull; Ray may deliver those out of order, so they wait for their clock
        instead) or a push at the restored clock (a read not ahead of it is served and leaves
        the worker to replay: it may come from a client that is not the worker's own)."""
        self._check_secret(secret, "step")
        if self.backups.error is not None:
            raise RuntimeError(self.backups.error)
        shard = self.shard
        worker, clock = call.worker, call.clock
        shard.clocks.check_worker(worker)
        restored: int | None = None
        if worker in self._awaiting_replay:
            held = shard.clocks.pushed[worker]
            if not call.recovering and clock > held:
                raise ShardRestarted(shard.shard_id, worker, held)
            if call.recovering or (clock == held and call.pushes is not None):
                self._awaiting_replay.discard(worker)
            if not call.recovering and call.pushes is not None:
                # (the backup held every push before this one, so its client, which may never
                # have seen a call fail, has nothing to replay: the reply tells it of the restart)
                restored = held
            # (else a read: served, but it may come from a client that is not the worker's
            # own, as the launching client's at clock 0 is, even where the backup holds the
            # worker at clock 0; the worker's own shows it has nothing to replay at its push)
        if call.pushes is not None:
            await self._wait(
                lambda: shard.clocks.pushed[worker] >= clock,
                f"worker {worker}'s push for clock {clock}",
            )
            # (a push applies the pending pushes of its clock too, and may start a backup)
            pushed = {n for pending in shard._pending.values() for n in pending}
            await self._swap_clear(pushed.union(call.pushes), backup=self.backups.due())
            if shard.clocks.can_push(worker, clock):
                before = shard.clocks.applied if shard.clocks.bsp else -1
                t0 = time.perf_counter()
                shard.push(worker, clock, call.pushes, call.step, call.checked)
                self._served["step_s"] += time.perf_counter() - t0
                if shard.clocks.applied != before:
                    self.backups.after_update()
                await self._notify()
            # else: a duplicate of a push already applied (a retried call): ignore it.
            clock += 1
        backed_up = self.backups.clocks[worker]
        self._served["steps"] += 1
        if not call.pulls:
            return StepResult(None, backed_up, restored=restored)
        pull_clock = call.pull_clock
        if pull_clock is not None and pull_clock > clock:
            await self._wait(
                lambda: shard.clocks.can_prefetch(pull_clock),
                f"worker {worker}'s prefetch for clock {pull_clock}",
            )
        else:
            await self._wait(
                lambda: shard.clocks.can_pull(worker, clock),
                f"worker {worker}'s pull at clock {clock}",
            )
        await self._swap_clear(call.pulls)
        t0 = time.perf_counter()
        rows = shard.pull(call.pulls, call.checked)
        self._served["step_s"] += time.perf_counter() - t0
        return StepResult(rows, backed_up, restored=restored)

    async def clock_of(self, worker: int) -> int:
        """The next clock this shard expects from ``worker`` (after a restart: the backup's)."""
        return self.shard.clocks.pushed[worker]

    async def catch_up(self, worker: int, clock: int, secret: Any = "") -> int:
        """``worker``'s client, whose pushes are all answered, made ``clock`` of them: the
        next clock this shard expects from it. Equal, the worker has nothing to replay (after
        a restart: its backup held every push), and saves no longer wait for it; lower, the
        client replays its pushes from there (:meth:`step`, ``call.recovering``)."""
        self._check_secret(secret, "catch_up")
        self.shard.clocks.check_worker(worker)
        held = self.shard.clocks.pushed[worker]
        if held == clock:
            self._awaiting_replay.discard(worker)
        return held

    async def swap(
        self,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
        secret: Any = "",
    ) -> tuple[int, dict[str, np.ndarray]]:
        """A worker's device tier: write back its evicted rows, read its misses (whole rows,
        optimizer state included; :meth:`ParameterShard.swap`). Returns this process's id
        with the rows: a tier that sees it change knows the shard restarted from a backup
        that may predate its write-backs.

        On the swaps' thread (:mod:`angelps.server.shard_swap`): meanwhile the event loop
        serves other calls (the worker's step call for its dense tables, on its own
        connection, need not wait for the swap) but those of the swap's tables. Saves, loads
        and backups wait for the swaps in progress."""
        self._check_secret(secret, "swap")
        rows, rest = await self._swap_reads(writes, reads)
        await rest()
        return os.getpid(), rows

    async def run_backup(self, secret: Any = "") -> list[int]:
        self._check_secret(secret, "run_backup")
        await self.backups.written()
        async with self._swapping():
            return self.backups.write_now()

    async def stop_backups(self, secret: Any = "") -> None:
        """The job is ending: write no more backups and stop the one being written (its
        client removes the launch's backups next), and a checkpoint's files being written in
        the background."""
        self._check_secret(secret, "stop_backups")
        await self.saves.stop()
        await self.backups.stop()

    async def stats(self) -> dict[str, Any]:
        st = self.shard.stats()
        st["restarted"] = self.restarted
        st["backup_clocks"] = list(self.backups.clocks)
        st["backups"] = self.backups.stats()  # (written by this process since its start)
        st["pid"] = os.getpid()  # (operators and chaos tests find the process by it)
        # The data plane: connections open now, refused over the cap, dropped (no token in
        # time, a wrong token, a frame over the limits).
        st["connections"] = dict(self._conns, cap=self._max_connections)
        # The calls served since this process started and their rows' work in seconds
        # (bench/train_throughput.py reports it per update: a shard's busy share of a step).
        st["served"] = dict(self._served)
        return st

    async def save(
        self, root: str, secret: Any = "", background: bool = False
    ) -> dict[str, Any] | None:
        """Write this shard's part of a checkpoint under ``root``: its manifest info; with
        ``background``, start it from a copy made now and answer None (:meth:`saved` waits
        for the files, :mod:`angelps.server.shard_saves`)."""
        self._check_secret(secret, "save")
        if self._awaiting_replay:
            # (restored from a backup: the pushes since are still in the workers' logs)
            waiting = sorted(self._awaiting_replay)
            pushed = self.shard.clocks.pushed
            raise NotReplayed(self.shard.shard_id, waiting, [pushed[w] for w in waiting])
        async with self._swapping():  # (a tier's rows written back whole, not half a swap)
            if not background:
                return self.shard.save(root)
            self.saves.start(root)
        return None

    async def saved(self, secret: Any = "") -> dict[str, Any]:
        """The manifest info of the checkpoint written in the background, once written."""
        self._check_secret(secret, "saved")
        if self.restarted and not self.saves.started:
            # (the save began in the process Ray replaced: its copy and files went with it)
            raise SaveLost(self.shard.shard_id)
        return await self.saves.result()

    async def mark_tiers(self, names: Sequence[str], secret: Any = "") -> None:
        """The tables held in workers' device tiers: left out of backups from now on."""
        self._check_secret(secret, "mark_tiers")
        self.shard.unbacked = set(names) & set(self.shard.tables)

    async def pid(self) -> int:
        """This process's id (a device tier's check that no shard restarted under it)."""
        return os.getpid()

    async def load(
        self, root: str, manifest: Mapping[str, Any], secret: Any = ""
    ) -> tuple[int, dict[str, int]]:
        """Restore a checkpoint (:meth:`ParameterShard.load`): this process's id (the one a
        device tier must find serving it next) and the rows restored per table."""
        self._check_secret(secret, "load")
        await self.backups.written()
        async with self._swapping():
            restored = self.shard.load(root, manifest)
        self.backups.clocks = [0] * self.shard.clocks.num_workers
        self._awaiting_replay.clear()
        if self.backups.dir:
            self.backups.write_now()  # a restart comes back to the loaded model, not before it
        await self._notify()
        return os.getpid(), restored

    async def ping(self) -> int:
        return self.shard.shard_id

    def _check_secret(self, secret: Any, method: str) -> None:
        """Refuse a call that reads or writes rows unless it carries the job's secret (the
        data-plane token, known only to the job's clients): anyone else who reaches the Ray
        cluster (the user's Ray token is shared by every job of that user) cannot read, write,
        save or load this shard's rows. A shard launched without a token checks nothing."""
        if secret is _AUTHENTICATED or not self._token:
            return
        if isinstance(secret, str) and hmac.compare_digest(secret.encode(), self._token):
            return
        raise PermissionError(
            f"parameter shard {self.shard.shard_id}: {method}() refused: the call does not "
            "carry this job's secret (only the job's own clients may read or write its rows)"
        )
