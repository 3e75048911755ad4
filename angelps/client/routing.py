"""Placement on the client: which keys go to which shard, and the rows put back in key order.

A :class:`Routed` is one table's keys of one call, deduplicated (:mod:`angelps.dedup`) and
grouped by shard (:mod:`angelps.partition`); :func:`assemble` puts the shards' replies back in
the order of the requested keys. Pure numpy, no Ray: the in-process benchmark and the tests
route exactly as :class:`angelps.client.ps_client.PSClient` does.

Invariant: every shard receives its keys unique and strictly increasing (the form the shards'
indexes and the checkpoint layout expect); duplicate gradients are summed before they leave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from angelps.dedup import dedup, segment_sum, strictly_increasing
from angelps.partition import Partitioner
from angelps.table import TableSpec

__all__ = ["Routed", "assemble"]


class Routed:
    """One table's keys deduplicated and grouped by shard."""

    __slots__ = ("inv", "offsets", "order", "spec", "uniq")

    def __init__(self, spec: TableSpec, part: Partitioner, keys: np.ndarray) -> None:
        self.spec = spec
        # Keys already sorted and unique (a dense table's rows, a learner's own deduplicated ids)
        # skip the dedup and the permutations: inv None means the identity.
        self.inv: np.ndarray | None
        if strictly_increasing(keys):
            self.uniq, self.inv = keys, None
        else:
            self.uniq, self.inv = dedup(keys)
        self.order, self.offsets = part.split(self.uniq)

    def sum_grads(self, g: np.ndarray) -> np.ndarray:
        """Gradients aligned with ``uniq``: duplicates summed, else just reordered."""
        if self.inv is None:
            return g
        if len(self.uniq) == len(self.inv):
            out = np.empty_like(g)
            out[self.inv] = g
            return out
        return segment_sum(self.inv, g, len(self.uniq), g.dtype)

    def index(self, shard: int) -> slice | np.ndarray:
        a, b = int(self.offsets[shard]), int(self.offsets[shard + 1])
        return slice(a, b) if self.order is None else self.order[a:b]

    def count(self, shard: int) -> int:
        return int(self.offsets[shard + 1] - self.offsets[shard])


def assemble(
    routed: Sequence[Routed],
    shards: Sequence[int],
    replies: Sequence[Mapping[str, Any] | None],
) -> dict[str, np.ndarray]:
    """Rows in the order of the requested keys, from the replies of ``shards``.

    Large fresh buffers cost page faults here, so each path writes every byte once: a gather
    from the reply when one shard answered, a scatter into the output when there were no
    duplicate keys."""
    out: dict[str, np.ndarray] = {}
    for r in routed:
        name = r.spec.name
        parts = [
            (s, v[name])
            for s, v in zip(shards, replies, strict=True)
            if v is not None and name in v
        ]
        out[name] = _assemble_one(r, parts)
    return out


def _assemble_one(r: Routed, parts: list[tuple[int, np.ndarray]]) -> np.ndarray:
    if r.order is None and len(parts) == 1:
        v = parts[0][1]
        # A copy either way: replies from the object store are read-only.
        return np.array(v) if r.inv is None else v[r.inv]
    rows = np.empty((len(r.uniq), r.spec.cols), dtype=r.spec.dtype)
    if r.inv is None:
        for s, v in parts:
            rows[r.index(s)] = v
        return rows
    if len(r.uniq) == len(r.inv):  # no duplicates: scatter straight into the key order
        pos = np.empty(len(r.inv), dtype=np.int64)
        pos[r.inv] = np.arange(len(r.inv), dtype=np.int64)
        for s, v in parts:
            rows[pos[r.index(s)]] = v
        return rows
    for s, v in parts:
        rows[r.index(s)] = v
    return rows[r.inv]
