"""A device tier's swap split over the shards (angelps/client/tier_swap.py), without Ray: each
shard's call gets exactly its keys and their whole rows, for tables sharing one key array or
not and partitioned alike or not, and the rows read come back in the keys' order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from angelps import OptimizerSpec, TableSpec
from angelps.client.tier_swap import row_width, swap_async
from angelps.partition import Partitioner

MOM = OptimizerSpec("momentum")


class _Client:
    """The calls a swap makes, and shards that answer each read with rows made from the
    keys (row i of key k: k * 10 + column)."""

    def __init__(self, specs: list[TableSpec], shards: int, kinds: dict[str, str]) -> None:
        self.num_shards = shards
        self.specs = {s.name: s for s in specs}
        self.parts = {s.name: Partitioner(s, shards, kinds[s.name]) for s in specs}
        self.calls: dict[int, tuple[dict[str, Any], dict[str, np.ndarray]]] = {}

    def swap_call(self, shard: int, writes: Any, reads: Any) -> Any:
        self.calls[shard] = (writes, reads)
        rows = {n: _rows(self.specs[n], k) for n, k in reads.items()}
        return (1000 + shard, rows)

    def swap_answers(self, refs: list[Any]) -> list[Any]:
        return list(refs)


def _rows(spec: TableSpec, keys: np.ndarray) -> np.ndarray:
    width = row_width(spec)
    return (keys[:, None] * 10 + np.arange(width)[None, :]).astype(np.dtype(spec.dtype))


@pytest.mark.parametrize("shards", [1, 2, 3])
@pytest.mark.parametrize("kinds", [("hash", "hash"), ("range", "range"), ("hash", "range")])
@pytest.mark.parametrize("shared", [True, False])
def test_each_shard_gets_its_keys_and_rows_and_the_reads_come_back_in_order(
    shards: int, kinds: tuple[str, str], shared: bool
) -> None:
    specs = [
        TableSpec("w", rows=5_000, cols=1, sparse=True, optimizer=MOM),
        TableSpec("v", rows=5_000, cols=4, sparse=True, optimizer=MOM),
    ]
    client = _Client(specs, shards, dict(zip(("w", "v"), kinds, strict=True)))
    rng = np.random.default_rng(shards)
    evicted = rng.choice(5_000, 700, replace=False)  # (a tier's victims: not sorted)
    missed = np.sort(rng.choice(5_000, 900, replace=False))
    blocks = {
        s.name: rng.standard_normal((len(evicted), row_width(s))).astype(np.float32) for s in specs
    }
    keys = {n: (evicted if shared else evicted.copy()) for n in blocks}
    reads = {"w": missed, "v": missed if shared else missed.copy()}
    fut = swap_async(client, {n: (keys[n], b) for n, b in blocks.items()}, reads)
    got = fut.result()
    for name, spec in client.specs.items():
        np.testing.assert_array_equal(got[name], _rows(spec, missed))
        owner = client.parts[name].shard_of(evicted)
        read_owner = client.parts[name].shard_of(missed)
        for s in range(shards):
            writes, asked = client.calls.get(s, ({}, {}))
            mine = owner == s
            if mine.any():
                k, b = writes[name]
                np.testing.assert_array_equal(k, evicted[mine])  # (in the keys' order)
                np.testing.assert_array_equal(b, blocks[name][mine])
            else:
                assert name not in writes
            if (read_owner == s).any():
                np.testing.assert_array_equal(asked[name], missed[read_owner == s])
            else:
                assert name not in asked
    assert fut.pids == {s: 1000 + s for s in client.calls}
