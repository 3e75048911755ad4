"""Row storage of one shard: the rows of one table that a shard holds, and their optimizer state.

:class:`Table` keeps them in numpy arrays; :class:`TorchTable` as torch tensors on a device (a
CUDA device for shards with ``angel.ps.gpus > 0``). Layout:

* dense: one contiguous block ``[lo, hi)`` (local row = key - lo);
* sparse: rows stored in insertion order (``keys[slot]`` is the key of each storage slot, the
  capacity doubling as rows arrive) and found through one of two key indexes, chosen per table
  when the shard is built:

  - direct (bounded tables, ``rows > 0``, whose key span on this shard is at most
    ``DIRECT_MAX`` keys): an array over the span holding ``slot + 1`` per key (0 = absent),
    so a lookup is one gather instead of a binary search (lookups run on every pull and push;
    docs/benchmarks-ps.md has the figures). It is allocated zeroed (calloc), so only the pages
    that keys land in take memory;
  - sorted (``rows == -1``, any int64 key, or a span too large): a sorted key array searched
    with ``searchsorted`` (the client sends each shard its keys sorted, which keeps the
    lookups cache-friendly).

  A row is created on its first pull or push with :func:`angelps.table.init_rows`, so its
  initial value depends only on (seed, key); the rows new in one call are created in sorted
  key order, so both indexes give the same storage layout, rows and checkpoints.

Invariants: callers pass keys that are unique and strictly increasing, already checked against
the table (:mod:`angelps.shard` validates); an update gathers the rows, applies the table's
optimizer (:func:`angelps.optim.apply`) and scatters them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from angelps.optim import apply, slot_widths
from angelps.partition import Partitioner
from angelps.table import TableSpec, init_rows

__all__ = ["DIRECT_MAX", "Table", "TorchTable", "new_table"]

# Dense blocks are initialised in chunks to bound the float64 temporaries.
_INIT_CHUNK = 1 << 18

# The largest key span (keys) of a bounded sparse table on one shard that gets a direct index
# (8 bytes a key of address space, materialised only where keys land); larger spans, and
# unbounded tables, use the sorted index.
DIRECT_MAX = 1 << 30


class Table:
    """The rows of one table held by one shard, and their optimizer state."""

    def __init__(self, spec: TableSpec, part: Partitioner, shard_id: int) -> None:
        self.spec = spec
        self.part = part
        self.dtype = np.dtype(spec.dtype)
        self.widths = slot_widths(spec.optimizer, spec.cols)
        # numpy arrays here; torch tensors in TorchTable.
        self.w: Any
        self.state: dict[str, Any]
        # Sparse tables: key of each storage slot (insertion order, capacity grown with the rows).
        self.keys = np.zeros(0, dtype=np.int64)
        self.index_kind = "dense"
        if spec.sparse:
            self.lo = self.hi = 0
            self.n = 0
            span = _direct_span(spec, part, shard_id)
            if span is not None:
                self.index_kind = "direct"
                self.base = span[0]  # index[key - base] = slot + 1, 0 = row absent
                # np.zeros is calloc: the pages of the index are only materialised when a key
                # lands in them, so an index over a large but sparsely touched range costs
                # little real memory. int32 (a shard holds < DIRECT_MAX rows of a table) halves
                # it: under hash partitioning every shard's index spans all of [0, rows).
                self.index = np.zeros(span[1] - span[0], dtype=np.int32)
            else:
                self.index_kind = "sorted"
                self.skeys = np.zeros(0, dtype=np.int64)  # sorted keys
                self.sslot = np.zeros(0, dtype=np.int64)  # storage slot of skeys[i]
            self.w = np.zeros((0, spec.cols), dtype=self.dtype)
            self.state = {k: np.zeros((0, w), dtype=self.dtype) for k, w in self.widths.items()}
        else:
            self.lo, self.hi = part.row_range(shard_id)
            self.n = self.hi - self.lo
            self.w = np.empty((self.n, spec.cols), dtype=self.dtype)
            for a in range(0, self.n, _INIT_CHUNK):
                b = min(a + _INIT_CHUNK, self.n)
                self.w[a:b] = init_rows(spec, np.arange(self.lo + a, self.lo + b))
            self.state = {
                k: np.zeros((self.n, w), dtype=self.dtype) for k, w in self.widths.items()
            }

    # --- lookup --------------------------------------------------------------------------------

    def check_owned(self, keys: np.ndarray) -> None:
        if not keys.size:
            return
        if self.index_kind == "direct":
            # Keys outside the span of a direct index (a range-partitioned table's key sent to
            # the wrong shard) have no index entry: reject them before anything changes.
            lo, hi = int(keys.min()), int(keys.max())
            end = self.base + len(self.index)
            if lo < self.base or hi >= end:
                bad = lo if lo < self.base else hi
                raise ValueError(
                    f"table {self.spec.name!r}: key {bad} is not held by this shard "
                    f"(keys [{self.base}, {end}))"
                )
            return
        if not self.spec.sparse:
            lo, hi = int(keys.min()), int(keys.max())
            if lo < self.lo or hi >= self.hi:
                bad = lo if lo < self.lo else hi
                raise ValueError(
                    f"table {self.spec.name!r}: key {bad} is not held by this shard "
                    f"(rows [{self.lo}, {self.hi}))"
                )

    def _grow(self, need: int) -> None:
        """Capacity for ``need`` sparse rows: slot keys, rows and optimizer state."""
        cap = len(self.keys)
        if need <= cap:
            return
        new_cap = max(need, 2 * cap, 1024)
        keys = np.empty(new_cap, dtype=np.int64)
        keys[: self.n] = self.keys[: self.n]
        self.keys = keys
        self._grow_rows(new_cap)

    def _grow_rows(self, new_cap: int) -> None:
        w = np.empty((new_cap, self.spec.cols), dtype=self.dtype)
        w[: self.n] = self.w[: self.n]
        self.w = w
        for k, width in self.widths.items():
            s = np.zeros((new_cap, width), dtype=self.dtype)
            s[: self.n] = self.state[k][: self.n]
            self.state[k] = s

    def _write_new(self, start: int, values: np.ndarray) -> None:
        """Initial values (and zero optimizer state) of newly created rows from ``start``."""
        end = start + len(values)
        self.w[start:end] = values
        for k in self.state:
            self.state[k][start:end] = 0

    def locate(self, keys: np.ndarray, create: bool = True) -> np.ndarray:
        """Storage slots of unique ``keys``; sparse rows missing are created (initialised)."""
        if not self.spec.sparse:
            return keys - self.lo
        if self.index_kind == "direct":
            slots = (self.index[keys - self.base] if self.base else self.index[keys]).astype(
                np.int64
            )
            found = slots > 0
            slots -= 1
        else:
            n = len(self.skeys)
            pos = np.searchsorted(self.skeys, keys)
            if n:
                found = self.skeys[np.minimum(pos, n - 1)] == keys
            else:
                found = np.zeros(len(keys), dtype=bool)
            slots = np.empty(len(keys), dtype=np.int64)
            slots[found] = self.sslot[pos[found]]
        if found.all():
            return slots
        if not create:
            raise KeyError("missing sparse rows")
        missing = ~found
        new_keys = keys[missing]
        order = np.argsort(new_keys, kind="stable")
        new_sorted = new_keys[order]
        m = len(new_keys)
        self._grow(self.n + m)
        new_slots = np.arange(self.n, self.n + m, dtype=np.int64)
        self._write_new(self.n, init_rows(self.spec, new_sorted))
        self.keys[self.n : self.n + m] = new_sorted
        self.n += m
        if self.index_kind == "direct":
            self.index[new_sorted - self.base] = new_slots + 1
        else:
            ins = np.searchsorted(self.skeys, new_sorted)
            self.skeys = np.insert(self.skeys, ins, new_sorted)
            self.sslot = np.insert(self.sslot, ins, new_slots)
        got = np.empty(m, dtype=np.int64)
        got[order] = new_slots
        slots[missing] = got
        return slots

    def sorted_slots(self) -> np.ndarray:
        """Storage slots of the sparse rows held, in ascending key order."""
        if self.index_kind == "sorted":
            return self.sslot  # the sorted index is that order already: no sort needed
        return np.argsort(self.keys[: self.n], kind="stable")

    # --- operations ----------------------------------------------------------------------------

    def read(self, keys: np.ndarray | None) -> np.ndarray:
        if keys is None:
            if self.spec.sparse:
                raise ValueError(f"table {self.spec.name!r} is sparse: pull needs keys")
            return self.w.copy()
        if not self.spec.sparse and len(keys) and _is_range(keys):
            a = int(keys[0]) - self.lo
            return self.w[a : a + len(keys)].copy()  # a contiguous block: a copy, no gather
        slots = self.locate(keys)  # first: creating rows may reallocate self.w
        return self.w[slots]

    def update(self, keys: np.ndarray, grads: np.ndarray, lr: float) -> None:
        if not self.spec.sparse and len(keys) and _is_range(keys):
            # A contiguous block of a dense table: update views in place, no gather/scatter.
            a = int(keys[0]) - self.lo
            b = a + len(keys)
            view = {k: v[a:b] for k, v in self.state.items()}
            apply(self.spec.optimizer, self.w[a:b], view, grads, lr)
            return
        slots = self.locate(keys)
        w = self.w[slots]
        state = {k: v[slots] for k, v in self.state.items()}
        apply(self.spec.optimizer, w, state, grads, lr)
        self.w[slots] = w
        for k, v in state.items():
            self.state[k][slots] = v

    def export(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(keys sorted, rows, state) copies of everything this shard holds."""
        if self.spec.sparse:
            slots = self.sorted_slots()
            return (
                self.keys[slots],
                self.w[slots],
                {k: v[slots] for k, v in self.state.items()},
            )
        keys = np.arange(self.lo, self.hi, dtype=np.int64)
        return keys, self.w.copy(), {k: v.copy() for k, v in self.state.items()}

    def assign(self, keys: np.ndarray, w: np.ndarray, state: Mapping[str, np.ndarray]) -> None:
        """Overwrite rows (and state) of unique ``keys`` (checkpoint restore)."""
        slots = self.locate(keys)
        self.w[slots] = w
        for k in self.state:
            self.state[k][slots] = state[k]

    def num_rows(self) -> int:
        return self.n


class TorchTable(Table):
    """A table whose rows and optimizer state are torch tensors on ``device`` (a CUDA device for
    shards with ``angel.ps.gpus > 0``): the sparse key index stays in host numpy, gathers,
    scatters and optimizer updates run on the device, and rows cross to the host only when
    pulled."""

    def __init__(self, spec: TableSpec, part: Partitioner, shard_id: int, device: str) -> None:
        super().__init__(spec, part, shard_id)
        self.device = torch.device(device)
        self.w = torch.from_numpy(self.w).to(self.device)  # type: ignore[assignment]
        self.state = {
            k: torch.from_numpy(v).to(self.device)  # type: ignore[misc]
            for k, v in self.state.items()
        }

    def _index(self, slots: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(slots)).to(self.device)

    def _grow_rows(self, new_cap: int) -> None:
        w = torch.empty((new_cap, self.spec.cols), dtype=self.w.dtype, device=self.device)
        w[: self.n] = self.w[: self.n]
        self.w = w  # type: ignore[assignment]
        for k, width in self.widths.items():
            st = torch.zeros((new_cap, width), dtype=self.w.dtype, device=self.device)
            st[: self.n] = self.state[k][: self.n]
            self.state[k] = st  # type: ignore[assignment]

    def _write_new(self, start: int, values: np.ndarray) -> None:
        end = start + len(values)
        self.w[start:end] = torch.from_numpy(values).to(self.device)
        for k in self.state:
            self.state[k][start:end] = 0

    def read(self, keys: np.ndarray | None) -> np.ndarray:
        if keys is None:
            if self.spec.sparse:
                raise ValueError(f"table {self.spec.name!r} is sparse: pull needs keys")
            return _host(self.w)
        if not self.spec.sparse and len(keys) and _is_range(keys):
            a = int(keys[0]) - self.lo
            return _host(self.w[a : a + len(keys)])
        idx = self._index(self.locate(keys))
        return _host(self.w.index_select(0, idx))

    def update(self, keys: np.ndarray, grads: np.ndarray, lr: float) -> None:
        g = torch.from_numpy(np.ascontiguousarray(grads)).to(self.device)
        if not self.spec.sparse and len(keys) and _is_range(keys):
            a = int(keys[0]) - self.lo
            b = a + len(keys)
            view = {k: v[a:b] for k, v in self.state.items()}
            apply(self.spec.optimizer, self.w[a:b], view, g, lr)
            return
        idx = self._index(self.locate(keys))
        w = self.w.index_select(0, idx)
        state = {k: v.index_select(0, idx) for k, v in self.state.items()}
        apply(self.spec.optimizer, w, state, g, lr)
        self.w.index_copy_(0, idx, w)
        for k, v in state.items():
            self.state[k].index_copy_(0, idx, v)

    def export(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        if self.spec.sparse:
            slots = self.sorted_slots()
            idx = self._index(slots)
            return (
                self.keys[slots],
                _host(self.w.index_select(0, idx)),
                {k: _host(v.index_select(0, idx)) for k, v in self.state.items()},
            )
        keys = np.arange(self.lo, self.hi, dtype=np.int64)
        return keys, _host(self.w), {k: _host(v) for k, v in self.state.items()}

    def assign(self, keys: np.ndarray, w: np.ndarray, state: Mapping[str, np.ndarray]) -> None:
        idx = self._index(self.locate(keys))
        self.w.index_copy_(0, idx, torch.from_numpy(np.ascontiguousarray(w)).to(self.device))
        for k in self.state:
            src = torch.from_numpy(np.ascontiguousarray(state[k])).to(self.device)
            self.state[k].index_copy_(0, idx, src)


def _direct_span(spec: TableSpec, part: Partitioner, shard_id: int) -> tuple[int, int] | None:
    """``[lo, hi)`` of the keys a bounded sparse table can send this shard, when it is small
    enough for a direct index (``DIRECT_MAX``); None otherwise (and for ``rows == -1``)."""
    if not (spec.sparse and spec.rows > 0):
        return None
    lo, hi = part.row_range(shard_id) if part.kind == "range" else (0, spec.rows)
    return (lo, hi) if hi - lo <= DIRECT_MAX else None


def _host(t: torch.Tensor) -> np.ndarray:
    """A host numpy copy (never a view of the table, also for tensors already on the CPU)."""
    return t.to("cpu", copy=True).numpy()  # type: ignore[no-any-return]


def _is_range(keys: np.ndarray) -> bool:
    """Strictly increasing ``keys`` (every caller guarantees it) that form one block."""
    return int(keys[-1]) - int(keys[0]) == len(keys) - 1


def new_table(spec: TableSpec, part: Partitioner, shard_id: int, device: str | None) -> Table:
    """Host numpy storage (``device`` None) or torch tensors on ``device``."""
    if device is None:
        return Table(spec, part, shard_id)
    return TorchTable(spec, part, shard_id, device)
