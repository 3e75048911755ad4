"""ParameterShard without Ray: storage, pushes, BSP aggregation, bad input leaves it unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from angelps.dedup import segment_sum
from angelps.partition import Partitioner
from angelps.push_checks import all_finite
from angelps.server.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec, init_rows

SGD = OptimizerSpec("sgd")
SPARSE = TableSpec(
    "emb", rows=-1, cols=3, sparse=True, init="normal", init_std=0.1, seed=5, optimizer=SGD
)
DENSE = TableSpec("w", rows=10, cols=2, init="uniform", init_std=1.0, seed=1, optimizer=SGD)


def _shards(n, tables=(SPARSE, DENSE), **kw):
    return [ParameterShard(i, n, list(tables), **kw) for i in range(n)]


def _snapshot(shard):
    return {name: shard.export(name) for name in shard.tables}


def _same(a, b):
    for name in a:
        ka, wa, sa = a[name]
        kb, wb, sb = b[name]
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(wa, wb)
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k])


def test_sparse_rows_are_created_with_deterministic_init_on_any_shard():
    keys = np.array([-3, 7, 2**40, 11, 0], dtype=np.int64)
    expected = init_rows(SPARSE, keys)
    for n in (1, 3):
        shards = _shards(n)
        sid = Partitioner(SPARSE, n).shard_of(keys)
        got = np.stack([shards[s].pull({"emb": keys[[i]]})["emb"][0] for i, s in enumerate(sid)])
        np.testing.assert_array_equal(got, expected)


def test_dense_block_and_pull_order_and_duplicates():
    (s0, s1) = _shards(2)
    assert (s0.tables["w"].lo, s0.tables["w"].hi) == (0, 5)
    np.testing.assert_array_equal(s1.pull({"w": None})["w"], init_rows(DENSE, np.arange(5, 10)))
    got = s1.pull({"w": np.array([9, 5, 9, 6])})["w"]
    np.testing.assert_array_equal(got, init_rows(DENSE, np.array([9, 5, 9, 6])))


def test_push_sums_duplicates_and_applies_sgd():
    (s,) = _shards(1)
    keys = np.array([4, 2, 4])
    before = s.pull({"emb": np.array([2, 4])})["emb"]
    g = np.ones((3, 3), dtype=np.float32)
    s.push(0, 0, {"emb": (keys, g)}, lr=0.5)
    after = s.pull({"emb": np.array([2, 4])})["emb"]
    np.testing.assert_allclose(after - before, [[-0.5] * 3, [-1.0] * 3], rtol=1e-6)
    assert s.stats()["updates"] == 1 and s.stats()["clocks"]["pushed"] == [1]


def test_push_to_unseen_sparse_key_equals_pull_then_push():
    (a,) = _shards(1)
    (b,) = _shards(1)
    g = np.full((1, 3), 0.25, dtype=np.float32)
    a.pull({"emb": np.array([42])})
    a.push(0, 0, {"emb": (np.array([42]), g)}, 0.1)
    b.push(0, 0, {"emb": (np.array([42]), g)}, 0.1)
    np.testing.assert_array_equal(
        a.pull({"emb": np.array([42])})["emb"], b.pull({"emb": np.array([42])})["emb"]
    )


def test_bsp_applies_one_update_on_the_sum_of_workers():
    mom = TableSpec("m", rows=4, cols=1, init="zeros", optimizer=OptimizerSpec("momentum"))
    (s,) = _shards(1, tables=[mom], num_workers=2, staleness=0)
    s.push(0, 0, {"m": (np.array([0, 1]), np.array([[1.0], [2.0]]))}, 0.1)
    # Worker 0's push alone is buffered: nothing applied yet, clock incomplete.
    np.testing.assert_array_equal(s.pull({"m": None})["m"], np.zeros((4, 1)))
    assert not s.clocks.can_pull(0, 1)
    s.push(1, 0, {"m": (np.array([1, 2]), np.array([[3.0], [4.0]]))}, 0.1)
    assert s.clocks.can_pull(0, 1) and s.clocks.applied == 1
    np.testing.assert_allclose(s.pull({"m": None})["m"][:, 0], [-0.1, -0.5, -0.4, 0.0])
    assert s.updates == 1
    # Second step: row 1's momentum holds ONE update (v = 5, the summed gradient), so a zero
    # gradient moves it by lr*m*v = 0.45. Rows not pushed are not touched (lazy updates).
    s.push(1, 1, {}, 0.1)
    s.push(0, 1, {"m": (np.array([1]), np.array([[0.0]]))}, 0.1)
    np.testing.assert_allclose(s.pull({"m": None})["m"][:, 0], [-0.1, -0.95, -0.4, 0.0], rtol=1e-6)


def test_ssp_and_asp_apply_each_push_at_once():
    for staleness in (1, -1):
        (s,) = _shards(1, tables=[DENSE], num_workers=2, staleness=staleness)
        before = s.pull({"w": None})["w"]
        s.push(0, 0, {"w": (np.array([0]), np.ones((1, 2)))}, 1.0)
        np.testing.assert_allclose(s.pull({"w": None})["w"][0], before[0] - 1.0, rtol=1e-6)


def test_push_out_of_clock_order_is_refused():
    (s,) = _shards(1)
    with pytest.raises(ValueError, match="worker 0 pushed clock 1 but its next clock is 0"):
        s.push(0, 1, {}, 0.1)
    with pytest.raises(ValueError, match=r"worker id 3 is out of range: this job has 1 worker"):
        s.push(3, 0, {}, 0.1)


BAD_PUSHES = [
    ({"nope": (np.array([1]), np.ones((1, 2)))}, r"unknown table 'nope'; tables: emb, w"),
    (
        {"w": (np.array([10]), np.ones((1, 2)))},
        r"table 'w': key 10 is outside the dense range \[0, 10\)",
    ),
    ({"w": (np.array([-1]), np.ones((1, 2)))}, r"key -1 is outside the dense range"),
    (
        {"w": (np.array([1.5]), np.ones((1, 2)))},
        r"table 'w': keys must be integers, got dtype float64",
    ),
    ({"w": (np.array([[1]]), np.ones((1, 2)))}, r"keys must be 1-D, got shape \(1, 1\)"),
    (
        {"w": (np.array([1, 2]), np.ones((2, 3)))},
        r"gradients of shape \(2, 3\) do not match 2 keys x 2 columns",
    ),
    (
        {"w": (np.array([1]), np.ones((1, 2), dtype=np.int64))},
        r"gradients must be floating point, got dtype int64",
    ),
    ({"w": (np.array([1]), np.array([[np.nan, 0.0]]))}, r"table 'w': gradient contains NaN or inf"),
    (
        {"emb": (np.array([1]), np.array([[np.inf, 0.0, 0.0]]))},
        r"table 'emb': gradient contains NaN or inf",
    ),
]


@pytest.mark.parametrize(("updates", "msg"), BAD_PUSHES)
def test_bad_push_is_rejected_and_nothing_changes(updates, msg):
    (s,) = _shards(1)
    s.pull({"emb": np.array([1, 2])})
    before = _snapshot(s)
    # A good table in the same push must not be applied either.
    good = {"emb": (np.array([1]), np.ones((1, 3), dtype=np.float32))}
    with pytest.raises(ValueError, match=msg):
        s.push(0, 0, {**good, **updates}, 0.1)
    _same(before, _snapshot(s))
    assert s.clocks.pushed == [0] and s.updates == 0


def test_bad_lr_and_key_not_on_this_shard():
    s0, _ = _shards(2)
    with pytest.raises(ValueError, match=r"learning rate nan must be a finite number >= 0"):
        s0.push(0, 0, {}, float("nan"))
    with pytest.raises(ValueError, match=r"key 7 is not held by this shard \(rows \[0, 5\)\)"):
        s0.pull({"w": np.array([1, 7])})


def test_nan_policy_skip_counts_and_keeps_other_tables():
    (s,) = _shards(1, nan_policy="skip")
    before_w = s.pull({"w": None})["w"]
    s.push(
        0,
        0,
        {"w": (np.array([0]), np.array([[np.nan, 1.0]])), "emb": (np.array([3]), np.ones((1, 3)))},
        0.1,
    )
    np.testing.assert_array_equal(s.pull({"w": None})["w"], before_w)
    assert s.stats()["skipped"] == {"emb": 0, "w": 1}
    np.testing.assert_allclose(
        s.pull({"emb": np.array([3])})["emb"], init_rows(SPARSE, np.array([3])) - 0.1, rtol=1e-5
    )
    with pytest.raises(ValueError, match=r"angel.ps.nan.policy='ignore' is not one of error, skip"):
        ParameterShard(0, 1, [DENSE], nan_policy="ignore")


def test_sparse_storage_grows_and_keeps_rows():
    (s,) = _shards(1, tables=[SPARSE])
    rng = np.random.default_rng(0)
    keys = rng.integers(-(2**62), 2**62, 5000)
    first = s.pull({"emb": keys})["emb"]
    more = rng.integers(-(2**62), 2**62, 3000)
    s.pull({"emb": more})
    np.testing.assert_array_equal(s.pull({"emb": keys})["emb"], first)
    k, w, _ = s.export("emb")
    assert (np.diff(k) > 0).all() and len(k) == len(np.unique(np.concatenate([keys, more])))
    np.testing.assert_array_equal(w, init_rows(SPARSE, k))


def test_segment_sum():
    inv = np.array([2, 0, 2, 1])
    vals = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(
        segment_sum(inv, vals, 3, np.dtype("float32")), [[2, 3], [6, 7], [4, 6]]
    )


def test_all_finite_is_exact_even_when_the_sum_overflows():
    big = np.full((4, 2), 1e308)
    assert all_finite(big)  # the float64 sum overflows to inf, the elements are finite
    assert not all_finite(np.array([[1.0, np.nan]]))
    assert not all_finite(np.array([np.inf, -np.inf]))
    assert all_finite(np.zeros((0, 3)))
