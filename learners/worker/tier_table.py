"""One table of a device tier (learners/worker/device_tier.py): its rows in its book's slots,
read for a step and updated by their owner with the shards' optimizer code."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from angelps import TableSpec
from angelps.dedup import strictly_increasing
from angelps.optim import apply, slot_columns
from angelps.partition import Partitioner
from angelps.rates import Step, rate_of
from learners.worker.device import RowBlock, to_device, torch_dtype
from learners.worker.tier_slots import TierCounts, ids_of, same

__all__ = ["Book", "TierTable"]


class Book(Protocol):
    """What a table needs of its :class:`learners.worker.device_tier.TierBook`."""

    part: Partitioner
    device: torch.device
    capacity: int
    training: bool

    @property
    def clock(self) -> int: ...

    def rows_held(self) -> int: ...

    def read(self, ids: np.ndarray) -> tuple[np.ndarray | None, int]: ...

    def staged_block(self, name: str) -> Tensor: ...

    def read_through(self, name: str, ids: np.ndarray) -> Tensor: ...

    def slots_for_update(self, keys: np.ndarray | Tensor) -> np.ndarray: ...

    def slots_on(self, slots: np.ndarray) -> Tensor | None: ...


class TierTable:
    """One table of a :class:`TierBook`: its rows (weights and optimizer slots side by side,
    as a shard stores them) in the book's slots, on the book's device."""

    def __init__(self, spec: TableSpec, book: Book) -> None:
        self.spec = spec
        self.book = book
        self.part = book.part
        self.cols = spec.cols
        self.slots, self.width = slot_columns(spec.optimizer, spec.cols)
        self.np_dtype = np.dtype(spec.dtype)
        self.data = torch.zeros(
            (book.capacity, self.width), dtype=torch_dtype(spec.dtype), device=book.device
        )
        self.rows = RowBlock(self.data)
        #: counted since the start (the update thread counts write-backs); and at the last
        #: :meth:`take_counts`
        self.counts = TierCounts()
        self._taken = TierCounts()
        #: the last training read (ids, slots (None: staged), whole rows, clock) and the
        #: update's
        self._read: tuple[np.ndarray, np.ndarray | None, Tensor, int] | None = None
        self._upd: tuple[np.ndarray, np.ndarray, Tensor | None] | None = None

    @property
    def capacity(self) -> int:
        return self.book.capacity

    def nbytes(self) -> int:
        return int(self.data.numel() * self.data.element_size())

    def rows_held(self) -> int:
        return self.book.rows_held()

    def take_counts(self) -> TierCounts:
        """The counts since the last call, without waiting for the update thread: what it
        counts after this comes with the next call."""
        now = dataclasses.replace(self.counts)  # (each count read once)
        last, self._taken = self._taken, now
        return TierCounts(
            now.lookups - last.lookups,
            now.hits - last.hits,
            now.misses - last.misses,
            now.writebacks - last.writebacks,
        )

    def gather(self, keys: np.ndarray | Tensor) -> Tensor:
        """The weights of ``keys`` (owned; repeated ids allowed: an owner serving several
        workers receives an id once from each that reads it), read once each on the host
        index."""
        ids = ids_of(keys)
        if strictly_increasing(ids):
            return self._gather(ids)
        uniq, inv = np.unique(ids, return_inverse=True)
        return self._gather(uniq).index_select(0, to_device(inv.reshape(-1), self.book.device))

    def _gather(self, ids: np.ndarray) -> Tensor:
        """The weights of owned unique ``ids`` (a new ``[k, cols]`` tensor). Outside training
        (validation, prediction) the misses are read through from the shards, unplaced
        (:meth:`TierBook.read_through`)."""
        book = self.book
        if not book.training:
            return book.read_through(self.spec.name, ids)
        slots, hits = book.read(ids)
        self.counts.lookups += len(ids)
        self.counts.hits += hits
        self.counts.misses += len(ids) - hits
        if slots is None:  # (staged: the update thread may still be placing its misses)
            block = book.staged_block(self.spec.name)
        else:
            block = self.rows.take(slots, book.slots_on(slots))
        # The update of these ids (by this update: no other writer) starts from these rows.
        self._read = (ids, slots, block, book.clock)
        return block[:, : self.cols].contiguous()

    def resolve(self, keys: np.ndarray | Tensor) -> None:
        """Find the slots the next :meth:`update` of ``keys`` writes (before it runs in
        another thread: the book may change meanwhile)."""
        ids = ids_of(keys)
        read, self._read = self._read, None
        if read is not None and read[3] == self.book.clock and same(read[0], ids):
            slots = read[1] if read[1] is not None else self.book.slots_for_update(ids)
            self._upd = (ids, slots, read[2])
        else:
            self._upd = (ids, self.book.slots_for_update(ids), None)

    def update(self, keys: np.ndarray | Tensor, grads: Tensor, step: Step) -> None:
        """One optimizer update of owned unique ``keys`` (all read in this update, so held)."""
        lr, momentum = rate_of(step, self.spec.name)
        upd, self._upd = self._upd, None
        ids = ids_of(keys)
        if upd is None or not same(upd[0], ids):
            self.resolve(ids)  # (several workers: called at once, no update thread)
            upd, self._upd = self._upd, None
        assert upd is not None
        slots, block = upd[1], upd[2]
        on = self.book.slots_on(slots)
        if block is None:
            block = self.rows.take(slots, on)
        state = {k: block[:, a:b] for k, (a, b) in self.slots.items()}
        apply(
            self.spec.optimizer, block[:, : self.cols], state, grads.to(block.dtype), lr, momentum
        )
        self.rows.put(slots, block, on)
