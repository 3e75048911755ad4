"""The bookkeeping of a device tier (learners/worker/device_tier.py): its policy and counts,
the id -> slot indexes, the choice of rows to evict, and the small helpers its book and its
tables share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from angelps.client.tier_swap import SwapFuture
from angelps.dedup import strictly_increasing
from angelps.storage.index import DirectIndex, HashIndex
from learners.worker.device import RowBlock

__all__ = [
    "DIRECT_MAX",
    "DirectSlots",
    "HashSlots",
    "IdCounts",
    "Source",
    "TierCounts",
    "TierPolicy",
    "ids_of",
    "lru_victims",
    "request_ids",
    "same",
    "smallest",
    "sorted_ids",
    "split_misses",
    "staged_source",
]

#: A staged read's source: the slots to take, the misses' positions, the misses' swap, and the
#: first two on the device (None where rows move by host slots)
Source = tuple[np.ndarray, np.ndarray, SwapFuture, tuple[Any, Any]]


@dataclass(frozen=True)
class TierPolicy:
    """How a tier chooses the rows it keeps: ``eviction`` lru or lfu; ``admit``: the times an
    id must have been seen before its row is kept in preference to others."""

    eviction: str = "lru"
    admit: int = 1


@dataclass
class TierCounts:
    """A tier's traffic since the last :meth:`TierTable.take_counts`."""

    lookups: int = 0  # unique ids read
    hits: int = 0  # of them already on the device
    misses: int = 0  # fetched from the shards
    writebacks: int = 0  # evicted rows written back to the shards
    #: seconds the training thread waited for the tier's work elsewhere: the shards' rows and
    #: write-backs, the update thread making room and placing (after the update itself)
    wait_s: float = 0.0
    #: of :attr:`wait_s`, the seconds it waited for the shards' answers itself (the rest: for
    #: the update thread, which may have been waiting for them in turn)
    wait_shards_s: float = 0.0
    #: seconds the update thread waited for the shards' answers while it asked ahead and placed
    #: (beside the training thread: a wait only where that thread then waited for it)
    ahead_wait_s: float = 0.0
    #: seconds the training thread waited for the update thread to have run the update before
    #: (one worker: that thread's queue up to it, the tier's work before it included)
    wait_update_s: float = 0.0

    def add(self, other: TierCounts) -> None:
        self.lookups += other.lookups
        self.hits += other.hits
        self.misses += other.misses
        self.writebacks += other.writebacks
        self.wait_s += other.wait_s
        self.wait_shards_s += other.wait_shards_s
        self.ahead_wait_s += other.ahead_wait_s
        self.wait_update_s += other.wait_update_s


#: The largest id range a tier indexes with a plain array (int32 slots: 128 MiB at most);
#: above it, and for tables of unknown range, a hash table.
DIRECT_MAX = 1 << 25


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class IdCounts:
    """How often each id was read (``lfu`` and admission): by id where the table's id range
    (``rows``) is no larger than the sketch would be, else hashed into 16 counters a row of
    ``capacity`` (2^16 to 2^24): at 4 the collisions of rare ids with hot ones cost the
    power-law feed suite most of what frequency gains over recency (hit rate 45.3% against
    53.3% exact, a replay of its batches; docs/device-tier.md). The counts halve when they
    have counted 10x their number, so that old popularity fades."""

    def __init__(self, rows: int, capacity: int) -> None:
        sketch = 1 << min(24, max(16, int(16 * capacity - 1).bit_length()))
        self.exact = 0 < rows <= sketch
        self.table = np.zeros(rows if self.exact else sketch, dtype=np.uint32)
        self._shift = np.uint64(64 - (sketch.bit_length() - 1))
        self._seen = 0

    def _hash(self, keys: np.ndarray) -> np.ndarray:
        """The counter of each key (the key itself when counts are exact)."""
        if self.exact:
            return keys
        return ((keys.view(np.uint64) * _GOLDEN) >> self._shift).astype(np.int64)

    def add(self, keys: np.ndarray) -> None:
        """Count one sighting of each (unique) key."""
        self.table[self._hash(keys)] += 1
        self._seen += len(keys)
        if self._seen >= 10 * len(self.table):  # age: old counts fade
            self.table >>= 1
            self._seen = 0

    def of(self, keys: np.ndarray) -> np.ndarray:
        """The counts of ``keys``."""
        return self.table[self._hash(keys)]


class DirectSlots(DirectIndex):
    """id -> slot over the table's whole id range (a shard's direct index, from 0), with
    removal: a lookup is a gather, 20x faster than the hash table's at a batch of 60k ids."""

    def __init__(self, rows: int) -> None:
        super().__init__(0, rows)

    def remove(self, keys: np.ndarray) -> None:
        self.index[keys] = 0  # (the direct index stores slot + 1: 0 is "not held")


class HashSlots:
    """id -> slot in a hash table (any int64 id). Ids removed stay in it (a slot's id tells a
    stale entry from a live one; khash has no removal) until it holds 4x the capacity, when it
    is rebuilt from the live rows."""

    def __init__(self, capacity: int, key_at: np.ndarray, live: np.ndarray) -> None:
        self.capacity = capacity
        self.key_at, self.live = key_at, live
        self.table = HashIndex(capacity)
        self.entries = 0

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        slots = self.table.lookup(keys)
        ok = slots >= 0
        s = np.where(ok, slots, 0)
        ok &= self.live[s] & (self.key_at[s] == keys)
        return np.where(ok, slots, -1)

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        if self.entries + len(keys) > 4 * self.capacity:
            live = np.flatnonzero(self.live)
            self.table = HashIndex(2 * self.capacity)
            self.table.insert(self.key_at[live], live)
            self.entries = len(live)
            return
        self.table.insert(keys, slots)  # (overwrites the stale entry of an id held before)
        self.entries += len(keys)

    def remove(self, keys: np.ndarray) -> None:
        """Nothing: ``live`` says the slot is free."""


def smallest(score: np.ndarray, k: int) -> np.ndarray:
    """Positions of ``k`` smallest of ``score`` (ties by position). The scores are clocks or
    counts, a small range of integers: a counting selection there (``argpartition`` is slow on
    so many ties: 10 ms for 100k rows)."""
    low = int(score.min())
    shifted = score - low
    if int(shifted.max()) >= 1 << 22:
        return np.argpartition(score, k - 1)[:k]
    cum = np.cumsum(np.bincount(shifted))
    edge = int(np.searchsorted(cum, k))  # the score at which the k-th smallest lies
    below = np.flatnonzero(shifted < edge)
    at = np.flatnonzero(shifted == edge)[: k - len(below)]
    return np.concatenate([below, at])


def lru_victims(used: np.ndarray, below: int, k: int) -> np.ndarray:
    """The slots of the ``k`` rows read longest ago among those whose clock in ``used`` (every
    slot's) is below ``below``, all of them if fewer: :func:`smallest` of those clocks, ties by
    slot, in its order, from one histogram of every slot's clock rather than a gather of the
    old rows' clocks first (a full tier's eviction, the usual one)."""
    low = int(used.min())
    if low >= below:
        return np.zeros(0, dtype=np.int64)
    if below - low >= 1 << 22:  # (clocks too far apart for a histogram)
        old = np.flatnonzero(used < below)
        return old[smallest(used[old], k)] if k < len(old) else old
    shifted = used - low
    cum = np.cumsum(np.bincount(shifted, minlength=below - low)[: below - low])
    if k >= int(cum[-1]):
        return np.flatnonzero(shifted < below - low)
    edge = int(np.searchsorted(cum, k))  # the clock (shifted) at which the k-th oldest lies
    lower = np.flatnonzero(shifted < edge)
    at = np.flatnonzero(shifted == edge)[: k - len(lower)]
    return np.concatenate([lower, at])


def ids_of(keys: np.ndarray | Tensor) -> np.ndarray:
    if isinstance(keys, Tensor):
        return keys.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.ascontiguousarray(keys, dtype=np.int64)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (len(a) == len(b) and np.array_equal(a, b))


def sorted_ids(keys: np.ndarray | Tensor) -> np.ndarray:
    ids = ids_of(keys)
    return ids if strictly_increasing(ids) else np.unique(ids)


def request_ids(asked: list[np.ndarray | Tensor]) -> np.ndarray | None:
    """The unique ids of a book's tables in a request (``asked``: their key arrays; the
    union where they differ: tables keyed alike are read with the same ids), None for none."""
    if not asked:
        return None
    ids = sorted_ids(asked[0])
    for other in asked[1:]:
        if other is not asked[0]:
            ids = np.union1d(ids, ids_of(other))
    return ids


def split_misses(slots: np.ndarray, pos: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``slots`` (-1: not held) as a read assembles them: every slot to take (a miss's slot 0,
    its row replaced) and the positions of the misses (ascending; ``pos``: found already)."""
    return np.maximum(slots, 0), np.flatnonzero(slots < 0) if pos is None else pos


def staged_source(
    rows: RowBlock, slots: np.ndarray, fut: SwapFuture, pos: np.ndarray | None = None
) -> Source:
    """The source of a staged read of ``slots`` whose misses (at ``pos``, where found already)
    come with ``fut``; its slots go up to the device once, for every table of the book
    (``rows``: one table's)."""
    take, pos = split_misses(slots, pos)
    return take, pos, fut, (rows.slots(take), rows.slots(pos))
