"""Duplicate keys (angelps.dedup): unique keys with their slots, rows summed per key."""

from __future__ import annotations

import numpy as np
import pytest

from angelps.dedup import Dedup, dedup, merge_rows, segment_sum, strictly_increasing


@pytest.mark.parametrize(
    ("num_features", "n"),
    [(1000, 5000), (1000, 100), (10**7, 5000)],
    ids=["mask", "sort-small-batch", "sort-large-range"],
)
def test_dedup_matches_numpy_unique(num_features, n):
    rng = np.random.default_rng(0)
    d = Dedup(num_features)
    for _ in range(3):  # the mask and the remap table must be clean for the next call
        ids = rng.integers(0, num_features, size=n)
        uniq, inv = d(ids)
        u2, i2 = np.unique(ids, return_inverse=True)
        np.testing.assert_array_equal(uniq, u2)
        np.testing.assert_array_equal(inv, i2)
        assert uniq.dtype == inv.dtype == np.int64
    uniq, inv = Dedup(-1)(np.array([10**12, 5, 10**12]))
    np.testing.assert_array_equal(uniq, [5, 10**12])
    np.testing.assert_array_equal(inv, [1, 0, 1])


@pytest.mark.parametrize("span", [50, 10**6, 2**62], ids=["mask", "unique", "hashed"])
def test_unbounded_dedup_matches_numpy_unique(span):
    rng = np.random.default_rng(1)
    keys = rng.integers(-span, span, size=400)
    uniq, inv = dedup(keys)
    u2, i2 = np.unique(keys, return_inverse=True)
    np.testing.assert_array_equal(uniq, u2)
    np.testing.assert_array_equal(inv, i2)
    assert uniq.dtype == inv.dtype == np.int64
    assert dedup(np.zeros(0, dtype=np.int64))[0].shape == (0,)


def test_a_bound_beyond_the_remap_cap_falls_back_to_the_span():
    d = Dedup(1 << 40)
    assert not d.bounded
    uniq, inv = d(np.array([1 << 39, 3, 3]))
    np.testing.assert_array_equal(uniq, [3, 1 << 39])
    np.testing.assert_array_equal(inv, [1, 0, 0])


def test_merge_rows_sums_duplicates():
    ids, g = merge_rows(
        [
            (np.array([3, 1]), np.array([[1.0], [2.0]])),
            (np.array([1, 7]), np.array([[10.0], [5.0]])),
        ]
    )
    np.testing.assert_array_equal(ids, [1, 3, 7])
    np.testing.assert_array_equal(g[:, 0], [12.0, 1.0, 5.0])


def test_merge_rows_keeps_the_dtype_and_a_single_part():
    part = (np.array([2, 1]), np.ones((2, 3), dtype=np.float32))
    assert merge_rows([part]) is part
    _, g = merge_rows([part, part])
    assert g.dtype == np.float32 and g.shape == (2, 3)
    np.testing.assert_array_equal(g, np.full((2, 3), 2.0))


def test_segment_sum_and_strictly_increasing():
    inv = np.array([2, 0, 2, 1])
    vals = np.array([[1.0], [2.0], [3.0], [4.0]])
    np.testing.assert_array_equal(segment_sum(inv, vals, 3, np.dtype("float64"))[:, 0], [2, 4, 4])
    assert strictly_increasing(np.array([1, 2, 5])) and strictly_increasing(np.array([7]))
    assert not strictly_increasing(np.array([1, 1, 2]))
