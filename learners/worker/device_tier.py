"""A device tier over the shards: a worker keeps at most ``capacity`` rows of its share of a
sparse table on its device, and the rest of that share lives on the shard actors (host
memory); ``angel.sparse.placement=worker`` with ``angel.worker.table.capacity``.

The owner (the worker the table's partitioner assigns a row to, as for tables held whole,
learners/worker/held_tables.py) is the only writer of its rows: a row it holds is read and
updated on the device with the table's optimizer (:func:`angelps.optim.apply`, the shards'
code); a miss is fetched from the shards with its optimizer state (a shard creates it then, as
a pull does), and an evicted row is written back with its state
(:func:`angelps.client.tier_swap.swap_async`: one call per shard writes the step's evictions
and reads its misses). So training is exactly that of the table held whole, whatever the
budget (BSP).

Policy. Eviction by recency (``lru``: the rows read longest ago go first) or by frequency
(``lfu``: the rows whose ids were seen least often, counted in a small hashed sketch that halves
its counts as it fills); rows of the update in progress are never evicted. Admission
(``angel.worker.table.admit.count`` = c): a miss seen fewer than c times is fetched and
updated like any row but goes first at the next eviction, so rare ids do not push out hot
ones. docs/device-tier.md has the measurement behind the defaults.

The index (id -> slot) is a hash table on the host: a miss must come from the host anyway.
Evicted ids stay in it (their slot's id tells a stale entry from a live one) until it holds 4x
the capacity, when it is rebuilt from the live rows, so an eviction never moves rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from angelconf.config import ConfigError
from angelps import TableSpec
from angelps.client.tier_swap import SwapFuture, TierLost
from angelps.dedup import strictly_increasing
from angelps.optim import apply, slot_widths
from angelps.partition import Partitioner
from angelps.rates import Step, rate_of
from angelps.storage.index import HashIndex
from learners.worker.device import to_device

__all__ = ["TierCounts", "TierPolicy", "TierTable"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class Shards(Protocol):
    """What a tier needs of the worker's PS client (angelps.client.ps_client.PSClient)."""

    def swap_async(
        self,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
    ) -> SwapFuture: ...


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

    def add(self, other: TierCounts) -> None:
        self.lookups += other.lookups
        self.hits += other.hits
        self.misses += other.misses
        self.writebacks += other.writebacks


#: The largest id range a tier indexes with a plain array (int32 slots: 128 MiB at most);
#: above it, and for tables of unknown range, a hash table.
DIRECT_MAX = 1 << 25


class _DirectSlots:
    """id -> slot as an int32 array over the table's id range (-1: not held): a lookup is a
    gather, 20x faster than the hash table's at a batch of 60k ids."""

    def __init__(self, rows: int) -> None:
        self.where = np.full(rows, -1, dtype=np.int32)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        return self.where[keys].astype(np.int64)

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        self.where[keys] = slots

    def remove(self, keys: np.ndarray) -> None:
        self.where[keys] = -1


class _HashSlots:
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


def _smallest(score: np.ndarray, k: int) -> np.ndarray:
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


def _torch_dtype(spec: TableSpec) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(spec.dtype))).dtype


def _ids(keys: np.ndarray | Tensor) -> np.ndarray:
    if isinstance(keys, Tensor):
        return keys.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.ascontiguousarray(keys, dtype=np.int64)


class TierTable:
    """At most ``capacity`` rows of one worker's share of a table, on ``device``, over the
    shards that hold the whole table (``shards``: a function giving the worker's PS client,
    which is attached after the tier is made)."""

    def __init__(
        self,
        spec: TableSpec,
        part: Partitioner,
        owner: int,
        device: torch.device,
        capacity: int,
        policy: TierPolicy,
        shards: Any,
    ) -> None:
        if capacity < 1:
            raise ValueError(
                f"table {spec.name!r}: a device tier needs a capacity of 1 row or more"
            )
        self.spec = spec
        self.part = part
        self.owner = owner
        self.device = device
        self.capacity = int(capacity)
        self.policy = policy
        self._shards = shards
        self.cols = spec.cols
        self.slots: dict[str, tuple[int, int]] = {}
        c = spec.cols
        for k, width in slot_widths(spec.optimizer, spec.cols).items():
            self.slots[k] = (c, c + width)
            c += width
        self.width = c
        self.data = torch.zeros(
            (self.capacity, self.width), dtype=_torch_dtype(spec), device=device
        )
        sketch = 1 << max(16, int(4 * self.capacity - 1).bit_length())
        self._freq = np.zeros(sketch, dtype=np.uint32)
        self._shift = np.uint64(64 - (sketch.bit_length() - 1))
        self._seen = 0
        self.counts = TierCounts()
        self._clock = 1  # one per update: rows read in the current one are pinned
        self._pending: tuple[np.ndarray, SwapFuture] | None = None
        self._pids: dict[int, int] = {}
        self._writes: list[SwapFuture] = []
        #: bytes exchanged with the shards: ids and rows sent, rows received
        self.bytes_moved = 0
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self._read: tuple[np.ndarray, np.ndarray] | None = None
        #: False while validating or predicting (learners/worker/held_tables.py)
        self.training = True
        self.reset()

    def reset(self) -> None:
        """Hold nothing (after a restore: the shards have the rows)."""
        self.settle_writes()
        self._pending = None
        self._read = None
        self.key_at = np.zeros(self.capacity, dtype=np.int64)
        self.live = np.zeros(self.capacity, dtype=bool)
        self.index: _DirectSlots | _HashSlots
        if 0 < self.spec.rows <= DIRECT_MAX:
            self.index = _DirectSlots(self.spec.rows)
        else:
            self.index = _HashSlots(self.capacity, self.key_at, self.live)
        self.used = np.zeros(self.capacity, dtype=np.int64)  # the clock of a row's last read
        self.rare = np.zeros(self.capacity, dtype=bool)  # not admitted: evicted first
        self.free = np.arange(self.capacity - 1, -1, -1, dtype=np.int64)  # a stack
        self.n_free = self.capacity

    def nbytes(self) -> int:
        return int(self.data.numel() * self.data.element_size())

    def rows_held(self) -> int:
        return self.capacity - self.n_free

    # --- lookups -----------------------------------------------------------------------------

    def _hash(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.view(np.uint64) * _GOLDEN) >> self._shift).astype(np.int64)

    def _see(self, keys: np.ndarray) -> np.ndarray:
        """Count one sighting of each (unique) key in the sketch; their counts."""
        h = self._hash(keys)
        self._freq[h] += 1
        self._seen += len(keys)
        if self._seen >= 10 * len(self._freq):  # age: old counts fade
            self._freq >>= 1
            self._seen = 0
        return self._freq[h]

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slots of ``keys`` held now, -1 for the others."""
        if not len(keys):
            return np.zeros(0, dtype=np.int64)
        return self.index.lookup(keys)

    def _known(self, ids: np.ndarray) -> np.ndarray:
        """:meth:`_lookup` of ``ids``, or the slots a prefetch looked up for the same ids
        (nothing is placed or evicted between a prefetch and the read it prepares)."""
        read, self._read = self._read, None
        if read is not None and len(read[0]) == len(ids) and np.array_equal(read[0], ids):
            return read[1]
        return self._lookup(ids)

    def prefetch(self, keys: np.ndarray | Tensor) -> None:
        """Start fetching the rows of ``keys`` (the next batch's unique ids) that are not on
        the device, while the current step runs; the next :meth:`gather` takes them."""
        ids = _ids(keys)
        slots = self._lookup(ids)
        self._read = (ids, slots)
        miss = np.sort(ids[slots < 0])
        # A row evicted by the last read may be read again now: its write-back must land
        # first (a shard is an async actor: Ray does not keep the order of its calls).
        self.settle_writes()
        self._pending = (miss, self._swap({}, miss))

    def _swap(
        self, writes: Mapping[str, tuple[np.ndarray, np.ndarray]], reads: np.ndarray | None
    ) -> SwapFuture:
        """One swap with the shards (write ``writes`` back, read the whole rows of ``reads``),
        its bytes counted: ids and rows sent, and the rows that will come back."""
        ask = {} if reads is None else {self.spec.name: reads}
        for keys, block in writes.values():
            self.bytes_moved += int(keys.nbytes + block.nbytes)
        if reads is not None:
            row = self.width * self.data.element_size()
            self.bytes_moved += int(reads.nbytes) + len(reads) * row  # ids out, rows back
        return self._shards().swap_async(writes, ask)

    def settle_writes(self) -> None:
        """Wait for the write-backs still in flight (their errors, a shard's restart)."""
        writes, self._writes = getattr(self, "_writes", []), []
        for fut in writes:
            fut.result()
            self._check_restarts(fut)

    # --- the step ----------------------------------------------------------------------------

    def _evict(self, need: int) -> tuple[np.ndarray, np.ndarray]:
        """Free ``need`` slots or more (not of the update in progress): the evicted (keys,
        whole rows) to write back."""
        live = np.flatnonzero(self.live)
        pinned = self.used[live] == self._clock
        free = live[~pinned]  # (the rows this update reads stay)
        if need > len(free):
            # (the rows this update reads: those held (pinned) and those to place)
            reads = len(live) - len(free) + need + self.n_free
            raise ConfigError(
                f"table {self.spec.name!r}: angel.worker.table.capacity={self.capacity} rows is "
                f"below the {reads} rows one update reads on this worker; "
                "raise it (or lower the batch size)"
            )
        if self.policy.eviction == "lfu":
            score = self._freq[self._hash(self.key_at[free])].astype(np.int64)
        else:
            score = self.used[free]
        score = np.where(self.rare[free], score.min(initial=0) - 1, score)
        # Evict a little more than needed, so that steps do not each pay a selection.
        k = min(len(free), max(need, self.capacity // 64))
        victims = free[_smallest(score, k)] if k < len(free) else free
        block = self.data.index_select(0, to_device(victims, self.device)).cpu().numpy()
        keys = self.key_at[victims]
        self.index.remove(keys)
        self.live[victims] = False
        self.rare[victims] = False
        self.free[self.n_free : self.n_free + len(victims)] = victims
        self.n_free += len(victims)
        return keys, block

    def _fetch(self, miss: np.ndarray) -> np.ndarray:
        """Place the rows of ``miss`` (ids not on the device) in free slots, fetched from the
        shards (those prefetched taken as they are), evicting first when the tier is full;
        their slots."""
        writes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if len(miss) > self.n_free:
            keys, block = self._evict(len(miss) - self.n_free)
            writes[self.spec.name] = (keys, block)
            self.counts.writebacks += len(keys)
        got = np.empty((len(miss), self.width), dtype=np.dtype(self.spec.dtype))
        todo = np.ones(len(miss), dtype=bool)
        pending, self._pending = self._pending, None
        if pending is not None:
            # Rows prefetched for ids still missing are current: only their owner (this tier)
            # writes them, and it has not held them since the prefetch started.
            pkeys, fut = pending
            rows = fut.result()[self.spec.name]
            self._check_restarts(fut)
            pos = np.searchsorted(pkeys, miss) if len(pkeys) else np.zeros(len(miss), np.int64)
            pos = np.minimum(pos, max(len(pkeys) - 1, 0))
            hit = (pkeys[pos] == miss) if len(pkeys) else np.zeros(len(miss), bool)
            got[hit] = rows[pos[hit]]
            todo &= ~hit
        if todo.any():
            self.settle_writes()  # (rows written back earlier may be among these)
            fut = self._swap(writes, miss[todo])
            got[todo] = fut.result()[self.spec.name]
            self._check_restarts(fut)
        elif writes:
            # Write-backs alone are not waited for here: the next read from the shards waits
            # for them first (settle_writes), as it may ask for these rows again.
            self._writes.append(self._swap(writes, None))
        slots = self.free[self.n_free - len(miss) : self.n_free][::-1].copy()
        self.n_free -= len(miss)
        self.data.index_copy_(0, to_device(slots, self.device), to_device(got, self.device))
        self.key_at[slots] = miss
        self.live[slots] = True
        self.index.insert(miss, slots)
        return slots

    def _check_restarts(self, fut: SwapFuture) -> None:
        """A shard that answers from a new process was restarted from a backup, which may
        predate rows this tier wrote back to it: training cannot go on exactly."""
        for shard, pid in fut.pids.items():
            before = self._pids.setdefault(shard, pid)
            if before != pid:
                raise TierLost(
                    f"shard {shard} restarted and may have lost rows of table "
                    f"{self.spec.name!r} that this worker's device tier wrote back to it"
                )

    def _slots_of(self, ids: np.ndarray) -> Tensor:
        """Slots of the unique ``ids`` (fetched when missing), pinned for this update."""
        slots = self._known(ids)
        miss = slots < 0
        n_miss = int(miss.sum())
        self.counts.lookups += len(ids)
        self.counts.hits += len(ids) - n_miss
        self.counts.misses += n_miss
        if self.policy.admit > 1 or self.policy.eviction == "lfu":
            seen = self._see(ids)
        if n_miss:
            # pin the hits first: the eviction must not take a row this read also needs
            self.used[slots[~miss]] = self._clock
            new = self._fetch(ids[miss])
            slots[miss] = new
            if self.policy.admit > 1:
                self.rare[new] = seen[miss] < self.policy.admit
        self.used[slots] = self._clock
        self._last = (ids, slots)  # (the update of these ids needs no lookup)
        return to_device(slots, self.device)

    def gather(self, keys: np.ndarray | Tensor) -> Tensor:
        """The weights of ``keys`` (owned; repeated ids allowed: an owner serving several
        workers receives an id once from each that reads it), read once each on the host
        index (:meth:`_gather`)."""
        ids = _ids(keys)
        if strictly_increasing(ids):
            return self._gather(ids)
        uniq, inv = np.unique(ids, return_inverse=True)
        return self._gather(uniq).index_select(0, to_device(inv.reshape(-1), self.device))

    def _gather(self, ids: np.ndarray) -> Tensor:
        """The weights of owned unique ``keys`` (a new ``[k, cols]`` tensor). Outside training
        (:attr:`training` False: validation, prediction) nothing stays pinned between reads,
        and a read of more ids than the tier holds reads its misses through, unplaced."""
        if not self.training:
            self._clock += 1
            slots = self._lookup(ids)
            miss = slots < 0
            if int(miss.sum()) > self.capacity - int((~miss).sum()):
                self.settle_writes()
                fut = self._swap({}, ids[miss])
                out = torch.empty((len(ids), self.cols), dtype=self.data.dtype)
                out[torch.from_numpy(miss)] = torch.from_numpy(
                    np.ascontiguousarray(fut.result()[self.spec.name][:, : self.cols])
                )
                self._check_restarts(fut)
                hit = np.flatnonzero(~miss)
                out[torch.from_numpy(hit)] = self.data.index_select(
                    0, to_device(slots[hit], self.device)
                )[:, : self.cols].cpu()
                return out.to(self.device)
        return self.data.index_select(0, self._slots_of(ids))[:, : self.cols].contiguous()

    def update(self, keys: Tensor, grads: Tensor, step: Step) -> None:
        """One optimizer update of owned unique ``keys`` (all read in this update, so held)."""
        lr, momentum = rate_of(step, self.spec.name)
        ids = _ids(keys)
        last = self._last
        if last is not None and len(last[0]) == len(ids) and np.array_equal(last[0], ids):
            slots = last[1]
        else:
            slots = self._lookup(ids)
        if (slots < 0).any():  # (only rows read in this update are updated)
            raise RuntimeError(f"table {self.spec.name!r}: a device tier lost a row it updates")
        idx = to_device(slots, self.device)
        block = self.data.index_select(0, idx)
        state = {k: block[:, a:b] for k, (a, b) in self.slots.items()}
        apply(
            self.spec.optimizer, block[:, : self.cols], state, grads.to(block.dtype), lr, momentum
        )
        self.data.index_copy_(0, idx, block)
        self._clock += 1

    def unpin(self) -> None:
        """Release the rows read in this update (it was skipped: none of them is updated)."""
        self._clock += 1

    def take_counts(self) -> TierCounts:
        out, self.counts = self.counts, TierCounts()
        return out

    # --- checkpoints -------------------------------------------------------------------------

    def flush(self) -> int:
        """Write every row held back to the shards (they stay held): before a save, so that
        the shards' files hold the whole table. The rows written."""
        self.settle_writes()
        live = np.flatnonzero(self.live)
        if not len(live):
            return 0
        block = self.data.index_select(0, to_device(live, self.device)).cpu().numpy()
        fut = self._swap({self.spec.name: (self.key_at[live], block)}, None)
        fut.result()
        self._check_restarts(fut)
        return len(live)

    def held_ids(self) -> np.ndarray:
        """The ids on the device now, ascending."""
        return np.sort(self.key_at[self.live])
