"""Which shard holds which key: one pure module shared by the client and the shards.

* Dense tables are range-partitioned: shard ``i`` holds rows ``[bounds[i], bounds[i+1])``, the
  ``rows`` split into ``num_shards`` near-equal contiguous blocks (the first ``rows % n`` blocks
  one row longer).
* Sparse tables are hash-partitioned (``shard = mix64(key) mod n``, SplitMix64's finaliser, so
  consecutive ids spread evenly) or range-partitioned (``angel.ps.partitioner=range``) over their
  index range ``[0, rows)``, or over the whole int64 space when ``rows == -1``.

Everything here is a pure function of (table spec, number of shards, partitioner kind).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from angelps.options import PARTITIONER, PARTITIONERS, one_of
from angelps.table import TableSpec, mix64

__all__ = ["Partitioner", "range_bounds"]

_INT64_MIN = -(2**63)
_INT64_MAX_EXCL = 2**63


def range_bounds(lo: int, hi: int, n: int) -> np.ndarray:
    """``n + 1`` boundaries splitting ``[lo, hi)`` into ``n`` near-equal blocks (Python ints
    internally, so the full int64 space works; returned as an object-free int64 array only
    when it fits, the last bound clipped to int64 max for the open-ended case)."""
    span = hi - lo
    base, extra = divmod(span, n)
    bounds = [lo]
    for i in range(n):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return np.array([min(b, 2**63 - 1) for b in bounds], dtype=np.int64)


@dataclass(frozen=True)
class Partitioner:
    """Maps keys of one table to shard ids ``0 .. num_shards-1``."""

    spec: TableSpec
    num_shards: int
    kind: str = "hash"

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ValueError(f"number of shards must be >= 1, got {self.num_shards}")
        kind = one_of(PARTITIONER.name, self.kind, PARTITIONERS)
        # Dense tables are always range-partitioned: rows of a block stay contiguous.
        if not self.spec.sparse:
            kind = "range"
        object.__setattr__(self, "kind", kind)
        if kind == "range":
            if self.spec.rows > 0:
                b = range_bounds(0, self.spec.rows, self.num_shards)
            else:
                b = range_bounds(_INT64_MIN, _INT64_MAX_EXCL, self.num_shards)
            object.__setattr__(self, "_bounds", b)

    @property
    def bounds(self) -> np.ndarray:
        """Range boundaries (range partitioning only)."""
        if self.kind != "range":
            raise ValueError(f"table {self.spec.name!r} is hash-partitioned: no bounds")
        return self._bounds  # type: ignore[attr-defined,no-any-return]

    def row_range(self, shard: int) -> tuple[int, int]:
        """``[lo, hi)`` of the rows that ``shard`` holds (range partitioning)."""
        b = self.bounds
        return int(b[shard]), int(b[shard + 1])

    def shard_of(self, keys: np.ndarray) -> np.ndarray:
        """Shard id of each key (int64 array of the same length)."""
        keys = np.asarray(keys, dtype=np.int64)
        if self.num_shards == 1:
            return np.zeros(len(keys), dtype=np.int64)
        if self.kind == "hash":
            h = mix64(keys.view(np.uint64))
            return (h % np.uint64(self.num_shards)).astype(np.int64)
        inner = self.bounds[1:-1]
        return np.searchsorted(inner, keys, side="right").astype(np.int64)

    def split(self, keys: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """Group ``keys`` by shard: returns ``(order, offsets)`` such that
        ``keys[order[offsets[s]:offsets[s+1]]]`` are the keys of shard ``s``, in their original
        relative order (``order`` is None when it is the identity, i.e. keys are already grouped:
        one shard, or sorted keys under range partitioning)."""
        n = self.num_shards
        if n == 1:
            return None, np.array([0, len(keys)], dtype=np.int64)
        if self.kind == "range" and _is_sorted(keys):
            inner = self.bounds[1:-1]
            offsets = np.empty(n + 1, dtype=np.int64)
            offsets[0], offsets[-1] = 0, len(keys)
            offsets[1:-1] = np.searchsorted(keys, inner, side="left")
            return None, offsets
        sid = self.shard_of(keys)
        # A stable sort on small integers is a radix sort in numpy: O(n).
        order = np.argsort(sid.astype(np.uint16), kind="stable")
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(sid, minlength=n), out=offsets[1:])
        return order, offsets

    def owns(self, shard: int, keys: np.ndarray) -> np.ndarray:
        """Boolean mask of the keys that ``shard`` holds."""
        return self.shard_of(keys) == shard


def _is_sorted(keys: np.ndarray) -> bool:
    return len(keys) < 2 or bool(np.all(keys[1:] >= keys[:-1]))
