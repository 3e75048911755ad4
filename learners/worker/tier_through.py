"""Reads of a device tier outside training (validation, prediction;
learners/worker/device_tier.py): the rows it holds read on the device, the others from the
shards, placed nowhere."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from torch import Tensor

from learners.worker.tier_link import TierLink
from learners.worker.tier_slots import same, split_misses
from learners.worker.tier_table import TierTable

__all__ = ["ThroughReads"]


class _Book(Protocol):
    link: TierLink
    tables: dict[str, TierTable]

    @property
    def clock(self) -> int: ...

    def lookup(self, keys: np.ndarray) -> np.ndarray: ...


class ThroughReads:
    """The reads of one book outside training: the rows training holds stay, and so does a
    prefetch of its next batch (a read from the shards needs only the write-backs to have
    landed). One read serves every table of the book asking for the same ids."""

    def __init__(self, book: _Book) -> None:
        self.book = book
        #: the last read: its ids, the rows of the tables yet to ask for them, the clock
        self._last: tuple[np.ndarray, dict[str, Tensor], int] | None = None

    def read(self, name: str, ids: np.ndarray) -> Tensor:
        """The weights of ``ids`` (unique) of table ``name``, on the book's device."""
        last = self._last
        if (
            last is None
            or last[2] != self.book.clock  # (an update since: the rows changed)
            or name not in last[1]
            or not same(last[0], ids)
        ):
            last = self._last = (ids, self._rows(ids), self.book.clock)
        return last[1].pop(name)

    def _rows(self, ids: np.ndarray) -> dict[str, Tensor]:
        book = self.book
        at, miss = split_misses(book.lookup(ids))
        rows: dict[str, np.ndarray] = {}
        if len(miss):
            book.link.settle()
            rows = book.link.rows(book.link.swap({}, ids[miss]))
        out = {}
        for n, t in book.tables.items():
            got = rows[n] if len(miss) else np.zeros((0, t.width), t.np_dtype)
            out[n] = t.rows.assemble(at, miss, got)[:, : t.cols].contiguous()
        return out
