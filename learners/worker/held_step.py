"""A worker's side of the tables the workers hold (``angel.sparse.placement=worker``): the
:class:`HoldsTables` part of :class:`learners.worker.train_worker.TrainWorker` (the tables themselves and
their exchanges: learners/worker/held_tables.py, learners/worker/table_exchange.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from angelps import TableSpec
from learners.data import Batch
from learners.job.loop_options import TrainPlan
from learners.models.table_decl import TableDecl
from learners.worker import tier_routes
from learners.worker.batch_rows import BatchInput
from learners.worker.device import free_bytes
from learners.worker.device_step import SideStream, dedup_on_device
from learners.worker.device_tier import TierPolicy
from learners.worker.held_save import HeldSaves
from learners.worker.held_tables import HeldTables
from learners.worker.step_stats import RowMap, StepStats

__all__ = ["HoldsTables", "Peeked"]

#: Agree on the number of prediction chunks, and take part in one exchange without rows.
Rounds = tuple[Callable[[int], int], Callable[[], None]]
#: A batch taken ahead: the batch, its slots and request (BatchInput.request), and whether its
#: device tiers' misses were asked for.
Peeked = tuple[Batch, Any, Any, bool]
#: Whether one worker's device tiers ask the shards for the misses of the batch after the next
#: as soon as an update's reads are done (the update's forward and backward then hide the
#: round trip), rather than once the update is handed over (tests switch it off to compare).
ASK_AHEAD = True


class HoldsTables:
    """The held tables of one worker: set up, read into a batch's rows, saved and loaded."""

    plan: TrainPlan
    worker_id: int
    num_workers: int
    device: torch.device
    held: HeldTables
    ps: Any
    inputs: BatchInput
    tables: list[TableDecl]
    _peeked: Peeked | None
    _side: SideStream
    _next_batch: Callable[[], Batch]
    #: the held tables' checkpoint writes in the background (made at the first)
    _held_saves: HeldSaves | None = None

    def hold_tables(
        self,
        specs: Sequence[TableSpec],
        partitioner: str,
        tiers: Mapping[str, int] | None = None,
        eviction: str = "lru",
        admit: int = 1,
    ) -> int:
        """Hold this worker's share of ``specs`` (the partitioner's ``W``-owner split, on
        this worker's device); ``tiers``: the tables of those held in a device tier over the
        shards, with the rows it keeps on the device (learners/worker/device_tier.py). The
        bytes it takes."""
        self.held = HeldTables(
            specs,
            self.worker_id,
            self.num_workers,
            partitioner,
            self.device,
            self.plan.collective,
            tiers,
            TierPolicy(eviction, admit),
            lambda: self.ps,  # (attached after the tables are held, and again at a restore)
        )
        sparse = {t.name for t in self.tables if t.sparse}
        self.inputs.on_device = dedup_on_device(
            self.plan.feed.dedup, self.device, self.num_workers, sparse, self.held.names
        )
        # (a device tier's index is on the host: its ids come down once a batch)
        self.inputs.host_ids = frozenset(self.held.tiers)
        return self.held.nbytes()

    def _from_ps(self, req: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The part of a request that the shards serve."""
        return {k: v for k, v in req.items() if k not in self.held}

    def _with_held(self, pulled: RowMap, req: Mapping[str, np.ndarray]) -> RowMap:
        """``pulled`` (the shards' rows) with the held tables' rows of ``req``."""
        if not self.held:
            return pulled
        return {**pulled, **self.held.rows(req)}

    def _held_rows(self, pulled: RowMap, req: Mapping[str, np.ndarray], stats: StepStats) -> RowMap:
        """:meth:`_with_held` in a training step: the time of an exchange with the other
        workers is ``pull_s``; one worker's read of its own rows is local work (``compute_s``)."""
        t0 = time.perf_counter()
        out = self._with_held(pulled, req)
        if self.num_workers > 1:
            stats.pull_s += time.perf_counter() - t0
        else:
            stats.compute_s += time.perf_counter() - t0
        return out

    def _peek(self) -> Any:
        """Device tiers, the batch after the next one of this epoch: take it and its ids now,
        so that one worker asks for its misses while the next update computes
        (:meth:`_ask_ahead`), and several route them to their owners with the next batch's
        (every worker peeks alike: learners/worker/tier_routes.py); ``_next_batch`` and the
        next fetch take it from there. Its request (None: none taken)."""
        alone = self.num_workers == 1
        if (
            ASK_AHEAD
            and (alone or tier_routes.ROUTE_AFTER)
            and self.plan.accum == 1
            and self.held.books
        ):
            batch = self._next_batch()
            with self._side.scope():
                slots, req = self.inputs.request(batch)
            self._peeked = (batch, slots, req, False)
            return req
        return None

    def _prefetch_held(self, req: Any, peek: bool) -> bool:
        """Start the device tiers' prefetch of the next batch's ``req``; with ``peek``, take
        the batch after now (:meth:`_peek`) and ask for its misses with it where the next
        one's were asked for ahead (two swaps in flight: learners/worker/held_tables.py).
        False: no peek is left to make after it."""
        after = self._peek() if peek else None
        if self.held.prefetch(req, after) and self._peeked is not None:
            self._peeked = (*self._peeked[:3], True)
        return False

    def _take_next(self) -> tuple[Batch, Any, Any]:
        """The next batch, its slots and request: the peeked one, or the iterator's."""
        peeked, self._peeked = self._peeked, None
        if peeked is not None:
            return peeked[:3]
        batch = self._next_batch()
        with self._side.scope():
            slots, req = self.inputs.request(batch)
        return batch, slots, req

    def _ask_ahead(self) -> None:
        """An update's reads are done: ask the shards for the peeked batch's misses."""
        peeked = self._peeked
        if peeked is not None and not peeked[3]:
            self.held.ask_ahead(peeked[2])
            self._peeked = (*peeked[:3], True)

    def _tier_stats(self, stats: StepStats) -> None:
        """The device tiers' reads, hits, misses and write-backs of a chunk into ``stats``."""
        if self.held.tiers:
            tc = self.held.tier_counts()
            stats.tier_on, stats.tier_lookups, stats.tier_hits = True, tc.lookups, tc.hits
            stats.tier_misses, stats.tier_writebacks = tc.misses, tc.writebacks
            stats.tier_wait_s, stats.tier_wait_shards_s = tc.wait_s, tc.wait_shards_s
            stats.tier_ahead_wait_s, stats.tier_wait_update_s = tc.ahead_wait_s, tc.wait_update_s

    def _rounds(self) -> Rounds | None:
        """With tables held by several workers, each chunk of a prediction is a collective:
        every worker runs as many as the one with the most chunks (None: no need)."""
        if not self.held or self.num_workers == 1:
            return None

        def agree(n: int) -> int:
            on = self.device if self.plan.collective == "nccl" else torch.device("cpu")
            t = torch.tensor([n], dtype=torch.int64, device=on)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return int(t[0])

        return agree, self.held.idle

    def device_free_bytes(self) -> int:
        """Free memory of this worker's device: the GPU's, or its part of the host's available
        memory (split between the job's workers, which may share the host)."""
        free = free_bytes(self.device)
        return free if self.device.type == "cuda" else free // max(self.num_workers, 1)

    def before_save(self) -> int:
        """Before a checkpoint: write the device tiers' rows back to the shards, and make the
        shards hold every push of this worker (a shard restarted since the last step gets
        them replayed: PSClient.catch_up); the tiers' rows written."""
        if self.ps is not None:
            self.ps.catch_up()
        return self.held.flush_tiers()

    def reset_tiers(self) -> None:
        """Empty the device tiers (the shards were restored)."""
        self.held.reset_tiers()

    def save_held(self, root: str, background: bool = False) -> dict[str, Any] | None:
        """Write this worker's share of the held tables under ``root`` (a checkpoint's
        temporary directory); the files' manifest entries. ``background``: copy them now,
        write the copy in a thread and answer None (:meth:`held_saved` gives the entries;
        learners/worker/held_save.py)."""
        if not background:
            return self.held.save(root)
        if self._held_saves is None:
            self._held_saves = HeldSaves(self.worker_id)
        self._held_saves.start(root, self.held)
        return None

    def held_saved(self, wait: bool = False) -> dict[str, Any] | None:
        """The manifest entries of the held tables' files written in the background, or None
        while they are being written (``wait``: until they are)."""
        if self._held_saves is None:
            raise RuntimeError(f"worker {self.worker_id}: no checkpoint is being written")
        return self._held_saves.result(wait)

    def load_held(self, root: str, manifest: Mapping[str, Any]) -> dict[str, int]:
        """Restore the held tables from the checkpoint at ``root`` (``manifest``: its
        manifest); the rows this worker restored per table."""
        return self.held.load(root, manifest)
