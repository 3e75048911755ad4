"""A device tier over the shards: a worker keeps at most ``capacity`` rows of its share of a
sparse table on its device, and the rest of that share lives on the shard actors (host
memory); ``angel.sparse.placement=worker`` with ``angel.worker.table.capacity``.

The owner (the worker the table's partitioner assigns a row to, as for tables held whole,
learners/worker/held_tables.py) is the only writer of its rows: a row it holds is read and
updated on the device with the table's optimizer (:func:`angelps.optim.apply`, the shards'
code); a miss is fetched from the shards with its optimizer state (a shard creates it then, as
a pull does), and an evicted row is written back with its state
(:func:`angelps.client.tier_swap.swap_async`: one call per shard, over the data plane's
connection where there is one). So training is exactly that of the table held whole, whatever
the budget (BSP).

Policy. Eviction by recency (``lru``: the rows read longest ago go first) or by frequency
(``lfu``: the rows whose ids were seen least often, counted by id where the table's id range
allows, else in a hashed sketch of 16 counters a row held, halved as it fills); rows of the
update in progress are never evicted. Admission
(``angel.worker.table.admit.count`` = c): a miss seen fewer than c times is fetched and
updated like any row but goes first at the next eviction, so rare ids do not push out hot
ones. docs/device-tier.md has the measurement behind the defaults.

One worker's update thread (learners/worker/held_tables.py) asks ahead, makes room and places
a prefetch's misses (:meth:`TierBook.place_ahead`) while the read goes on, staged (on a GPU
also ahead of a read not staged); the victims' rows come down without waiting for the GPU.

The index (id -> slot) lives on the host (a miss must come from the host anyway): an int32
array over the id range of a table of known range, else a hash table, in which evicted ids
stay (their slot's id tells a stale entry from a live one) until it holds 4x the capacity,
when it is rebuilt from the live rows, so an eviction never moves rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from angelps import TableSpec
from angelps.client.tier_swap import SwapFuture
from angelps.partition import Partitioner
from learners.worker.tier_evict import TierEvictions
from learners.worker.tier_link import TierLink
from learners.worker.tier_slots import (
    DIRECT_MAX,
    DirectSlots,
    HashSlots,
    IdCounts,
    Source,
    TierCounts,
    TierPolicy,
    ids_of,
    request_ids,
    same,
    sorted_ids,
    staged_source,
)
from learners.worker.tier_table import TierTable
from learners.worker.tier_through import ThroughReads

__all__ = ["TierBook", "TierCounts", "TierPolicy", "TierTable"]


class TierBook(TierEvictions):
    """The slots of one worker's device tier over a group of tables keyed alike: at most
    ``capacity`` ids, each with its row of every table of the group on ``device``; which ids
    are held (the index), when each was read (recency) and how often its id was seen
    (frequency); the swaps with the shards (``shards``: a function giving the worker's PS
    client, attached after the tier is made)."""

    def __init__(
        self,
        specs: list[TableSpec],
        part: Partitioner,
        owner: int,
        device: torch.device,
        capacity: int,
        policy: TierPolicy,
        shards: Any,
    ) -> None:
        names = ", ".join(repr(s.name) for s in specs)
        if capacity < 1:
            raise ValueError(f"table {names}: a device tier needs a capacity of 1 row or more")
        self.label = names
        self.rows = specs[0].rows
        self.part = part
        self.owner = owner
        self.device = device
        self.capacity = int(capacity)
        self.policy = policy
        self.tables = {s.name: TierTable(s, self) for s in specs}
        row_bytes = {n: t.width * t.data.element_size() for n, t in self.tables.items()}
        self.link = TierLink(names, row_bytes, shards)
        #: where a swap's rows go up once for both threads (None: rows move on the host)
        self._up = None if next(iter(self.tables.values())).rows.on_host else device
        self.seen = IdCounts(self.rows, self.capacity)  # (how often each id was read)
        #: reads pin their rows at ``clock`` (one per update); rows pinned at ``floor`` or
        #: later are never evicted (``floor`` stays at an update's clock until it is settled)
        self._clock = 1
        self._floor = 1
        self._pending: tuple[np.ndarray, SwapFuture] | None = None
        #: training reads whose misses :meth:`place_ahead` had placed
        self.reads_placed_ahead = 0
        #: the last training read: (ids, slots (None: staged, not placed yet), hits, clock)
        self._last: tuple[np.ndarray, np.ndarray | None, int, int] | None = None
        #: the next read as a prefetch looked it up: (ids, slots, clock, misses placed ahead
        #: by :meth:`place_ahead`, -1 where none were)
        self._read: tuple[np.ndarray, np.ndarray, int, int] | None = None
        #: slots uploaded to the device once for every table of the book: (host, device)
        self._on: tuple[np.ndarray, Tensor | None] | None = None
        #: the reads :meth:`prefetch` asked for ahead, by clock (ids, their blocks' source),
        #: which :meth:`read` serves without the state the update thread changes; two at once
        #: where the ask after the next one comes before the next one's rows are put
        self._staged: dict[int, tuple[np.ndarray, Source]] = {}
        self._src: Source | None = None
        self._filling: tuple[np.ndarray, SwapFuture] | None = None
        #: training reads served from :attr:`_staged`, their misses placed by the update thread
        self.reads_staged = 0
        self.through = ThroughReads(self)  # (reads outside training)
        #: slots the prefetched misses need (:meth:`make_room`)
        self._room = 0
        #: False while validating or predicting (learners/worker/held_tables.py)
        self.training = True
        self.reset()

    def reset(self) -> None:
        """Hold nothing (after a restore: the shards have the rows); the swaps still in
        flight land first, the write-backs not sent yet are dropped."""
        self.drain()
        self.link.forget()
        self._read = self._last = self._src = None
        self._staged = {}
        self._placed: tuple[np.ndarray, np.ndarray, int, int] | None = None
        #: misses indexed whose rows are not put yet (:meth:`index_ahead`): slots, swap
        self._filling = None
        self._on = None
        self._room = 0
        self.key_at = np.zeros(self.capacity, dtype=np.int64)
        self.live = np.zeros(self.capacity, dtype=bool)
        self.index: DirectSlots | HashSlots
        if 0 < self.rows <= DIRECT_MAX:
            self.index = DirectSlots(self.rows)
        else:
            self.index = HashSlots(self.capacity, self.key_at, self.live)
        # a row's last read's clock; slot -1 (a miss) writes a spare entry: no mask to pin hits
        self._used = np.zeros(self.capacity + 1, dtype=np.int64)
        self.used = self._used[: self.capacity]
        self.rare = np.zeros(self.capacity, dtype=bool)  # not admitted: evicted first
        self.free = np.arange(self.capacity - 1, -1, -1, dtype=np.int64)  # a stack
        self.n_free = self.capacity

    def rows_held(self) -> int:
        return self.capacity - self.n_free

    @property
    def clock(self) -> int:
        """The update reads pin their rows for (one per update)."""
        return self._clock

    # --- the clocks (learners/worker/held_tables.py) -----------------------------------------

    def end_update(self) -> None:
        """The update of the rows read so far was handed over (it may still run: its rows
        stay pinned until :meth:`settled`); later reads belong to the next update."""
        self._clock += 1

    def settled(self) -> None:
        """Every update handed over has been applied: only later reads stay pinned."""
        self._floor = self._clock

    def unpin(self) -> None:
        """Release the rows read in this update (it was skipped: none of them is updated)."""
        self._clock += 1
        self._floor = self._clock

    def ids_in(self, req: Mapping[str, np.ndarray | Tensor]) -> np.ndarray | None:
        """The unique ids ``req`` reads of this book's tables (their union where they differ),
        None where it reads none."""
        return request_ids([req[n] for n in self.tables if n in req])

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slots of ``keys`` held now, -1 for the others."""
        if not len(keys):
            return np.zeros(0, dtype=np.int64)
        return self.index.lookup(keys)

    def _known(self, ids: np.ndarray) -> tuple[np.ndarray, bool, int]:
        """:meth:`lookup` of ``ids``, or the slots a prefetch looked up for the same ids (its
        hits were pinned then, so no eviction since has taken them); whether the hits are
        pinned at this update's clock already; how many misses :meth:`place_ahead` placed
        (-1: none was)."""
        read = self._read
        if read is not None and same(read[0], ids):
            self._read = None  # (another's stays: a read between may come before its own)
            if read[2] == self._clock:
                return read[1], True, read[3]
            return read[1], False, -1
        placed = self._placed  # (placed ahead; the read after asked for since)
        if placed is not None and placed[2] == self._clock and same(placed[0], ids):
            return placed[1], True, placed[3]
        return self.lookup(ids), False, -1

    def slots_on(self, slots: np.ndarray) -> Tensor | None:
        """``slots`` on the device, uploaded once for every table of the book (the tables
        of a book read and write the same slots); None where rows move by host slots."""
        on = self._on
        if on is None or on[0] is not slots:
            first = next(iter(self.tables.values()))
            on = self._on = (slots, first.rows.slots(slots))
        return on[1]

    # --- the shards ----------------------------------------------------------------------------

    @property
    def bytes_moved(self) -> int:
        """Bytes exchanged with the shards: ids and rows sent, rows received."""
        return self.link.bytes_moved

    def drain(self) -> None:
        """Wait for every call still in flight (a prefetch's rows are dropped)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.link.drop(pending[1])
        filling, self._filling = self._filling, None
        if filling is not None:  # (its rows are not put: the index is reset or was filled)
            self.link.drop(filling[1])
        self.link.settle(every=True)

    # --- the step ------------------------------------------------------------------------------

    def prefetch(
        self, keys: np.ndarray | Tensor, clock: int | None = None, stage: bool = True
    ) -> None:
        """While the current update runs: look up the next read's ``keys`` (unique), pin the
        rows held and start one read per shard of the misses; :meth:`make_room` frees their
        slots once the update is applied. ``clock``: the next read's, from one worker's update
        thread asking as the reads of the update before it ended (the training thread's clock
        moves meanwhile); that read may then be staged (:meth:`read`), unless not ``stage``
        (several workers ask for the read after the next in their training thread)."""
        ids = sorted_ids(keys)
        if self._pending is not None:  # (never read: drop its rows)
            self.link.drop(self._pending[1])
            self._pending = None
        slots = self.lookup(ids)
        at = self._clock if clock is None else clock
        self._read = (ids, slots, at, -1)
        self._used[slots] = at  # the next update's (the misses' -1: the spare entry)
        pos = np.flatnonzero(slots < 0)
        miss = ids.take(pos)
        self._room = len(miss)
        # A row written back earlier may be read again now: the swap that carried it lands
        # first (a shard is an async actor: Ray does not keep the order of its calls); the
        # write-backs held since go with this swap.
        self.link.settle(timed=clock is None or not stage)
        fut = self.link.swap({}, miss)
        self._pending = (miss, fut)
        if clock is None:
            self._staged.clear()
        elif stage:
            # (its slots sent up here, in the update thread: 37% of a staged read's time on the
            # training thread, profiled on an H200; one stream, queued before the read's takes)
            rows = next(iter(self.tables.values())).rows
            self._staged[at] = (ids, staged_source(rows, slots, fut, pos))

    def place_ahead(self, staged: bool = False) -> None:
        """Place the prefetched misses in the slots :meth:`make_room` freed, once their rows
        came, so that the next read finds every row held (one worker's update thread runs
        this after make_room, beside the next batch's preparation); nothing where the tier
        has too few free slots (the read evicts then, unless it is ``staged``: it reads
        without placing) or the prefetch was read already."""
        self.index_ahead(staged)
        self.fill()

    def index_ahead(self, staged: bool = False) -> None:
        """:meth:`place_ahead` but for the rows: the misses get their slots and are indexed
        now, so that an ask made next finds them held (pinned, not asked of the shards again:
        the shards' rows are not updated by this update); :meth:`fill` puts their rows, before
        the update that reads them."""
        read, pending = self._read, self._pending
        if read is None or pending is None or read[2] != self._clock or read[3] >= 0:
            return
        ids, slots, clock, _ = read
        miss_ids, fut = pending
        if len(miss_ids) > self.n_free:
            if not staged:
                return
            keys, blocks, _ = self._evict(len(miss_ids) - self.n_free)  # (or its error)
            self.link.write_back({n: (keys, b) for n, b in blocks.items()})
        self._pending = None
        self._sighted(ids)  # (the read's sighting, counted here for it)
        if len(miss_ids):
            new = self._assign(miss_ids)
            self._filling = (new, fut)
            slots = slots.copy()
            slots[np.flatnonzero(slots < 0)] = new  # (by position: a mask's is 2x slower)
            self._admitted(new, miss_ids, clock)
        self._read = (ids, slots, clock, len(miss_ids))
        # (a staged read's update, and the read several workers ask for the read after)
        self._placed = (ids, slots, clock, len(miss_ids))

    def fill(self, timed: bool = False) -> None:
        """Put the rows of the misses :meth:`index_ahead` indexed, once they came (``timed``:
        by the training thread, its wait counted)."""
        filling, self._filling = self._filling, None
        if filling is not None:
            self._put(filling[0], self.link.rows_on(filling[1], self._up, timed))

    def _sighted(self, ids: np.ndarray) -> None:
        """Count a read's ids where the policy needs their counts."""
        if self.policy.admit > 1 or self.policy.eviction == "lfu":
            self.seen.add(ids)

    def _admitted(self, new: np.ndarray, ids: np.ndarray, clock: int) -> None:
        """The rows of ``ids`` just placed in slots ``new`` are pinned at ``clock``; those not
        admitted (seen fewer than admit.count times) go first at the next eviction."""
        self.used[new] = clock
        if self.policy.admit > 1:
            self.rare[new] = self.seen.of(ids) < self.policy.admit

    def read(self, ids: np.ndarray) -> tuple[np.ndarray | None, int]:
        """Slots of the unique ``ids`` (fetched when missing), pinned for this update, and how
        many were held already; None for the slots of a staged read. Another table of the
        group reading the same ids in the same update reuses the first one's slots."""
        last = self._last
        if last is not None and last[3] == self._clock and same(last[0], ids):
            return last[1], last[2]
        staged = self._staged.pop(self._clock, None)
        if staged is not None:
            return self._read_staged(ids, staged)
        slots, pinned, placed = self._known(ids)
        if placed >= 0:  # (the misses came and were placed ahead: every row is held)
            self.reads_placed_ahead += 1
            self._last = (ids, slots, len(ids) - placed, self._clock)
            return slots, len(ids) - placed
        miss = slots < 0
        n_miss = int(miss.sum())
        self._sighted(ids)
        if not pinned:  # (the hits first: the eviction must not take a row this read needs)
            if any(c > self._clock for c in self._staged):
                # (a later read was asked for already, its rows pinned later: kept so)
                self._used[slots] = np.maximum(self._used[slots], self._clock)
            else:
                self._used[slots] = self._clock  # (the misses' -1: the spare entry)
        if n_miss:
            new = self._fetch(ids[miss])
            slots[miss] = new
            self._admitted(new, ids[miss], self._clock)
        self._last = (ids, slots, len(ids) - n_miss, self._clock)
        return slots, len(ids) - n_miss

    def unstage(self) -> None:
        """The next read is not staged (read after the room and placement)."""
        for c in [c for c in self._staged if c <= self._clock]:
            del self._staged[c]

    def _read_staged(self, ids: np.ndarray, staged: tuple[np.ndarray, Source]) -> tuple[None, int]:
        """A read one worker's update thread asked for ahead (:meth:`prefetch` with its
        clock), served while that thread may still make room and place its misses: its rows
        held (pinned by the ask) and its misses' rows as the shards sent them make each
        table's block (:meth:`staged_block`), touching nothing that thread changes; the
        update finds the placed slots (:meth:`slots_for_update`)."""
        sids, src = staged
        clock = self._clock
        if not same(sids, ids):  # (HeldTables stages only this read)
            raise RuntimeError(f"table {self.label}: a staged read of other ids")
        self._src, n_miss = src, len(src[1])
        self.reads_staged += 1
        self._last = (ids, None, len(ids) - n_miss, clock)
        return None, len(ids) - n_miss

    def staged_block(self, name: str) -> Tensor:
        """The whole rows of table ``name`` a staged read reads: the rows held taken from the
        device, the misses' from the shards' answer (waited for here)."""
        assert self._src is not None
        at, miss, fut, on = self._src
        rows = self.link.rows_on(fut, self._up, timed=True)[name]
        return self.tables[name].rows.assemble(at, miss, rows, on)

    def _fetch(self, miss: np.ndarray) -> np.ndarray:
        """Place the rows of ``miss`` (ids not held) in free slots: those a prefetch brought
        as they came, the others fetched now, evicting first when the tier is full; their
        slots."""
        writes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if len(miss) > self.n_free:
            keys, blocks, _ = self._evict(len(miss) - self.n_free)
            writes = {n: (keys, b) for n, b in blocks.items()}
        got: dict[str, np.ndarray] | None = None
        pending, self._pending = self._pending, None
        todo = np.ones(len(miss), dtype=bool)
        if pending is not None:
            # Rows prefetched for ids still missing are current: only their owner (this tier)
            # writes them, and it has not held them since the prefetch started.
            pkeys, fut = pending
            rows = self.link.rows(fut, timed=True)
            if same(pkeys, miss):
                got, todo = rows, np.zeros(len(miss), dtype=bool)
            else:
                got = {
                    n: np.empty((len(miss), t.width), t.np_dtype) for n, t in self.tables.items()
                }
                if len(pkeys):
                    pos = np.minimum(np.searchsorted(pkeys, miss), len(pkeys) - 1)
                    hit = pkeys[pos] == miss
                    for n in self.tables:
                        got[n][hit] = rows[n][pos[hit]]
                    todo &= ~hit
        if todo.any():
            self.link.settle(timed=True)  # (rows written back earlier may be among these)
            rows = self.link.rows(self.link.swap(writes, miss[todo]), timed=True)
            if got is None:
                got = rows
            else:
                for n in self.tables:
                    got[n][todo] = rows[n]
        elif writes:  # (they go back with the next swap, before it reads)
            self.link.write_back(writes)
        assert got is not None
        return self._place(miss, got)

    def _place(self, miss: np.ndarray, got: Mapping[str, np.ndarray | Tensor]) -> np.ndarray:
        """Put the rows ``got`` (of every table) of ids ``miss`` in free slots; the slots."""
        slots = self._assign(miss)
        self._put(slots, got)
        return slots

    def _assign(self, miss: np.ndarray) -> np.ndarray:
        """Free slots for the ids ``miss``, indexed (their rows not put yet); the slots."""
        slots = self.free[self.n_free - len(miss) : self.n_free][::-1].copy()
        self.n_free -= len(miss)
        self.key_at[slots] = miss
        self.live[slots] = True
        self.index.insert(miss, slots)
        return slots

    def _put(self, slots: np.ndarray, got: Mapping[str, np.ndarray | Tensor]) -> None:
        on = self.slots_on(slots)
        for n, t in self.tables.items():
            t.rows.put(slots, got[n], on)

    def read_through(self, name: str, ids: np.ndarray) -> Tensor:
        """Outside training: the weights of ``ids`` of table ``name`` (:class:`ThroughReads`)."""
        return self.through.read(name, ids)

    def slots_for_update(self, keys: np.ndarray | Tensor) -> np.ndarray:
        """Slots of owned unique ``keys`` an update writes (all read in this update, so held)."""
        ids = ids_of(keys)
        last, placed = self._last, self._placed
        if last is not None and last[1] is not None and same(last[0], ids):
            slots = last[1]
        elif placed is not None and placed[2] == self._clock and same(placed[0], ids):
            slots = placed[1]  # (a staged read's: placed by the update thread)
        else:
            slots = self.lookup(ids)
        if (slots < 0).any():  # (only rows read in this update are updated)
            raise RuntimeError(f"table {self.label}: a device tier lost a row it updates")
        return slots

    # --- checkpoints -------------------------------------------------------------------------

    def flush(self) -> int:
        """Write every row held back to the shards (they stay held): before a save, so that
        the shards' files hold the whole table. The rows written (of every table). Every
        shard answers, even with nothing to write: one restarted unseen (from a backup,
        which leaves the tier's table out) would save a table that lost its rows."""
        # (a prefetch in flight stays: its misses are rows not held, which this leaves as they
        # are on the shards; its rows are read or placed as if no save came between)
        self.fill()
        self.link.settle(every=True)
        live = np.flatnonzero(self.live)
        keys = self.key_at[live]
        writes = {n: (keys, t.rows.take_host(live)) for n, t in self.tables.items()}
        self.link.rows(self.link.swap(writes if len(live) else {}, None, every=True))
        return len(live) * len(self.tables)

    def held_ids(self) -> np.ndarray:
        """The ids on the device now, ascending."""
        return np.sort(self.key_at[self.live])
