"""One parameter shard: a plain class (:class:`ParameterShard`, testable without Ray) and its Ray
actor (:class:`ShardServer`, an asyncio actor that adds the BSP/SSP/ASP waiting, backups and
restart recovery).

A shard holds, for every table, the rows the partitioner assigns to it plus their optimizer
state, in numpy arrays (or torch tensors on a device, ``_TorchTable``, for GPU shards):

* dense: one contiguous block ``[lo, hi)`` (local row = key - lo);
* sparse: rows stored in insertion order (``keys[slot]`` is the key of each storage slot) and
  found through one of two key indexes, chosen per table when the shard is built:

  - direct (bounded tables, ``rows > 0``, whose key span on this shard is at most
    ``_DIRECT_MAX`` keys): an array over the span holding ``slot + 1`` per key (0 = absent),
    so a lookup is one gather. Lookups run on every pull and push of every table: with 14.9M
    rows held, ``searchsorted`` of 53k sorted keys costs 21.6 ms against 0.4 ms for the
    gather. It is allocated zeroed (calloc), so only the pages that keys land in take memory;
  - sorted (``rows == -1``, any int64 key, or a span too large): a sorted key array searched
    with ``searchsorted`` (the client sends each shard its keys sorted, which keeps the
    lookups cache-friendly).

  A row is created on its first pull or push with :func:`angelps.table.init_rows`, so its
  initial value depends only on (seed, key); the rows new in one call are created in sorted
  key order, so both indexes give the same storage layout, rows and checkpoints.

Every push is validated completely (tables, key ranges, shapes, dtypes, finiteness) before any
row is touched, so a rejected push leaves the shard unchanged.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from angelps import wire
from angelps.checkpoint import (
    CheckpointError,
    read_backup,
    read_table_file,
    table_file,
    write_backup,
    write_table_file,
)
from angelps.consistency import READER, ClockTable
from angelps.optim import apply, apply_torch, slot_widths
from angelps.partition import PARTITIONERS, Partitioner, dedup
from angelps.table import TableSpec, init_rows

__all__ = [
    "NAN_POLICIES",
    "ParameterShard",
    "ShardRestarted",
    "ShardServer",
    "all_finite",
    "check_lr",
    "segment_sum",
    "strictly_increasing",
]

NAN_POLICIES = ("error", "skip")

# Dense blocks are initialised in chunks to bound the float64 temporaries.
_INIT_CHUNK = 1 << 18

# The largest key span (keys) of a bounded sparse table on one shard that gets a direct index
# (8 bytes a key of address space, materialised only where keys land); larger spans, and
# unbounded tables, use the sorted index.
_DIRECT_MAX = 1 << 30


def segment_sum(inv: np.ndarray, values: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    """``out[i] = sum(values[inv == i])`` for ``i < n``, accumulated in float64.

    A flattened ``np.bincount``: deterministic and single-threaded (torch's multithreaded
    ``index_add_`` was 3-5x slower on 2 busy cores).
    """
    cols = values.shape[1]
    if cols == 1:
        out = np.bincount(inv, weights=values[:, 0], minlength=n)
        return out.astype(dtype).reshape(n, 1)
    idx = (inv[:, None] * cols + np.arange(cols, dtype=np.int64)).ravel()
    out = np.bincount(idx, weights=values.ravel(), minlength=n * cols)
    return out.astype(dtype).reshape(n, cols)


def all_finite(a: np.ndarray) -> bool:
    """No NaN or inf in ``a``. A finite sum proves it without a boolean temporary (NaN and inf
    propagate through a sum); only a non-finite sum, which may be an overflow, is checked
    element by element."""
    if a.size == 0:
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        total = a.sum(dtype=np.float64)
    if np.isfinite(total):
        return True
    return bool(np.isfinite(a).all())


def check_lr(lr: Any) -> float:
    """The step size of a push: a finite number >= 0."""
    try:
        value = float(lr)
    except (TypeError, ValueError):
        raise ValueError(f"learning rate {lr!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"learning rate {lr!r} must be a finite number >= 0")
    return value


def check_keys(spec: TableSpec, keys: Any) -> np.ndarray:
    """Keys as a 1-D int64 array, checked against the table's range."""
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(f"table {spec.name!r}: keys must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise ValueError(f"table {spec.name!r}: keys must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 2**63:
        raise ValueError(f"table {spec.name!r}: key {int(arr.max())} does not fit in int64")
    arr = arr.astype(np.int64, copy=False)
    if spec.rows > 0 and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= spec.rows:
            bad = lo if lo < 0 else hi
            kind = "sparse index" if spec.sparse else "dense"
            raise ValueError(
                f"table {spec.name!r}: key {bad} is outside the {kind} range [0, {spec.rows})"
            )
    return arr


def check_grads(spec: TableSpec, n: int, grads: Any) -> np.ndarray:
    """Gradients as a ``[n, cols]`` array of the table's dtype."""
    arr = np.asarray(grads)
    if arr.dtype.kind != "f":
        raise ValueError(
            f"table {spec.name!r}: gradients must be floating point, got dtype {arr.dtype}"
        )
    if arr.ndim == 1 and spec.cols == 1:
        arr = arr.reshape(-1, 1)
    if arr.shape != (n, spec.cols):
        raise ValueError(
            f"table {spec.name!r}: gradients of shape {arr.shape} do not match "
            f"{n} keys x {spec.cols} columns"
        )
    return arr.astype(spec.dtype, copy=False)


class _Table:
    """The rows of one table held by one shard, and their optimizer state."""

    def __init__(self, spec: TableSpec, part: Partitioner, shard_id: int) -> None:
        self.spec = spec
        self.part = part
        self.dtype = np.dtype(spec.dtype)
        self.widths = slot_widths(spec.optimizer, spec.cols)
        # numpy arrays here; torch tensors in _TorchTable.
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
                # little real memory. int32 (a shard holds < _DIRECT_MAX rows of a table) halves
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


class _TorchTable(_Table):
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
            apply_torch(self.spec.optimizer, self.w[a:b], view, g, lr)
            return
        idx = self._index(self.locate(keys))
        w = self.w.index_select(0, idx)
        state = {k: v.index_select(0, idx) for k, v in self.state.items()}
        apply_torch(self.spec.optimizer, w, state, g, lr)
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
    enough for a direct index (``_DIRECT_MAX``); None otherwise (and for ``rows == -1``)."""
    if not (spec.sparse and spec.rows > 0):
        return None
    lo, hi = part.row_range(shard_id) if part.kind == "range" else (0, spec.rows)
    return (lo, hi) if hi - lo <= _DIRECT_MAX else None


def _host(t: torch.Tensor) -> np.ndarray:
    """A host numpy copy (never a view of the table, also for tensors already on the CPU)."""
    return t.to("cpu", copy=True).numpy()  # type: ignore[no-any-return]


def _is_range(keys: np.ndarray) -> bool:
    """Strictly increasing ``keys`` (every caller guarantees it) that form one block."""
    return int(keys[-1]) - int(keys[0]) == len(keys) - 1


def strictly_increasing(keys: np.ndarray) -> bool:
    """Sorted and unique (the client sends shards keys in this form)."""
    return len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1]))


class ParameterShard:
    """Shard ``shard_id`` of ``num_shards``: the rows it owns of every table, and the clocks.

    ``push`` applies (or, under BSP with several workers, buffers) one worker's gradients for
    one clock; ``pull`` returns rows. Clock waiting is the actor's job: the plain class asserts
    that a push arrives in clock order and serves pulls immediately.
    """

    def __init__(
        self,
        shard_id: int,
        num_shards: int,
        tables: Sequence[TableSpec],
        partitioner: str = "hash",
        num_workers: int = 1,
        staleness: int = 0,
        nan_policy: str = "error",
        device: str | None = None,
    ) -> None:
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard id {shard_id} is out of range for {num_shards} shards")
        policy = str(nan_policy).lower()
        if policy not in NAN_POLICIES:
            raise ValueError(
                f"angel.ps.nan.policy={nan_policy!r} is not one of {', '.join(NAN_POLICIES)}"
            )
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        self.shard_id = shard_id
        self.num_shards = num_shards
        self.partitioner = str(partitioner).lower()
        if self.partitioner not in PARTITIONERS:
            raise ValueError(
                f"angel.ps.partitioner={partitioner!r} is not one of {', '.join(PARTITIONERS)}"
            )
        self.nan_policy = policy
        self.specs = {t.name: t for t in tables}
        # None: rows in host numpy arrays; a torch device ("cuda", "cuda:1", "cpu"): rows and
        # optimizer state as torch tensors there.
        if device is not None:
            dev = torch.device(device)
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(
                    f"shard {shard_id}: device {device!r} requested (angel.ps.gpus > 0) but "
                    f"CUDA is not available on this node"
                )
        self.device = device
        self.clocks: ClockTable = ClockTable(num_workers, staleness)
        self.reset(self.clocks)

    def reset(self, clocks: ClockTable | None = None) -> None:
        """Back to freshly initialised tables and zero clocks (before a restore)."""
        if clocks is None:
            clocks = ClockTable(self.clocks.num_workers, self.clocks.staleness)
        self.tables = {t.name: self._new_table(t) for t in self.specs.values()}
        self.clocks = clocks
        # BSP with several workers: clock -> table -> list of (keys, grads); clock -> lr.
        self._pending: dict[int, dict[str, list[tuple[np.ndarray, np.ndarray]]]] = {}
        self._pending_lr: dict[int, float] = {}
        self.skipped: dict[str, int] = {name: 0 for name in self.specs}
        self.updates = 0  # optimizer updates applied (per table push)

    def _new_table(self, spec: TableSpec) -> _Table:
        part = Partitioner(spec, self.num_shards, self.partitioner)
        if self.device is None:
            return _Table(spec, part, self.shard_id)
        return _TorchTable(spec, part, self.shard_id, self.device)

    # --- validation ----------------------------------------------------------------------------

    def _table(self, name: str) -> _Table:
        try:
            return self.tables[name]
        except KeyError:
            raise ValueError(
                f"unknown table {name!r}; tables: {', '.join(sorted(self.tables)) or '(none)'}"
            ) from None

    def _validate(
        self, updates: Mapping[str, tuple[Any, Any]]
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Checked, deduplicated (keys strictly increasing, duplicate grads summed) updates;
        tables with non-finite gradients dropped (policy skip) or rejected (policy error)."""
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, (keys, grads) in updates.items():
            t = self._table(name)
            k = check_keys(t.spec, keys)
            t.check_owned(k)
            g = check_grads(t.spec, len(k), grads)
            if not all_finite(g):
                if self.nan_policy == "error":
                    raise ValueError(
                        f"table {name!r}: gradient contains NaN or inf "
                        f"(angel.ps.nan.policy=error; set it to skip to drop such updates)"
                    )
                self.skipped[name] += 1
                continue
            if not strictly_increasing(k):
                uniq, inv = dedup(k)
                g = segment_sum(inv, g, len(uniq), t.dtype)
                k = uniq
            out[name] = (k, g)
        return out

    # --- operations ----------------------------------------------------------------------------

    def push(
        self,
        worker: int,
        clock: int,
        updates: Mapping[str, tuple[Any, Any]],
        lr: float,
    ) -> None:
        """Apply worker ``worker``'s gradients for ``clock`` (see :mod:`angelps.consistency`).

        Under BSP the pushes of one clock are summed over the workers and applied as one
        optimizer update (with the step size of the first push of that clock) when the last
        worker's push arrives; under SSP/ASP each push is applied at once.
        """
        clocks = self.clocks
        clocks.check_worker(worker)
        if worker == READER:
            raise ValueError("a reader client (worker id -1) cannot push")
        if not clocks.can_push(worker, clock):
            raise ValueError(
                f"shard {self.shard_id}: worker {worker} pushed clock {clock} but its next "
                f"clock is {clocks.pushed[worker]}"
            )
        lr = check_lr(lr)
        checked = self._validate(updates)
        if not clocks.bsp or clocks.num_workers == 1:
            for name, (k, g) in checked.items():
                self.tables[name].update(k, g, lr)
                self.updates += 1
            clocks.record_push(worker)
            if clocks.bsp:
                clocks.mark_applied()
            return
        bucket = self._pending.setdefault(clock, {})
        self._pending_lr.setdefault(clock, lr)
        for name, kg in checked.items():
            bucket.setdefault(name, []).append(kg)
        clocks.record_push(worker)
        while clocks.complete_clock():
            c = clocks.applied
            self._apply_merged(self._pending.pop(c, {}), self._pending_lr.pop(c, lr))
            clocks.mark_applied()

    def _apply_merged(
        self, bucket: Mapping[str, list[tuple[np.ndarray, np.ndarray]]], lr: float
    ) -> None:
        for name, parts in bucket.items():
            t = self.tables[name]
            if len(parts) == 1:
                k, g = parts[0]
            else:
                keys = np.concatenate([p[0] for p in parts])
                grads = np.concatenate([p[1] for p in parts])
                k, inv = dedup(keys)
                g = segment_sum(inv, grads, len(k), t.dtype)
            t.update(k, g, lr)
            self.updates += 1

    def pull(self, requests: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Rows of the requested keys, per table, in the order of the keys. ``None`` as the
        keys of a dense table means this shard's whole block."""
        checked: dict[str, np.ndarray | None] = {}
        for name, keys in requests.items():  # validate every table before reading any
            t = self._table(name)
            if keys is None:
                checked[name] = None
                continue
            k = check_keys(t.spec, keys)
            t.check_owned(k)
            checked[name] = k
        out: dict[str, np.ndarray] = {}
        for name, req in checked.items():
            t = self.tables[name]
            if req is None or strictly_increasing(req):
                out[name] = t.read(req)
            else:
                uniq, inv = dedup(req)
                out[name] = t.read(uniq)[inv]
        return out

    def export(self, name: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(keys, rows, optimizer state) of one table, keys sorted (checkpoints)."""
        return self._table(name).export()

    def assign(
        self, name: str, keys: np.ndarray, w: np.ndarray, state: Mapping[str, np.ndarray]
    ) -> None:
        """Overwrite rows and state of ``keys`` (checkpoint restore); keys must be owned here."""
        t = self._table(name)
        k = check_keys(t.spec, keys)
        t.check_owned(k)
        t.assign(k, w, state)

    def save(self, root: str) -> dict[str, Any]:
        """Write this shard's rows and optimizer state of every table under ``root``."""
        rows = {}
        for name, t in self.tables.items():
            keys, w, state = t.export()
            rows[name] = write_table_file(table_file(root, name, self.shard_id), keys, w, state)
        return {"shard": self.shard_id, "rows": rows, "clocks": self.clocks.to_dict()}

    def load(self, root: str, manifest: Mapping[str, Any]) -> dict[str, int]:
        """Replace this shard's content with the rows that the current layout routes here
        from the checkpoint at ``root`` (saved with any number of shards); clocks restart at 0.
        Returns the rows restored per table."""
        saved_shards = int(manifest["num_shards"])
        same_layout = (
            saved_shards == self.num_shards and manifest["partitioner"] == self.partitioner
        )
        self.reset()
        self._pending.clear()
        self._pending_lr.clear()
        restored = {}
        for name, t in self.tables.items():
            n = 0
            sources = [self.shard_id] if same_layout else range(saved_shards)
            for j in sources:
                keys, w, state = read_table_file(table_file(root, name, j))
                if not same_layout:
                    mine = t.part.owns(self.shard_id, keys)
                    keys, w = keys[mine], w[mine]
                    state = {k: v[mine] for k, v in state.items()}
                missing = set(t.state) - set(state)
                if missing or w.shape[1:] != (t.spec.cols,):
                    raise CheckpointError(
                        f"checkpoint {root}: table {name!r} file of shard {j} does not match "
                        f"the table (state slots {sorted(state)}, width {w.shape[1:]})"
                    )
                if len(keys):
                    t.assign(keys, w.astype(t.dtype, copy=False), state)
                n += len(keys)
            restored[name] = n
        return restored

    def backup_meta(self) -> dict[str, Any]:
        """Clocks and counters for a backup. Under BSP, pushes buffered for an incomplete clock
        are not in the rows, so the backup records each worker at the last applied clock: the
        clients replay those pushes after a restart."""
        pushed = list(self.clocks.pushed)
        if self.clocks.bsp:
            pushed = [min(p, self.clocks.applied) for p in pushed]
        return {
            "num_shards": self.num_shards,
            "partitioner": self.partitioner,
            "clocks": {"pushed": pushed, "applied": self.clocks.applied},
            "updates": self.updates,
            "skipped": dict(self.skipped),
        }

    def restore_state(self, meta: Mapping[str, Any]) -> None:
        """Clocks and counters from :meth:`backup_meta` (after :meth:`load`)."""
        self.clocks.pushed = [int(p) for p in meta["clocks"]["pushed"]]
        self.clocks.applied = int(meta["clocks"]["applied"])
        self.updates = int(meta.get("updates", 0))
        self.skipped.update({k: int(v) for k, v in meta.get("skipped", {}).items()})

    def stats(self) -> dict[str, Any]:
        """Rows held, updates applied, skipped (non-finite) pushes, clocks."""
        return {
            "shard": self.shard_id,
            "rows": {n: t.num_rows() for n, t in self.tables.items()},
            "updates": self.updates,
            "skipped": dict(self.skipped),
            "clocks": self.clocks.to_dict(),
        }


class ShardRestarted(Exception):
    """Raised to a worker whose calls run ahead of a restarted shard: the shard restored its
    backup at ``clock`` for this worker, so the worker must replay its pushes from there."""

    def __init__(self, shard: int, worker: int, clock: int) -> None:
        super().__init__(
            f"shard {shard} was restarted and restored its backup at clock {clock} of worker "
            f"{worker}; the client replays its pushes from that clock"
        )
        self.shard = shard
        self.worker = worker
        self.clock = clock

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardRestarted, (self.shard, self.worker, self.clock))


class ShardServer:
    """Body of the Ray actor around a :class:`ParameterShard`.

    An asyncio actor: the numpy work runs on the event loop (one operation at a time, so no
    locks around the arrays), while calls that must wait for other workers' clocks park on a
    condition variable without blocking the actor. ``step`` is the one call per shard per step:
    apply a push (if any), then serve a pull (if any).

    Backups (``angel.ps.backup.interval`` > 0): every ``interval`` applied updates the shard
    writes its partition, optimizer state and clocks under its backup directory (Parquet, a new
    version directory, then an atomic ``LATEST`` pointer). When Ray restarts a dead shard, the
    constructor restores the latest backup, and every worker whose calls are ahead of the
    restored clock gets :class:`ShardRestarted` until its client has replayed the pushes it
    logged since that backup (the client learns the backup clock from each reply and trims its
    log). Updates are thus redone, never silently dropped.
    """

    def __init__(
        self,
        shard_id: int,
        num_shards: int,
        tables: Sequence[Mapping[str, Any]],
        options: Mapping[str, Any],
    ) -> None:
        specs = [TableSpec.from_dict(t) for t in tables]
        self.shard = ParameterShard(
            shard_id,
            num_shards,
            specs,
            partitioner=options.get("partitioner", "hash"),
            num_workers=int(options.get("num_workers", 1)),
            staleness=int(options.get("staleness", 0)),
            nan_policy=options.get("nan_policy", "error"),
            device=options.get("device"),
        )
        self.timeout_s = float(options.get("timeout_ms", 120000)) / 1000.0
        self.backup_interval = int(options.get("backup_interval", 0))
        root = options.get("backup_dir") or ""
        self.backup_dir = os.path.join(root, f"shard-{shard_id}") if root else ""
        self._since_backup = 0
        self.backup_clocks = [0] * self.shard.clocks.num_workers
        self.restarted = False
        self._awaiting_replay: set[int] = set()
        self._cond: asyncio.Condition | None = None
        # The data plane (angelps.wire): a TCP server opened by serve(), guarded by the token.
        self._token = str(options.get("token", "")).encode()
        self._server: asyncio.Server | None = None
        if self.backup_dir and _was_restarted():
            self._restore_backup()

    # --- backups -------------------------------------------------------------------------------

    def _restore_backup(self) -> None:
        self.restarted = True
        self._awaiting_replay = set(range(self.shard.clocks.num_workers))
        info = read_backup(self.backup_dir)
        if info is None:
            return  # died before its first backup: clients replay from clock 0
        root, meta = info
        self.shard.load(root, meta)
        self.shard.restore_state(meta)
        self.backup_clocks = list(meta["clocks"]["pushed"])

    def backup(self) -> list[int]:
        """Write a backup now; returns the per-worker clocks it holds."""
        if not self.backup_dir:
            raise ValueError(
                "shard backups are off: set angel.ps.backup.interval > 0 (and "
                "angel.ps.backup.path) to enable them"
            )
        meta = self.shard.backup_meta()
        write_backup(self.backup_dir, self.shard, meta)
        self.backup_clocks = list(meta["clocks"]["pushed"])
        self._since_backup = 0
        return self.backup_clocks

    def _after_push(self) -> None:
        if self.backup_interval > 0:
            self._since_backup += 1
            if self._since_backup >= self.backup_interval:
                self.backup()

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

    async def step(
        self,
        worker: int,
        clock: int,
        pushes: Mapping[str, tuple[Any, Any]] | None,
        lr: float,
        pulls: Mapping[str, Any] | None,
        recovering: bool = False,
    ) -> tuple[dict[str, np.ndarray] | None, int]:
        """Push (worker's gradients for ``clock``), then pull at the clock after it. Returns
        (rows or None, the clock of this worker held by the latest backup).

        After a restart, a worker's calls are refused with :class:`ShardRestarted` until one
        arrives that its client sent knowing of the restart (``recovering``: a replayed push
        or a redone pull; Ray may deliver those out of order, so they wait for their clock
        instead) or that is not ahead of the restored clock."""
        shard = self.shard
        shard.clocks.check_worker(worker)
        if worker in self._awaiting_replay:
            if not recovering and clock > shard.clocks.pushed[worker]:
                raise ShardRestarted(shard.shard_id, worker, shard.clocks.pushed[worker])
            self._awaiting_replay.discard(worker)
        if pushes is not None:
            await self._wait(
                lambda: shard.clocks.pushed[worker] >= clock,
                f"worker {worker}'s push for clock {clock}",
            )
            if shard.clocks.can_push(worker, clock):
                before = shard.clocks.applied if shard.clocks.bsp else -1
                shard.push(worker, clock, pushes, lr)
                if shard.clocks.applied != before:
                    self._after_push()
                await self._notify()
            # else: a duplicate of a push already applied (a retried call): ignore it.
            clock += 1
        backed_up = self.backup_clocks[worker] if worker >= 0 else 0
        if not pulls:
            return None, backed_up
        await self._wait(
            lambda: shard.clocks.can_pull(worker, clock),
            f"worker {worker}'s pull at clock {clock}",
        )
        return shard.pull(pulls), backed_up

    async def clock_of(self, worker: int) -> int:
        """The next clock this shard expects from ``worker`` (after a restart: the backup's)."""
        return self.shard.clocks.pushed[worker]

    async def run_backup(self) -> list[int]:
        return self.backup()

    async def stats(self) -> dict[str, Any]:
        st = self.shard.stats()
        st["restarted"] = self.restarted
        st["backup_clocks"] = list(self.backup_clocks)
        st["pid"] = os.getpid()  # (operators and chaos tests find the process by it)
        return st

    async def save(self, root: str) -> dict[str, Any]:
        return self.shard.save(root)

    async def load(self, root: str, manifest: Mapping[str, Any]) -> dict[str, int]:
        restored = self.shard.load(root, manifest)
        self.backup_clocks = [0] * self.shard.clocks.num_workers
        self._awaiting_replay.clear()
        if self.backup_dir:
            self.backup()  # a restart must come back to the loaded model, not an older backup
        await self._notify()
        return restored

    async def ping(self) -> int:
        return self.shard.shard_id

    # --- the data plane ----------------------------------------------------------------------

    async def serve(self, host: str) -> tuple[str, int]:
        """Listen for ``step`` calls over TCP on ``host`` (angelps.wire); returns the address.

        Idempotent: every client of the job connects to the same server. The server runs on
        the actor's event loop, so its calls interleave with actor calls exactly as actor
        calls interleave with each other (one at a time, waiting only for clocks).
        """
        if not self._token:
            raise ValueError("this shard has no data-plane token (launched without one)")
        if self._server is None:
            if not host:  # a cluster: this node's address, reachable from other nodes
                import ray

                host = ray.util.get_node_ip_address()
            self._server = await asyncio.start_server(self._serve_connection, host, 0)
        addr = self._server.sockets[0].getsockname()
        return str(addr[0]), int(addr[1])

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One client's connection: the token, then its calls in order, each answered."""
        try:
            token = await reader.readexactly(wire.TOKEN_BYTES)
            if not self._token or token != self._token[: wire.TOKEN_BYTES]:
                return
            while True:
                try:
                    prefix = await reader.readexactly(wire.PREFIX.size)
                except asyncio.IncompleteReadError:
                    return  # the client went away
                hlen, blen = wire.PREFIX.unpack(prefix)
                if hlen > wire.MAX_HEADER:
                    return  # not a frame of ours: drop the connection
                header = await reader.readexactly(hlen)
                body = await reader.readexactly(blen) if blen else b""
                try:
                    rows, backed_up = await self.step(**wire.decode_request(header, body))
                    frame = wire.encode_reply(rows, backed_up)
                except ShardRestarted as e:
                    frame = wire.encode_error(
                        "ShardRestarted", str(e), [e.shard, e.worker, e.clock]
                    )
                except (ValueError, TimeoutError, KeyError) as e:
                    frame = wire.encode_error(type(e).__name__, str(e), [])
                except Exception as e:  # reported to the caller, not lost in the actor's log
                    frame = wire.encode_error("RuntimeError", f"{type(e).__name__}: {e}", [])
                # No drain(): the client may be sending its next call while this reply waits
                # to be read; blocking on the reply here would stop reading and deadlock both.
                writer.writelines(frame)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()


def _was_restarted() -> bool:
    """True inside a Ray actor that Ray has restarted after a failure."""
    try:
        import ray

        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # outside Ray (plain use): never a restart
        return False
