"""The worker-side row cache (HET's embedding cache, within the PS's consistency model).

Hot rows of the sparse tables stay on the worker's device with the clock at which they were
fetched (``fetched``) and the last clock at which this worker pushed them (``pushed``). Before a
pull, :meth:`RowCache.split` decides which of the batch's rows it may serve, and the rest are
pulled; :meth:`RowCache.fill` puts both together and admits the pulled rows that have been
seen ``admit`` times (frequency admission) while there is room.

What the cache may serve is what the PS's consistency model allows (``angel.staleness``):

* **BSP** (0): only rows it can prove equal to the shard's copy. Under BSP a shard's rows change
  only when every worker has pushed a clock, so a row fetched at this worker's current clock is
  current; with one worker, a row it has not pushed since it fetched it is current too (no one
  else writes). Nothing else is served, so training is bit-identical to no cache. (A row a
  batch reads is pushed in the same step, so during training the hits are rows read and not
  written: other tables' rows, validation and prediction passes.)
* **SSP** (s > 0): rows fetched at most ``s`` clocks before the clock they are used at (read
  staleness). The worker's own updates are applied to its cached copy at once, with the table's
  own optimizer (:func:`angelps.optim.apply`, the shards' code, over optimizer state the cache
  keeps for its rows), until the refetch brings the shard's result; they are pushed in the
  same step (write staleness 0 <= s).
* **ASP** (< 0): as SSP with ``s`` = the prefetch depth's bound: rows at most 1 clock old.

Invariants: a served row was fetched from the shards (never invented); ``fetched`` only grows;
the cache holds each key at most once; its arrays are on ``device``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from angelconf.config import ConfigError
from angelps.optim import apply, slot_widths
from angelps.rates import Step, rate_of
from angelps.table import OptimizerSpec
from learners.worker.feed import FeedOptions

__all__ = [
    "CacheStats",
    "RowCache",
    "Split",
    "cached_tables",
    "fill_rows",
    "split_request",
    "worker_cache",
]

_SLOT_BYTES = 8 + 8 + 8 + 4  # key, fetched, pushed (int64), index (int32)


@dataclass
class CacheStats:
    """Counters since the last :meth:`RowCache.take_stats`."""

    lookups: int = 0
    hits: int = 0


@dataclass
class Split:
    """One request cut in two: ``served`` rows come from the cache, the rest are pulled."""

    uniq: np.ndarray
    hit: np.ndarray  # bool per unique key
    rows: dict[str, Tensor] = field(default_factory=dict)  # served rows, per table
    clock: int = 0  # the clock the pulled rows are a snapshot of


class RowCache:
    """Rows of ``tables`` (name -> cols) for ids in ``[0, num_ids)`` (see the module doc)."""

    def __init__(
        self,
        tables: Mapping[str, int],
        num_ids: int,
        capacity: int,
        capacity_bytes: bool,
        admit: int,
        staleness: int,
        num_workers: int,
        device: torch.device,
        optimizers: Mapping[str, OptimizerSpec] | None = None,
    ) -> None:
        # Each table's optimizer (default SGD) and its state for the cached rows: the local
        # update of a pushed row under SSP/ASP is the shards' own.
        specs = {t: (optimizers or {}).get(t, OptimizerSpec("sgd")) for t in tables}
        widths = {t: slot_widths(specs[t], c) for t, c in tables.items()}
        state_cols = sum(sum(w.values()) for w in widths.values())
        row_bytes = 4 * (sum(tables.values()) + state_cols) + _SLOT_BYTES
        cap = capacity // row_bytes if capacity_bytes else capacity
        if cap < 1:
            raise ConfigError(
                f"angel.worker.cache.capacity={capacity} bytes holds no row of "
                f"{row_bytes} bytes; give at least {row_bytes} bytes or a row count"
            )
        cap = min(cap, max(num_ids, 1))
        if device.type == "cuda":
            free = torch.cuda.get_device_properties(device).total_memory
            if cap * row_bytes > free:
                raise ConfigError(
                    f"angel.worker.cache.capacity={capacity} needs {cap * row_bytes / 2**30:.1f}"
                    f" GiB, more than the GPU's {free / 2**30:.1f} GiB"
                )
        self.cols = dict(tables)
        self.capacity = cap
        self.admit = admit
        self.staleness = staleness
        self.num_workers = num_workers
        self.device = device
        self.slot_of = np.zeros(num_ids, dtype=np.int32)  # slot + 1; 0: not cached
        self.seen = np.zeros(num_ids, dtype=np.uint8)  # sightings, saturating at 255
        self.keys = np.zeros(cap, dtype=np.int64)
        self.fetched = np.zeros(cap, dtype=np.int64)
        self.pushed = np.full(cap, -1, dtype=np.int64)
        self.rows = {t: torch.zeros(cap, c, device=device) for t, c in tables.items()}
        self.optimizers = specs
        self.state = {
            t: {k: torch.zeros(cap, w, device=device) for k, w in ws.items()}
            for t, ws in widths.items()
        }
        self.size = 0
        self.stats = CacheStats()

    # --- reads ---------------------------------------------------------------------------------

    def split(self, uniq: np.ndarray, clock: int, use_clock: int | None = None) -> Split:
        """Which of ``uniq`` (a batch's sorted unique ids) to serve: the served rows are copied
        now. ``clock``: this worker's clock (the pulled rows' snapshot); ``use_clock``: the clock
        the batch is computed at (a prefetch: later)."""
        use = clock if use_clock is None else use_clock
        slot = self.slot_of[uniq] - 1
        cached = slot >= 0
        s = np.where(cached, slot, 0)
        if self.staleness == 0:
            current = self.fetched[s] == use
            if self.num_workers == 1:
                current |= self.pushed[s] < self.fetched[s]
            hit = cached & current
        else:
            bound = self.staleness if self.staleness > 0 else 1
            hit = cached & (use - self.fetched[s] <= bound)
        self.stats.lookups += int(uniq.size)
        self.stats.hits += int(hit.sum())
        out = Split(uniq, hit, clock=clock)
        if hit.any():
            idx = torch.from_numpy(slot[hit]).to(self.device)
            out.rows = {t: r.index_select(0, idx) for t, r in self.rows.items()}
        return out

    def fill(self, sp: Split, pulled: Mapping[str, np.ndarray]) -> dict[str, Tensor]:
        """The rows of every cached table for all of ``sp.uniq`` (served and pulled), as
        float32 tensors on the device; admits pulled rows seen often enough."""
        miss = ~sp.hit
        got = {
            t: torch.from_numpy(np.ascontiguousarray(pulled[t], dtype=np.float32)).to(self.device)
            for t in self.cols
        }
        self._admit(sp.uniq[miss], got, sp.clock)
        if not sp.hit.any():
            return got
        n = sp.uniq.size
        hit_i = torch.from_numpy(np.flatnonzero(sp.hit)).to(self.device)
        miss_i = torch.from_numpy(np.flatnonzero(miss)).to(self.device)
        out = {}
        for t, cols in self.cols.items():
            full = torch.empty(n, cols, device=self.device)
            full.index_copy_(0, hit_i, sp.rows[t])
            full.index_copy_(0, miss_i, got[t])
            out[t] = full
        return out

    def _admit(self, keys: np.ndarray, rows: Mapping[str, Tensor], clock: int) -> None:
        """Refresh the cached ones among ``keys`` (just pulled at ``clock``) and insert those
        seen ``admit`` times while there is room."""
        if keys.size == 0:
            return
        seen = self.seen[keys]
        self.seen[keys] = np.minimum(seen.astype(np.int32) + 1, 255).astype(np.uint8)
        slot = self.slot_of[keys] - 1
        old = slot >= 0
        room = self.capacity - self.size
        new = np.flatnonzero(~old & (seen + 1 >= self.admit))[:room]
        if new.size:
            slots = np.arange(self.size, self.size + new.size, dtype=np.int32)
            self.size += int(new.size)
            self.keys[slots] = keys[new]
            self.pushed[slots] = -1
            self.slot_of[keys[new]] = slots + 1
            fresh = torch.from_numpy(slots.astype(np.int64)).to(self.device)
            for st in self.state.values():
                for v in st.values():
                    v.index_fill_(0, fresh, 0.0)  # a slot reused by a new key starts at zero
            slot = slot.copy()
            slot[new] = slots
            old[new] = True
        if not old.any():
            return
        src = torch.from_numpy(np.flatnonzero(old)).to(self.device)
        dst_np = slot[old]
        self.fetched[dst_np] = clock
        dst = torch.from_numpy(dst_np.astype(np.int64)).to(self.device)
        for t, r in self.rows.items():
            r.index_copy_(0, dst, rows[t].index_select(0, src))

    # --- writes --------------------------------------------------------------------------------

    def note_push(
        self, updates: Mapping[str, tuple[np.ndarray, np.ndarray]], lr: Step, clock: int
    ) -> None:
        """This worker pushes ``updates`` (table -> (ids, gradient)) at ``clock`` with step
        ``lr`` (a table's own step size and momentum where it has them): their cached rows are
        marked, and under SSP/ASP the table's optimizer step is applied to them."""
        for t, (ids, g) in updates.items():
            if t not in self.rows or ids.size == 0:
                continue
            slot = self.slot_of[ids] - 1
            cached = slot >= 0
            if not cached.any():
                continue
            s = slot[cached]
            self.pushed[s] = clock
            if self.staleness != 0:
                idx = torch.from_numpy(s.astype(np.int64)).to(self.device)
                grad = torch.from_numpy(np.ascontiguousarray(g[cached], dtype=np.float32))
                step_lr, momentum = rate_of(lr, t)
                w = self.rows[t].index_select(0, idx)
                st = {k: v.index_select(0, idx) for k, v in self.state[t].items()}
                apply(self.optimizers[t], w, st, grad.to(self.device), step_lr, momentum)
                self.rows[t].index_copy_(0, idx, w)
                for k, v in st.items():
                    self.state[t][k].index_copy_(0, idx, v)

    def take_stats(self) -> CacheStats:
        """The counters since the last call (and reset them)."""
        st, self.stats = self.stats, CacheStats()
        return st


def cached_tables(tables: Sequence[tuple[str, int, bool]]) -> dict[str, int]:
    """The tables a cache holds: the sparse ones (name, cols, sparse) -> cols."""
    return {name: cols for name, cols, sparse in tables if sparse}


def worker_cache(
    feed: FeedOptions,
    tables: Sequence[tuple[str, int, bool]],
    num_features: int,
    num_workers: int,
    device: torch.device,
    optimizers: Mapping[str, OptimizerSpec] | None = None,
) -> RowCache:
    """A worker's cache of its sparse ``tables`` (name, cols, sparse) as ``feed`` sizes it,
    updating its rows with each table's optimizer (``optimizers``: table -> spec)."""
    return RowCache(
        cached_tables(tables),
        num_features,
        feed.capacity,
        feed.capacity_bytes,
        feed.admit,
        feed.staleness,
        num_workers,
        device,
        optimizers,
    )


def split_request(
    cache: RowCache | None, req: dict[str, np.ndarray], clock: int, use_clock: int | None = None
) -> tuple[dict[str, np.ndarray], Split | None]:
    """A batch's request (table -> ids; the sparse tables share one sorted id set) less the
    rows ``cache`` serves: (what to pull, the split to :func:`fill_rows` with)."""
    if cache is None:
        return req, None
    names = [t for t in cache.cols if t in req]
    if not names:
        return req, None
    sp = cache.split(req[names[0]], clock, use_clock)
    miss = req[names[0]][~sp.hit]
    return {t: (miss if t in cache.cols else k) for t, k in req.items()}, sp


def fill_rows(
    cache: RowCache | None, sp: Split | None, pulled: Mapping[str, np.ndarray]
) -> Mapping[str, np.ndarray | Tensor]:
    """The batch's rows: as pulled, with the cached tables' rows completed by ``sp``."""
    if sp is None or cache is None:
        return pulled
    rows: dict[str, np.ndarray | Tensor] = dict(pulled)
    rows.update(cache.fill(sp, pulled))
    return rows
