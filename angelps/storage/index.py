"""The key index of a sparse table on one shard: key -> storage slot, for a whole batch at once.

Three kinds, chosen per table when the shard is built (:func:`new_index`):

* :class:`angelps.storage.open_index.OpenIndex` (the default for every table whose keys are
  not a small bounded span: ``rows == -1``, any int64 key, negatives too): open addressing over
  int32 slots only, the keys read from the table's own ``keys`` store, vectorized over a batch
  in numpy; 5.3-8 bytes a row.
* :class:`HashIndex` (the same tables when :data:`HASH_KIND` is ``"khash"``; also the
  admission counters): pandas' khash ``Int64HashTable`` (C, open addressing, vectorized
  ``lookup`` and ``map_keys_to_values`` over a whole batch, no Python loop over keys), about 32
  bytes a row. Lookups and inserts cost O(batch) whatever the number of rows held
  (docs/benchmarks-ps.md). khash has no delete: removing keys (expiry) rebuilds the index from
  the keys that stay.
* :class:`DirectIndex` (bounded tables whose key span on this shard is at most
  :data:`DIRECT_MAX` keys): an int32 array over the span holding ``slot + 1`` (0 = absent), so a
  lookup is one gather. It is allocated zeroed (calloc): only the pages keys land in take
  memory, and with the span capped that is at most ``4 * DIRECT_MAX`` bytes.

Both answer ``lookup(keys) -> slots`` with -1 for absent keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from angelps.partition import Partitioner
from angelps.storage.open_index import OpenIndex
from angelps.table import TableSpec

__all__ = [
    "DIRECT_MAX",
    "HASH_KIND",
    "DirectIndex",
    "HashIndex",
    "KeyIndex",
    "direct_span",
    "hinted_lookup",
    "new_index",
]

#: The index of tables over any int64 key: "open" (:class:`OpenIndex`, int32 slots, the keys
#: read from the table) or "khash" (:class:`HashIndex`, pandas' khash, ~32 B a row). Both are
#: within 1.3x of each other at 50k-key batches (docs/benchmarks-ps.md); "open" takes a quarter
#: of the memory.
HASH_KIND = "open"

# The largest key span of a bounded sparse table on one shard that gets a direct index: 64 MiB
# of int32 at most. A direct lookup is a plain gather (0.1-0.4 ms for 50k keys against 3-5 ms
# for the hash index), but each new key may fault in a 4 KiB page of the index; over a larger
# span those faults cost more than the hash (docs/benchmarks-ps.md).
DIRECT_MAX = 1 << 24


def _hash_table(size: int) -> Any:
    """A khash ``Int64HashTable`` of ``size`` slots."""
    # pandas here, not at the top: its import takes 0.3-0.5 s, which only a shard holding a
    # hash-indexed table needs to pay; the driver and the workers import this module through
    # the client, and a shard of bounded tables uses DirectIndex alone.
    from pandas._libs.hashtable import Int64HashTable

    return Int64HashTable(size)


class HashIndex:
    """key -> slot in a khash table (any int64 key)."""

    kind = "khash"

    def __init__(self, size_hint: int = 0) -> None:
        self._table = _hash_table(max(int(size_hint), 1))

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slots of ``keys`` (int64), -1 where absent."""
        return self._table.lookup(np.ascontiguousarray(keys, dtype=np.int64))  # type: ignore[no-any-return]

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Map the (absent, unique) ``keys`` to ``slots``."""
        self._table.map_keys_to_values(
            np.ascontiguousarray(keys, dtype=np.int64), np.ascontiguousarray(slots, dtype=np.int64)
        )

    def rebuild(self, keys: np.ndarray) -> None:
        """Only ``keys[i] -> i`` (after rows were removed and the rest renumbered)."""
        self._table = _hash_table(max(len(keys), 1))
        if len(keys):
            self.insert(keys, np.arange(len(keys), dtype=np.int64))

    def check_owned(self, name: str, keys: np.ndarray) -> None:
        """Any int64 key may be held."""

    def nbytes(self) -> int:
        return int(self._table.sizeof())


class DirectIndex:
    """key -> slot as ``index[key - base] - 1`` over the span ``[base, base + len)``."""

    kind = "direct"

    def __init__(self, lo: int, hi: int) -> None:
        self.base = lo
        # int32: a shard holds fewer than DIRECT_MAX rows of such a table.
        self.index = np.zeros(hi - lo, dtype=np.int32)

    @property
    def span(self) -> tuple[int, int]:
        return self.base, self.base + len(self.index)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        pos = keys - self.base if self.base else keys
        slots = self.index.take(pos).astype(np.int64)
        slots -= 1
        return slots

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        self.index[keys - self.base if self.base else keys] = slots + 1

    def rebuild(self, keys: np.ndarray) -> None:
        self.index[:] = 0
        if len(keys):
            self.insert(keys, np.arange(len(keys), dtype=np.int64))

    def check_owned(self, name: str, keys: np.ndarray) -> None:
        """Keys outside the span (a range-partitioned table's key sent to the wrong shard) have
        no entry: reject them before anything changes."""
        if not keys.size:
            return
        lo, hi = int(keys.min()), int(keys.max())
        base, end = self.span
        if lo < base or hi >= end:
            bad = lo if lo < base else hi
            raise ValueError(
                f"table {name!r}: key {bad} is not held by this shard (keys [{base}, {end}))"
            )

    def nbytes(self) -> int:
        return int(self.index.nbytes)


KeyIndex = HashIndex | DirectIndex | OpenIndex


def direct_span(spec: TableSpec, part: Partitioner, shard_id: int) -> tuple[int, int] | None:
    """``[lo, hi)`` of the keys a bounded sparse table can send this shard, when it is small
    enough for a direct index (:data:`DIRECT_MAX`); None otherwise (and for ``rows == -1``)."""
    if not (spec.sparse and spec.rows > 0):
        return None
    lo, hi = part.row_range(shard_id) if part.kind == "range" else (0, spec.rows)
    return (lo, hi) if hi - lo <= DIRECT_MAX else None


def new_index(
    spec: TableSpec,
    part: Partitioner,
    shard_id: int,
    key_at: Callable[[np.ndarray], np.ndarray],
    size_hint: int = 0,
) -> KeyIndex:
    """The index of a sparse table on shard ``shard_id``: direct where the span allows, else
    :data:`HASH_KIND` (``key_at(slots)``: the keys the table holds in those slots)."""
    span = direct_span(spec, part, shard_id)
    if span is not None:
        return DirectIndex(*span)
    if HASH_KIND == "khash":
        return HashIndex(size_hint)
    return OpenIndex(key_at, size_hint)


def hinted_lookup(
    index: Any,
    key_at: Callable[[np.ndarray], np.ndarray],
    n: int,
    keys: np.ndarray,
    hint: np.ndarray | None,
) -> np.ndarray:
    """``index.lookup(keys)``, where ``hint`` (each key's slot in another table read with the
    same keys, -1 where absent there) is taken wherever the key at that slot is the key: one
    random read a key instead of a probe of the index (a bucket, then the key it names, and on
    past a collision). The tables of a device tier's book are created with the same keys in
    the same order, so their slots agree; where they do not (or ``n`` rows end below a hint),
    those keys are looked up. No ``hint``, or an index that is not a hash (a direct index is
    one read already): ``index.lookup(keys)``."""
    if hint is None or getattr(index, "kind", "") not in ("hash", "khash"):
        return index.lookup(keys)
    out = np.full(len(keys), -1, dtype=np.int64)
    at = np.flatnonzero((hint >= 0) & (hint < n))
    at = at[key_at(hint[at]) == keys[at]]
    out[at] = hint[at]
    rest = np.flatnonzero(out < 0)
    if len(rest):
        out[rest] = index.lookup(keys[rest])
    return out
