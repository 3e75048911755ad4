"""Row storage of one shard: the rows of one table that a shard holds, and their optimizer state.

Each row's weights and optimizer slots are stored side by side in one row of width
``cols + sum(slot widths)`` (:mod:`angelps.storage.rows`: host numpy pages, or one torch tensor on a
device for shards with ``angel.ps.gpus > 0``), so an update gathers, updates and scatters one
block. Layout:

* dense: one block of the shard's key range ``[lo, hi)`` (local row = key - lo);
* sparse: rows in creation order by slot, ``keys`` holding each slot's key, found through the
  table's key index (:mod:`angelps.storage.index`: open addressing over int32 slots for any
  int64 key, or a direct array for a small bounded span). Growth adds pages and never copies the table; creating ``m`` rows
  costs O(m).

A row is created on its first pull or push (or, with admission on, by the update that admits
its key: :mod:`angelps.storage.admission`) with :func:`angelps.table.init_rows`, so its initial value
depends only on (seed, key): a row removed by expiry and created again starts exactly like a
new one. The rows new in one call are created in sorted key order, so both indexes give the
same storage layout, rows and checkpoints.

Expiry (``ttl`` > 0): each row keeps the table's update count at its last update (or its
creation); :meth:`Table.evict` (called at checkpoint time) removes the rows not updated for
``ttl`` updates and compacts the rest.

Invariants: callers pass keys that are unique and strictly increasing, already checked against
the table (:mod:`angelps.server.shard` validates); an update gathers the rows, applies the table's
optimizer (:func:`angelps.optim.apply`) and scatters them back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from angelps.dedup import strictly_increasing
from angelps.optim import apply, slot_columns, slot_widths
from angelps.partition import Partitioner
from angelps.storage.admission import Admission
from angelps.storage.index import DIRECT_MAX, DirectIndex, hinted_lookup, new_index
from angelps.storage.row_threads import RowThreads
from angelps.storage.rows import PagedRows, RowStore, TorchRows, as_rows
from angelps.table import TableSpec, init_rows

__all__ = ["CHUNK_ROWS", "DIRECT_MAX", "FrozenTable", "Table", "new_table"]

#: Rows per chunk of a dense table's initialisation and of a checkpoint's export.
CHUNK_ROWS = 1 << 20

Rows = RowStore


class Table:
    """The rows of one table held by one shard, and their optimizer state."""

    def __init__(
        self,
        spec: TableSpec,
        part: Partitioner,
        shard_id: int,
        device: str | None = None,
        min_count: int = 0,
        ttl: int = 0,
    ) -> None:
        self.spec = spec
        self.part = part
        self.shard_id = shard_id
        self.device = device
        self.dtype = np.dtype(spec.dtype)
        self.widths = slot_widths(spec.optimizer, spec.cols)
        self.cols = spec.cols
        # optimizer slot -> its columns
        self.slots, self.width = slot_columns(spec.optimizer, spec.cols)
        self.updates = 0  # optimizer updates applied to this table
        self.evicted = 0  # rows removed by expiry
        self.ttl = int(ttl)
        self.admission = Admission(min_count) if spec.sparse and min_count > 1 else None
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # last pull: keys, slots
        self.located: np.ndarray | None = None  # last take_rows/put_rows: its keys' slots
        self.stamps: PagedRows | None = None
        if spec.sparse:
            self.lo = self.hi = self.n = 0
            self.keys = PagedRows(1, np.int64)  # key of each slot
            self.index = new_index(spec, part, shard_id, self.keys.take1)
            self.index_kind = self.index.kind
            self.rows: Rows = self._new_rows()
            if self.ttl > 0:
                self.stamps = PagedRows(1, np.uint32)
        else:
            self.index_kind = "dense"
            self.lo, self.hi = part.row_range(shard_id)
            self.n = self.hi - self.lo
            self.rows = self._new_rows(self.n)
            for a in range(0, self.n, CHUNK_ROWS):
                b = min(a + CHUNK_ROWS, self.n)
                self.rows.write(a, self._fresh(np.arange(self.lo + a, self.lo + b)))

    def _new_rows(self, fixed: int = -1) -> Rows:
        if self.device is not None:
            rows = TorchRows(self.width, self.dtype, self.device)
            if fixed >= 0:
                rows.reserve(fixed)
            return rows
        if fixed >= 0:
            return PagedRows.fixed(fixed, self.width, self.dtype)
        return PagedRows(self.width, self.dtype)

    def _fresh(self, keys: np.ndarray) -> np.ndarray:
        """New rows of ``keys``: initial weights, zero optimizer state."""
        block = np.zeros((len(keys), self.width), dtype=self.dtype)
        block[:, : self.cols] = init_rows(self.spec, keys)
        return block

    # --- lookup --------------------------------------------------------------------------------

    def check_owned(self, keys: np.ndarray) -> None:
        if not keys.size:
            return
        if self.spec.sparse:
            self.index.check_owned(self.spec.name, keys)
            return
        lo, hi = int(keys.min()), int(keys.max())
        if lo < self.lo or hi >= self.hi:
            bad = lo if lo < self.lo else hi
            raise ValueError(
                f"table {self.spec.name!r}: key {bad} is not held by this shard "
                f"(rows [{self.lo}, {self.hi}))"
            )

    def locate(
        self, keys: np.ndarray, create: bool = True, hint: np.ndarray | None = None
    ) -> np.ndarray:
        """Storage slots of unique ``keys``; sparse rows missing are created (initialised)
        unless ``create`` is False (then their slot is -1); ``hint``: their slots in another
        table of the same keys, checked (:func:`~angelps.storage.index.hinted_lookup`)."""
        if not self.spec.sparse:
            return keys - self.lo
        slots = hinted_lookup(self.index, self.keys.take1, self.n, keys, hint)
        missing = slots < 0
        if create and missing.any():
            slots[missing] = self._create(keys[missing])
        return slots

    def _create(self, keys: np.ndarray, block: np.ndarray | None = None) -> np.ndarray:
        """Rows for the absent unique ``keys`` (created in ascending key order), initialised or
        set to ``block`` (whole rows, a restore); their slots."""
        order = None
        if not strictly_increasing(keys):
            order = np.argsort(keys, kind="stable")
            keys = keys[order]
            block = None if block is None else block[order]
        m, start = len(keys), self.n
        end = start + m
        for store in self._stores():
            store.reserve(end)
        self.rows.write(start, self._fresh(keys) if block is None else block)
        self.keys.write(start, keys.reshape(-1, 1))
        if self.stamps is not None:
            self.stamps.write(start, np.full((m, 1), self._stamp(), dtype=np.uint32))
        slots = np.arange(start, end, dtype=np.int64)
        self.index.insert(keys, slots)
        self.n = end
        if order is None:
            return slots
        out = np.empty(m, dtype=np.int64)
        out[order] = slots
        return out

    def _stamp(self) -> int:
        """The update count as a row stamp (uint32: ages are computed modulo 2^32)."""
        return self.updates & 0xFFFFFFFF

    def _stores(self) -> list[Any]:
        stores: list[Any] = [self.rows, self.keys]
        if self.stamps is not None:
            stores.append(self.stamps)
        return stores

    def slot_keys(self) -> np.ndarray:
        """The key of every slot: a sparse table's in creation order, a dense table's range."""
        if not self.spec.sparse:
            return np.arange(self.lo, self.hi, dtype=np.int64)
        return self.keys.read(0, self.n)[:, 0] if self.n else np.zeros(0, np.int64)

    # --- operations ----------------------------------------------------------------------------

    def read(self, keys: np.ndarray | None) -> np.ndarray:
        """The weights of ``keys`` (None: a dense table's whole block)."""
        if keys is None:
            if self.spec.sparse:
                raise ValueError(f"table {self.spec.name!r} is sparse: pull needs keys")
            return self.rows.read(0, self.n, self.cols)
        if not self.spec.sparse and len(keys) and _is_range(keys):
            a = int(keys[0]) - self.lo  # a contiguous block: a copy, no gather
            return self.rows.read(a, a + len(keys), self.cols)
        slots = self.locate(keys, create=self.admission is None)
        if self.admission is None:
            self._last = (keys.copy(), slots)  # a copy: the caller may reuse its array
            return self.rows.gather(slots, self.cols)
        absent = slots < 0
        if not absent.any():
            return self.rows.gather(slots, self.cols)
        out = init_rows(self.spec, keys)  # keys without a row read their initial value
        held = ~absent
        if held.any():
            out[held] = self.rows.gather(slots[held], self.cols)
        return out

    def _slots_for_update(self, keys: np.ndarray) -> np.ndarray:
        """Slots of the keys of an update: the last pull's when it asked for the same keys
        (a training step pushes the rows it pulled), else looked up; rows created. With
        admission on, -1 for keys not admitted yet."""
        last = self._last
        if last is not None and len(last[0]) == len(keys) and np.array_equal(last[0], keys):
            return last[1]
        slots = self.index.lookup(keys)
        missing = slots < 0
        if not missing.any():
            return slots
        new = keys[missing]
        if self.admission is not None:
            admit = self.admission.see(new)
            got = np.full(len(new), -1, dtype=np.int64)
            if admit.any():
                got[admit] = self._create(new[admit])
            slots[missing] = got
        else:
            slots[missing] = self._create(new)
        return slots

    def update(
        self, keys: np.ndarray, grads: np.ndarray, lr: float, momentum: float | None = None
    ) -> None:
        """One optimizer update of the rows ``keys`` with their summed gradients (``momentum``:
        this update's, from a schedule that drives it; None: the optimizer's own)."""
        self.updates += 1
        if not self.spec.sparse:
            if len(keys) and _is_range(keys):
                # A contiguous block: update views in place, no gather/scatter.
                a = int(keys[0]) - self.lo
                self._apply(self.rows.block(a, a + len(keys)), grads, lr, momentum)
                return
            slots = keys - self.lo
        else:
            slots = self._slots_for_update(keys)
            if self.admission is not None:
                keep = slots >= 0
                if not keep.all():
                    slots, grads = slots[keep], grads[keep]
            if self.stamps is not None:
                self.stamps.scatter(slots, np.full((len(slots), 1), self._stamp(), np.uint32))
        # Updated where the rows live: numpy on the host, a tensor on the device.
        block = self.rows.gather_block(slots)
        self._apply(block, grads, lr, momentum)
        self.rows.scatter_block(slots, block)

    def _apply(self, block: Any, grads: np.ndarray, lr: float, momentum: float | None) -> None:
        """The optimizer on a block of whole rows (weights and slots), in place."""
        state = {k: block[:, a:b] for k, (a, b) in self.slots.items()}
        g = self.rows.as_block(grads)
        apply(self.spec.optimizer, block[:, : self.cols], state, g, lr, momentum)

    def evict(self) -> int:
        """Remove the rows not updated (nor created) in the last ``ttl`` updates and compact
        the rest; returns how many were removed. O(rows), in chunks (checkpoint time)."""
        if self.admission is not None:
            self.admission.compact()
        if self.stamps is None or not self.n:
            return 0
        keep = np.empty(self.n, dtype=bool)
        now = np.uint32(self._stamp())
        for a in range(0, self.n, CHUNK_ROWS):
            b = min(a + CHUNK_ROWS, self.n)
            age = now - self.stamps.read(a, b)[:, 0]  # uint32: wraps like the stamps
            keep[a:b] = age < self.ttl
        src = np.flatnonzero(keep)
        gone = self.n - len(src)
        if gone:
            dst = np.arange(len(src), dtype=np.int64)
            first = int(np.argmax(src != dst)) if (src != dst).any() else len(src)
            for store in self._stores():
                store.move(dst[first:], src[first:])
                store.truncate(len(src))
            self.n = len(src)
            self.index.rebuild(self.slot_keys())
            self.evicted += gone
            self._last = None
        return gone

    def export_chunks(
        self, chunk: int | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
        """(keys, rows, state) of everything this shard holds, in ascending key order, in
        chunks of ``chunk`` rows (default :data:`CHUNK_ROWS`; at least one chunk, maybe
        empty): no full second copy."""
        return _chunks(self, self.slot_keys(), self.rows.gather, chunk)

    def freeze(self) -> FrozenTable:
        """A copy of this table's rows and state as they are now (a backup written in the
        background while the table goes on changing): the rows in use and their keys."""
        return FrozenTable(self, self.slot_keys(), self.rows.read(0, self.n))

    def frozen_nbytes(self) -> int:
        """Bytes :meth:`freeze` would copy: the rows in use with their state, and keys."""
        return self.n * (self.width * self.dtype.itemsize + 8)

    def export(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(keys sorted, rows, state) copies of everything this shard holds."""
        parts = list(self.export_chunks())
        if len(parts) == 1:
            return parts[0]
        return (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            {k: np.concatenate([p[2][k] for p in parts]) for k in self.slots},
        )

    def take_rows(
        self,
        keys: np.ndarray,
        par: RowThreads | None = None,
        out: np.ndarray | None = None,
        hint: np.ndarray | None = None,
    ) -> np.ndarray:
        """Whole rows (weights, then the optimizer slots) of unique ``keys``, a new array (or
        ``out``, a contiguous ``[len(keys), width]`` array of the table's dtype); rows missing
        are created (initialised) as a pull creates them. A worker's device tier fetches its
        misses with their optimizer state this way. ``par``: the keys cut into parts, each
        looked up and gathered by a thread of its own (:mod:`angelps.storage.row_threads`);
        the rows missing made after, by this thread. ``hint``: as :meth:`locate`'s; the
        slots read are left in :attr:`located`."""
        self._last = None
        if par is None or not self.n:
            slots = self.located = self.locate(keys, True, hint)
            if out is None:
                return self.rows.gather(slots)
            self.rows.gather_into(slots, out)
            return out
        if out is None:
            out = np.empty((len(keys), self.width), dtype=self.dtype)
        slots = np.empty(len(keys), dtype=np.int64)
        rows = out

        def part(a: int, b: int) -> None:
            s = self.locate(keys[a:b], False, None if hint is None else hint[a:b])
            slots[a:b] = s
            if len(s) and s.min() < 0:
                s = np.maximum(s, 0)  # (row 0 read for now: the rows made below replace it)
            self.rows.gather_into(s, rows[a:b])

        par.run(len(keys), part)
        missing = slots < 0
        if missing.any():
            # (by position, not by mask: a boolean mask's assignment of rows is 5x slower)
            at = np.flatnonzero(missing)
            made = self._create(keys.take(at))
            np.put(as_rows(out), at, as_rows(self.rows.gather(made)))
            slots[at] = made
        self.located = slots
        return out

    def assign(self, keys: np.ndarray, w: np.ndarray, state: Mapping[str, np.ndarray]) -> None:
        """Overwrite rows (and state) of unique ``keys`` (checkpoint restore); rows missing are
        created with these values directly (no initialisation to overwrite)."""
        block = np.empty((len(keys), self.width), dtype=self.dtype)
        block[:, : self.cols] = w
        for k, (a, b) in self.slots.items():
            block[:, a:b] = state[k]
        self.put_rows(keys, block)

    def put_rows(
        self,
        keys: np.ndarray,
        block: np.ndarray,
        par: RowThreads | None = None,
        hint: np.ndarray | None = None,
    ) -> None:
        """Overwrite whole rows (weights and slots, as :meth:`take_rows` returns them) of
        unique ``keys``; rows missing are created with these values. ``par``: the keys cut
        into parts, each looked up and written by a thread of its own; the rows missing made
        after, by this thread. ``hint``, :attr:`located`: as :meth:`take_rows`'s."""
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self._last = self.located = None
        if par is not None and self.n:
            self._put_parts(keys, block, par, hint)
            return
        if not self.spec.sparse:
            self.rows.scatter(keys - self.lo, block)
            return
        slots = self.located = hinted_lookup(self.index, self.keys.take1, self.n, keys, hint)
        missing = slots < 0
        if missing.all():  # a restore into an empty table: no copy of the chunk
            self._create(keys, block)
            return
        if missing.any():
            self._create(keys[missing], block[missing])
            held = ~missing
            slots, block = slots[held], block[held]
        if len(slots):
            self.rows.scatter(slots, block)

    def _put_parts(
        self, keys: np.ndarray, block: np.ndarray, par: RowThreads, hint: np.ndarray | None
    ) -> None:
        """:meth:`put_rows` over ``par``'s threads."""
        missing = np.zeros(len(keys), dtype=bool)
        found = self.located = np.empty(len(keys), dtype=np.int64)

        def part(a: int, b: int) -> None:
            s = found[a:b] = self.locate(keys[a:b], False, None if hint is None else hint[a:b])
            held = s >= 0
            if held.all():
                self.rows.scatter(s, block[a:b])
                return
            missing[a:b] = ~held
            self.rows.scatter(s[held], block[a:b][held])

        par.run(len(keys), part)
        if missing.any():
            at = np.flatnonzero(missing)
            self._create(keys.take(at), block.take(at, axis=0))

    def reserve(self, rows: int) -> None:
        """Expect about ``rows`` rows (a restore): size an empty hash index for them once
        instead of growing it by doubling."""
        if self.spec.sparse and self.n == 0 and not isinstance(self.index, DirectIndex):
            self.index = new_index(self.spec, self.part, self.shard_id, self.keys.take1, rows)

    def num_rows(self) -> int:
        return self.n

    def nbytes(self) -> int:
        """Memory this table takes on the shard: rows and state, keys, index, admission."""
        if not self.spec.sparse:
            return self.rows.nbytes()
        # Rows in use, not the pages' capacity: the unwritten tail of a page is not resident.
        used = self.rows.nbytes(self.n)
        total = used + self.keys.nbytes(self.n) + self.index.nbytes()
        if self.stamps is not None:
            total += self.stamps.nbytes(self.n)
        if self.admission is not None:
            total += self.admission.nbytes()
        return total


class FrozenTable:
    """One table's rows as :meth:`Table.freeze` copied them (or a worker's held table,
    learners/worker/held_table.py); exported as the table exports. ``table``: anything with the
    table's ``spec``, ``cols`` (weight columns) and ``slots`` (optimizer slot -> columns)."""

    def __init__(self, table: Any, keys: np.ndarray, rows: np.ndarray) -> None:
        self.spec, self.cols, self.slots = table.spec, table.cols, table.slots
        self.n = len(rows)
        self.keys, self.rows = keys, rows

    def export_chunks(
        self, chunk: int | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
        """As :meth:`Table.export_chunks`, from the copy."""
        return _chunks(self, self.keys, lambda slots: self.rows.take(slots, axis=0), chunk)


def _chunks(
    t: Table | FrozenTable,
    keys: np.ndarray,
    gather: Callable[[np.ndarray], np.ndarray],
    chunk: int | None,
) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """(keys, rows, state) of ``t``'s ``n`` rows (``keys``: each slot's key) in ascending key
    order, in chunks of ``chunk`` rows (default :data:`CHUNK_ROWS`; at least one, maybe
    empty); ``gather`` reads rows by slot."""
    chunk = chunk or CHUNK_ROWS
    if t.spec.sparse:
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
    else:
        order = np.arange(t.n, dtype=np.int64)
    for a in range(0, max(t.n, 1), chunk):
        block = gather(order[a : a + chunk])
        state = {k: np.ascontiguousarray(block[:, x:y]) for k, (x, y) in t.slots.items()}
        yield keys[a : a + chunk], np.ascontiguousarray(block[:, : t.cols]), state


def _is_range(keys: np.ndarray) -> bool:
    """Strictly increasing ``keys`` (every caller guarantees it) that form one block."""
    return int(keys[-1]) - int(keys[0]) == len(keys) - 1


def new_table(
    spec: TableSpec,
    part: Partitioner,
    shard_id: int,
    device: str | None,
    min_count: int = 0,
    ttl: int = 0,
) -> Table:
    """Host numpy storage (``device`` None) or torch tensors on ``device``; ``min_count`` > 1
    turns admission on, ``ttl`` > 0 expiry (sparse tables)."""
    return Table(spec, part, shard_id, device, min_count, ttl)
