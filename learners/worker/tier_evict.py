"""A device tier's eviction (learners/worker/device_tier.py): which rows leave the device when
the prefetched misses need their slots, and their rows taken down to go back to the shards.
Recency (``lru``: the rows read longest ago) or frequency (``lfu``: the ids seen least often);
rows not admitted first; rows pinned (read by the update in progress or asked for by the next
read) never."""

from __future__ import annotations

from typing import Any

import numpy as np

from angelconf.config import ConfigError
from learners.worker.tier_link import Ready, TierLink
from learners.worker.tier_slots import (
    DirectSlots,
    HashSlots,
    IdCounts,
    TierPolicy,
    lru_victims,
    smallest,
)

__all__ = ["TierEvictions"]


class TierEvictions:
    """The eviction half of :class:`learners.worker.device_tier.TierBook` (its state, kept
    there)."""

    label: str
    capacity: int
    policy: TierPolicy
    tables: dict[str, Any]
    link: TierLink
    seen: IdCounts
    index: DirectSlots | HashSlots
    key_at: np.ndarray
    live: np.ndarray
    used: np.ndarray
    rare: np.ndarray
    free: np.ndarray
    n_free: int
    _clock: int
    _floor: int
    _room: int

    def slots_on(self, slots: np.ndarray) -> Any: ...

    def make_room(self, soon: np.ndarray | None = None) -> None:
        """Free the slots the prefetched misses need, among the rows the next read does not
        read (the update in progress must be applied: its rows may go); the victims go back
        with the tier's next swap. One CPU worker runs this in its update thread, after the update
        (learners/worker/held_tables.py), while the next batch is prepared. ``soon``: the ids
        of the read after the next one (asked for next), whose rows held go last."""
        need, self._room = self._room - self.n_free, 0
        if need <= 0:
            return
        keep = None
        if soon is not None and len(soon):
            keep = self.index.lookup(soon)
            keep = keep[keep >= 0]
        victims = self._choose(need, self._clock, keep)
        if len(victims):
            keys, blocks, ready = self._release(victims, wait=False)
            self.link.write_back({n: (keys, b) for n, b in blocks.items()}, ready)

    def _choose(self, need: int, below: int, keep: np.ndarray | None = None) -> np.ndarray:
        """The slots of ``need`` rows or more to evict (as many as there are, if fewer), among
        those last read before clock ``below``: the least recently or frequently used, rows
        not admitted first, the slots ``keep`` (rows a read after the next one reads) last.

        Without ``keep`` about one row in eight evicted went back in the same swap that asked
        for it again (the feed suite, a tier of 10%: the read after the next one was asked
        for right after this eviction); they are not pinned, so a tier that needs their slots
        still has them."""
        if keep is not None and len(keep):
            if self.policy.eviction == "lru":
                # (as recent as the rows of the update just applied: the last of the rows
                # that may go; the ask that follows sets their clock to its own)
                self.used[keep] = np.maximum(self.used[keep], below - 1)
                keep = None
        if (
            keep is None
            and self.n_free == 0
            and self.policy.eviction == "lru"
            and self.policy.admit <= 1
        ):
            return lru_victims(self.used, below, max(need, self.capacity // 64))
        old = self.used < below
        # (a full tier, the usual case at an eviction: every slot is live)
        free = np.flatnonzero(old if self.n_free == 0 else old & self.live)
        if not len(free):
            return free
        if self.policy.eviction == "lfu":
            score = self.seen.of(self.key_at[free]).astype(np.int64)
        else:
            score = self.used[free]
        if self.policy.admit > 1:  # (no row is marked rare otherwise)
            score = np.where(self.rare[free], score.min(initial=0) - 1, score)
        if keep is not None and len(keep):
            soon = np.zeros(len(self.used), dtype=bool)
            soon[keep] = True
            score = np.where(soon[free], score.max(initial=0) + 1, score)
        # Evict a little more than needed, so that steps do not each pay a selection.
        k = min(len(free), max(need, self.capacity // 64))
        return free[smallest(score, k)] if k < len(free) else free

    def _release(
        self, victims: np.ndarray, wait: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Ready]:
        """Free the slots ``victims``: their keys and whole rows of each table, to write
        back, and the CUDA event to wait for before reading the rows (None: ready; always so
        with ``wait``). Their copy down is queued after every update queued so far, so no
        later write of their slots (a placement) can reach it."""
        blocks: dict[str, np.ndarray] = {}
        ready: Ready = None
        on = self.slots_on(victims)
        for n, t in self.tables.items():
            blocks[n], ready = t.rows.take_host_async(victims, on)
        if wait and ready is not None:
            ready.synchronize()
            ready = None
        keys = self.key_at[victims]
        self.index.remove(keys)
        self.live[victims] = False
        self.rare[victims] = False
        self.free[self.n_free : self.n_free + len(victims)] = victims
        self.n_free += len(victims)
        for t in self.tables.values():
            t.counts.writebacks += len(keys)
        return keys, blocks, ready

    def _evict(self, need: int) -> tuple[np.ndarray, dict[str, np.ndarray], Ready]:
        """Free ``need`` slots or more, never of a row pinned (read by the update in
        progress): the evicted keys and their whole rows of each table, to write back."""
        victims = self._choose(need, self._floor)
        if need > len(victims):
            live = int(self.live.sum())
            # (the rows this update reads: those held (pinned) and those to place)
            reads = live - len(victims) + need + self.n_free
            raise ConfigError(
                f"table {self.label}: its device tier of {self.capacity} rows "
                f"(angel.worker.table.capacity) is below the {reads} rows one update reads on "
                "this worker; raise it (or lower the batch size)"
            )
        return self._release(victims)  # (waited for: these rows may be sent at once)
