"""The client's routing and assembly (dedup, grouping by shard, summing duplicate gradients,
putting rows back in the order of the keys), driven in-process against N shards and compared
with one shard that holds everything: any sequence of pulls and pushes, any keys."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from angelps.client.routing import Routed as RoutedKeys
from angelps.client.routing import assemble
from angelps.partition import Partitioner
from angelps.server.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec

TABLES = [
    TableSpec(
        "s",
        rows=-1,
        cols=3,
        sparse=True,
        init="normal",
        init_std=0.1,
        optimizer=OptimizerSpec("adam"),
    ),
    TableSpec(
        "r",
        rows=60,
        cols=2,
        sparse=True,
        init="uniform",
        init_std=0.5,
        optimizer=OptimizerSpec("momentum"),
    ),
    TableSpec(
        "d", rows=25, cols=1, init="normal", init_std=1.0, optimizer=OptimizerSpec("adagrad")
    ),
]
SPECS = {t.name: t for t in TABLES}


class Routed:
    """N in-process shards behind the client's own routing and assembly code."""

    def __init__(self, n: int, kind: str) -> None:
        self.shards = [ParameterShard(i, n, TABLES, partitioner=kind) for i in range(n)]
        self.parts = {t.name: Partitioner(t, n, kind) for t in TABLES}
        self.clock = 0

    def pull(self, table: str, keys: np.ndarray) -> np.ndarray:
        r = RoutedKeys(SPECS[table], self.parts[table], keys)
        shards, values = [], []
        for s, shard in enumerate(self.shards):
            if r.count(s):
                shards.append(s)
                values.append(shard.pull({table: r.uniq[r.index(s)]}))
        return assemble([r], shards, values)[table]

    def push(self, table: str, keys: np.ndarray, grads: np.ndarray, lr: float) -> None:
        r = RoutedKeys(SPECS[table], self.parts[table], keys)
        g = r.sum_grads(grads.astype(SPECS[table].dtype))
        for s, shard in enumerate(self.shards):
            idx = r.index(s)
            shard.push(0, self.clock, {table: (r.uniq[idx], g[idx])}, lr)
        self.clock += 1


def _keys(table: str) -> st.SearchStrategy[list[int]]:
    if table == "s":
        pool = st.sampled_from([-(2**63), -7, -1, 0, 1, 2, 3, 1000, 2**40, 2**63 - 1])
        return st.lists(st.one_of(pool, st.integers(-(2**63), 2**63 - 1)), max_size=12)
    hi = SPECS[table].rows - 1
    return st.one_of(
        st.lists(st.integers(0, hi), max_size=30),
        st.integers(0, hi).map(lambda a: list(range(a, hi + 1))),  # sorted, unique, a block
    )


op = st.sampled_from(["s", "r", "d"]).flatmap(
    lambda t: st.tuples(st.just(t), _keys(t), st.booleans(), st.integers(0, 2**31 - 1))
)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 4),
    kind=st.sampled_from(["hash", "range"]),
    ops=st.lists(op, min_size=1, max_size=8),
)
def test_routed_shards_equal_one_shard(n, kind, ops):
    ref = ParameterShard(0, 1, TABLES)
    routed = Routed(n, kind)
    for step, (table, keys, push, seed) in enumerate(ops):
        k = np.array(keys, dtype=np.int64)
        want = ref.pull({table: k})[table]
        got = routed.pull(table, k)
        assert got.shape == (len(k), SPECS[table].cols)
        np.testing.assert_array_equal(got, want)
        got.fill(7.0)  # the result is the caller's own, writable array
        if push:
            g = np.random.default_rng(seed).standard_normal((len(k), SPECS[table].cols))
            ref.push(0, ref.clocks.pushed[0], {table: (k, g)}, 0.1 + 0.01 * step)
            routed.push(table, k, g, 0.1 + 0.01 * step)
    for t in TABLES:
        keys = np.arange(-3, 70) if t.sparse and t.rows < 0 else np.arange(t.rows)
        np.testing.assert_array_equal(routed.pull(t.name, keys), ref.pull({t.name: keys})[t.name])
