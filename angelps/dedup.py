"""Duplicate keys, written once: unique keys with the slot of each key, and rows summed per key.

Used wherever keys may repeat: the workers (a batch's feature ids, row gradients of several
micro-batches), the client (keys of a pull or push) and the shards (pushes of several workers
under BSP).

* :class:`Dedup` (``unique, inverse``, ``unique`` sorted, ``unique[inverse] == keys``) avoids
  ``np.unique``'s argsort where it can. For keys known to lie in ``[0, bound)`` it keeps a
  presence mask and a remap table over the bound between calls (allocated zeroed, so only
  touched pages take memory; the remap table is 8 bytes a key, hence the bound's cap
  :data:`MAX_BOUND`). Without a bound it looks at the keys' span: a presence mask when the span
  is small next to the number of keys, else ``np.unique``.
* :func:`segment_sum` sums rows by slot with one flattened ``np.bincount`` in float64:
  deterministic and single-threaded (faster than ``np.add.at`` or torch's ``index_add_`` on a
  busy machine; docs/benchmarks-ps.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MAX_BOUND", "Dedup", "dedup", "merge_rows", "segment_sum", "strictly_increasing"]

#: The largest bound for which :class:`Dedup` keeps a remap table (2 GiB of address space).
MAX_BOUND = 1 << 28

# Bounded keys: the mask scan (O(bound), no allocation) beats the sort while the bound is at
# most this many times the number of keys.
_BOUNDED_MASK_FACTOR = 8
# Unbounded keys: a fresh mask and remap table over the span (O(span) allocation) beat the
# sort while the span is at most this many times the number of keys, up to _SPAN_MAX.
_SPAN_FACTOR = 4
_SPAN_MAX = 1 << 24


class Dedup:
    """``(unique, inverse)`` of int64 keys; ``bound`` > 0 promises every key is in
    ``[0, bound)`` (feature ids of a bounded input) and lets scratch tables be reused."""

    def __init__(self, bound: int = -1) -> None:
        self.bound = bound
        self.bounded = 0 < bound <= MAX_BOUND
        self._mask: np.ndarray | None = None
        self._remap: np.ndarray | None = None

    def __call__(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = keys.size
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.bounded:
            return self._bounded(keys)
        return _by_span(keys)

    def _bounded(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = keys.size
        if self._remap is None:
            # np.zeros is calloc: pages are materialised only where keys land. The table is
            # only read at this call's keys, so it is never cleared.
            self._remap = np.zeros(self.bound, dtype=np.int64)
        if self.bound <= _BOUNDED_MASK_FACTOR * n:
            if self._mask is None:
                self._mask = np.zeros(self.bound, dtype=bool)
            self._mask[keys] = True
            uniq = np.flatnonzero(self._mask)
            self._mask[uniq] = False
        else:
            uniq = _sorted_unique(keys)
        self._remap[uniq] = np.arange(uniq.size, dtype=np.int64)
        return uniq.astype(np.int64, copy=False), self._remap[keys]


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted unique keys: a plain sort and a neighbour comparison (no argsort)."""
    srt = np.sort(keys)
    keep = np.empty(srt.size, dtype=bool)
    keep[0] = True
    np.not_equal(srt[1:], srt[:-1], out=keep[1:])
    return srt[keep]


def _by_span(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unbounded keys: a presence mask over a small span, else ``np.unique``."""
    n = len(keys)
    lo, hi = int(keys.min()), int(keys.max())
    span = hi - lo + 1
    if span <= _SPAN_MAX and span <= _SPAN_FACTOR * n:
        k = keys - lo
        mask = np.zeros(span, dtype=bool)
        mask[k] = True
        uniq = np.flatnonzero(mask)
        remap = np.empty(span, dtype=np.int64)
        remap[uniq] = np.arange(len(uniq), dtype=np.int64)
        return uniq + lo, remap[k]
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq.astype(np.int64, copy=False), inv.reshape(-1).astype(np.int64, copy=False)


_UNBOUNDED = Dedup()


def dedup(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(unique, inverse)`` of keys with no known bound (see :class:`Dedup`)."""
    if len(keys) == 0:
        return keys.astype(np.int64), np.zeros(0, dtype=np.int64)
    return _UNBOUNDED(keys)


def strictly_increasing(keys: np.ndarray) -> bool:
    """Sorted and unique (the client sends shards keys in this form)."""
    return len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1]))


def segment_sum(inv: np.ndarray, values: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    """``out[i] = sum(values[inv == i])`` for ``i < n``, accumulated in float64."""
    cols = values.shape[1]
    if cols == 1:
        out = np.bincount(inv, weights=values[:, 0], minlength=n)
        return out.astype(dtype).reshape(n, 1)
    idx = (inv[:, None] * cols + np.arange(cols, dtype=np.int64)).ravel()
    out = np.bincount(idx, weights=values.ravel(), minlength=n * cols)
    return out.astype(dtype).reshape(n, cols)


def merge_rows(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, rows)`` parts (e.g. row gradients of several micro-batches) as one: unique keys
    sorted, the rows of a repeated key summed."""
    if len(parts) == 1:
        return parts[0]
    keys = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    uniq, inv = dedup(keys)
    return uniq, segment_sum(inv, rows, len(uniq), rows.dtype)
