"""The two sparse key indexes of a shard table (direct for small bounded spans, hash otherwise)
give bit-identical rows, optimizer state and checkpoint exports."""

from __future__ import annotations

import numpy as np
import pytest

from angelps.partition import Partitioner
from angelps.server.shard import ParameterShard
from angelps.storage import index
from angelps.table import OptimizerSpec, TableSpec, init_rows

ROWS = 1000
ADAM = OptimizerSpec("adam")
BOUNDED = TableSpec(
    "emb", rows=ROWS, cols=4, sparse=True, init="normal", init_std=0.1, seed=9, optimizer=ADAM
)
UNBOUNDED = TableSpec(
    "emb", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, seed=9, optimizer=ADAM
)
DEVICES = [None, "cpu"]  # host numpy tables and torch tables (TorchTable)


def _shards(spec, n=1, partitioner="hash", device=None):
    return [ParameterShard(i, n, [spec], partitioner=partitioner, device=device) for i in range(n)]


def _by_shard(spec, n, partitioner, keys):
    """``keys`` (any order, duplicates allowed) split by owning shard, order kept."""
    sid = Partitioner(spec, n, partitioner).shard_of(keys)
    return [np.flatnonzero(sid == s) for s in range(n)]


def _pull(shards, spec, partitioner, keys):
    out = np.empty((len(keys), spec.cols), dtype=np.float32)
    for s, pos in enumerate(_by_shard(spec, len(shards), partitioner, keys)):
        if len(pos):
            out[pos] = shards[s].pull({"emb": keys[pos]})["emb"]
    return out


def _push(shards, spec, partitioner, clock, keys, grads):
    for s, pos in enumerate(_by_shard(spec, len(shards), partitioner, keys)):
        shards[s].push(0, clock, {"emb": (keys[pos], grads[pos])}, 0.05)


def _export(shards):
    """(keys, rows, state) of all shards together, in key order; each shard's export sorted."""
    parts = [s.export("emb") for s in shards]
    for k, _, _ in parts:
        assert (np.diff(k) > 0).all()
    keys = np.concatenate([p[0] for p in parts])
    order = np.argsort(keys, kind="stable")
    w = np.concatenate([p[1] for p in parts])[order]
    state = {name: np.concatenate([p[2][name] for p in parts])[order] for name in parts[0][2]}
    return keys[order], w, state


def _run(spec, n, partitioner, device, steps=8, seed=0):
    """Random pulls and pushes (unsorted, with duplicates, new and old keys) for ``steps``
    clocks; returns every pull and the final export."""
    shards = _shards(spec, n, partitioner, device)
    rng = np.random.default_rng(seed)
    pulls = []
    for clock in range(steps):
        keys = rng.integers(0, ROWS, rng.integers(1, 300))
        pulls.append(_pull(shards, spec, partitioner, keys))
        push_keys = rng.integers(0, ROWS, rng.integers(1, 300))
        grads = rng.normal(size=(len(push_keys), spec.cols)).astype(np.float32)
        _push(shards, spec, partitioner, clock, push_keys, grads)
    return pulls, _export(shards), shards


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("n", "partitioner"), [(1, "hash"), (3, "hash"), (3, "range")])
def test_bounded_and_unbounded_tables_are_bit_identical(n, partitioner, device):
    pulls_b, (kb, wb, sb), shards_b = _run(BOUNDED, n, partitioner, device)
    pulls_u, (ku, wu, su), shards_u = _run(UNBOUNDED, n, partitioner, device)
    assert {s.tables["emb"].index_kind for s in shards_b} == {"direct"}
    assert {s.tables["emb"].index_kind for s in shards_u} == {"hash"}
    for a, b in zip(pulls_b, pulls_u, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(kb, ku)
    np.testing.assert_array_equal(wb, wu)
    assert sorted(sb) == sorted(su) == ["m", "t", "v"]  # Adam: moments and step count
    for name in sb:
        np.testing.assert_array_equal(sb[name], su[name])


def test_index_kind_follows_the_table_bound_and_span(monkeypatch):
    def table(spec, n=1, partitioner="hash", shard=0):
        return ParameterShard(shard, n, [spec], partitioner=partitioner).tables["emb"]

    assert index.DIRECT_MAX == 1 << 24
    assert table(BOUNDED).index_kind == "direct"
    assert table(UNBOUNDED).index_kind == "hash"  # angelps.storage.open_index
    assert table(TableSpec("emb", rows=10, cols=2)).index_kind == "dense"
    # A span above the cap gets the hash index, unless range partitioning splits the key
    # range into shard spans small enough (a small cap keeps the test's allocations small).
    monkeypatch.setattr(index, "DIRECT_MAX", 100)
    big = TableSpec("emb", rows=200, cols=1, sparse=True)
    assert table(big).index_kind == "hash"
    assert table(big, n=4, partitioner="hash").index_kind == "hash"  # span [0, rows)
    t = table(big, n=4, partitioner="range", shard=3)
    assert t.index_kind == "direct" and t.index.span == (150, 200)


@pytest.mark.parametrize("device", DEVICES)
def test_range_partitioned_bounded_table_keeps_each_shard_in_its_range(device):
    shards = _shards(BOUNDED, 3, "range", device)
    part = Partitioner(BOUNDED, 3, "range")
    rng = np.random.default_rng(1)
    keys = rng.permutation(ROWS)[:600]
    _pull(shards, BOUNDED, "range", keys)
    grads = rng.normal(size=(len(keys), BOUNDED.cols)).astype(np.float32)
    _push(shards, BOUNDED, "range", 0, keys, grads)
    ref = _shards(UNBOUNDED, 1, device=device)[0]  # the same work on one hash-index shard
    ref.pull({"emb": keys})
    ref.push(0, 0, {"emb": (keys, grads)}, 0.05)
    rk, rw, rs = ref.export("emb")
    total = 0
    for i, s in enumerate(shards):
        t = s.tables["emb"]
        lo, hi = part.row_range(i)
        assert t.index_kind == "direct" and t.index.span == (lo, hi)
        k, w, st = s.export("emb")
        assert (np.diff(k) > 0).all() and (k >= lo).all() and (k < hi).all()
        np.testing.assert_array_equal(k, np.sort(keys[(keys >= lo) & (keys < hi)]))
        mine = (rk >= lo) & (rk < hi)
        np.testing.assert_array_equal(w, rw[mine])
        for name in st:
            np.testing.assert_array_equal(st[name], rs[name][mine])
        total += len(k)
    assert total == len(keys)


def test_key_outside_a_direct_index_span_is_refused_before_any_change():
    s0 = _shards(BOUNDED, 3, "range")[0]
    hi = Partitioner(BOUNDED, 3, "range").row_range(0)[1]
    s0.pull({"emb": np.array([1, 2])})
    before = s0.export("emb")
    with pytest.raises(
        ValueError, match=rf"key {hi} is not held by this shard \(keys \[0, {hi}\)\)"
    ):
        s0.push(0, 0, {"emb": (np.array([0, hi]), np.ones((2, BOUNDED.cols)))}, 0.1)
    with pytest.raises(ValueError, match=rf"key {hi + 5} is not held by this shard"):
        s0.pull({"emb": np.array([3, hi + 5])})
    after = s0.export("emb")
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert s0.stats()["rows"] == {"emb": 2} and s0.clocks.pushed == [0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [BOUNDED, UNBOUNDED], ids=["direct", "hash"])
def test_rows_created_over_many_calls_in_random_order_export_sorted(spec, device):
    (s,) = _shards(spec, device=device)
    rng = np.random.default_rng(2)
    seen: set[int] = set()
    for _ in range(60):
        keys = rng.integers(0, ROWS, rng.integers(1, 40))  # unsorted, with duplicates
        got = s.pull({"emb": keys})["emb"]
        np.testing.assert_array_equal(got, init_rows(spec, keys))
        seen.update(int(k) for k in keys)
    k, w, st = s.export("emb")
    np.testing.assert_array_equal(k, np.array(sorted(seen), dtype=np.int64))
    np.testing.assert_array_equal(w, init_rows(spec, k))
    for v in st.values():
        assert len(v) == len(k) and not v.any()
    assert s.stats()["rows"] == {"emb": len(seen)}
    # The slots themselves are in creation order, not key order: export sorted them.
    t = s.tables["emb"]
    slot_keys = t.slot_keys().tolist()
    assert sorted(slot_keys) == k.tolist() and slot_keys != k.tolist()
