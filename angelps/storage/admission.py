"""Admission of new keys (a frequency filter, as XDL and Monolith have): a key gets a row only
after it was seen ``min_count`` times.

A key is *seen* once per optimizer update that carries it (a push; under BSP the workers'
pushes of one clock are one update). Pulls do not count (predict and evaluate pull too). Until a
key is admitted its pull returns the row's initial value and its gradient is dropped (and
counted); the update that sees it the ``min_count``-th time creates the row and applies its
gradient. The counts of keys not yet admitted live in memory only (a checkpoint holds rows,
not counts): after a restore they start again from zero.

The counts are exact: a khash table key -> counter slot plus an int64 count per slot
(no Python loop over keys). Slots of keys that were admitted are freed by :meth:`compact`
(at checkpoint time).
"""

from __future__ import annotations

import numpy as np

from angelps.storage.index import HashIndex

__all__ = ["Admission"]


class Admission:
    """Exact per-key sighting counts of the keys without a row."""

    def __init__(self, min_count: int) -> None:
        self.min_count = int(min_count)
        self.index = HashIndex()
        self.keys = np.zeros(0, dtype=np.int64)  # key of each counter slot
        self.counts = np.zeros(0, dtype=np.int64)  # sightings; 0 = admitted (slot free)
        self.n = 0
        self.dropped = 0  # gradient rows dropped because their key was not admitted yet
        self.admitted = 0  # keys that reached min_count

    def see(self, keys: np.ndarray) -> np.ndarray:
        """Count one sighting of each of the unique ``keys`` (all without a row); returns the
        mask of those admitted now. The others' gradients are counted as dropped."""
        slots = self.index.lookup(keys)
        new = slots < 0
        m = int(new.sum())
        if m:
            self._grow(self.n + m)
            fresh = np.arange(self.n, self.n + m, dtype=np.int64)
            self.keys[fresh] = keys[new]
            self.counts[fresh] = 0
            self.index.insert(keys[new], fresh)
            slots[new] = fresh
            self.n += m
        counts = self.counts[slots] + 1
        admit = counts >= self.min_count
        self.counts[slots] = np.where(admit, 0, counts)
        self.admitted += int(admit.sum())
        self.dropped += len(keys) - int(admit.sum())
        return admit

    def count_of(self, keys: np.ndarray) -> np.ndarray:
        """Sightings so far of ``keys`` not admitted (0 for keys never seen)."""
        slots = self.index.lookup(keys)
        out = np.zeros(len(keys), dtype=np.int64)
        hit = slots >= 0
        out[hit] = self.counts[slots[hit]]
        return out

    def pending(self) -> int:
        """Keys seen but not admitted yet."""
        return int(np.count_nonzero(self.counts[: self.n]))

    def compact(self) -> None:
        """Forget the admitted keys (their rows exist): rebuild the counter table."""
        keep = np.flatnonzero(self.counts[: self.n])
        self.keys = self.keys[keep]
        self.counts = self.counts[keep]
        self.n = len(keep)
        self.index.rebuild(self.keys)

    def nbytes(self) -> int:
        return self.index.nbytes() + self.keys.nbytes + self.counts.nbytes

    def _grow(self, need: int) -> None:
        if need <= len(self.keys):
            return
        cap = max(need, 2 * len(self.keys), 1024)
        self.keys = np.concatenate([self.keys, np.zeros(cap - len(self.keys), np.int64)])
        self.counts = np.concatenate([self.counts, np.zeros(cap - len(self.counts), np.int64)])
