"""The CSR batch: take, slice, concat, dense rows and field ids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners import data as D
from tests.learners.data_helpers import CENSUS_DUMMY, C, rows

# --- batches -------------------------------------------------------------------------------------


def small_batch() -> D.Batch:
    return D.Batch(
        labels=np.array([1, 0, 1, 0], np.float32),
        indptr=np.array([0, 2, 2, 5, 6], np.int64),
        ids=np.array([1, 4, 0, 2, 3, 7], np.int64),
        values=np.arange(6, dtype=np.float32),
        row_index=np.array([10, 11, 12, 13], np.int64),
    )


def test_take_concat_and_dense() -> None:
    b = small_batch()
    t = b.take(np.array([2, 0, 1, 2]))
    assert t.indptr.tolist() == [0, 3, 5, 5, 8]
    assert t.ids.tolist() == [0, 2, 3, 1, 4, 0, 2, 3]
    assert t.values.tolist() == [2, 3, 4, 0, 1, 2, 3, 4]
    assert t.row_index.tolist() == [12, 10, 11, 12]
    m = b.take(np.array([False, True, True, False]))
    assert rows(m) == [(0.0, [], []), (1.0, [0, 2, 3], [2.0, 3.0, 4.0])]
    assert len(b.take(np.array([], np.int64))) == 0
    c = D.concat([b.take(np.array([0, 1])), D.Batch.empty(), b.take(np.array([2, 3]))])
    assert rows(c) == rows(b) and c.indptr.tolist() == b.indptr.tolist()
    assert len(D.concat([])) == 0
    dense = b.to_dense(8)
    assert dense[2].tolist() == [2, 0, 3, 4, 0, 0, 0, 0] and dense[1].sum() == 0
    with pytest.raises(ValueError, match="feature id 7 does not fit a dense row of 5 features"):
        b.to_dense(5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 50), max_size=5), max_size=12),
    st.data(),
)
def test_take_and_concat_match_row_lists(row_ids: list[list[int]], data: st.DataObject) -> None:
    n = len(row_ids)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum([len(r) for r in row_ids], out=indptr[1:])
    flat = np.array([i for r in row_ids for i in r], np.int64)
    b = D.Batch(
        labels=np.arange(n, dtype=np.float32),
        indptr=indptr,
        ids=flat,
        values=flat.astype(np.float32) / 2,
        row_index=np.arange(n, dtype=np.int64) * 3,
    )
    pick = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20)) if n else []
    t = b.take(np.array(pick, np.int64))
    assert rows(t) == [(float(r), row_ids[r], [i / 2 for i in row_ids[r]]) for r in pick]
    assert t.row_index.tolist() == [3 * r for r in pick]
    cut = data.draw(st.integers(0, n))
    c = D.concat([b.take(np.arange(cut)), b.take(np.arange(cut, n))])
    assert rows(c) == rows(b) and c.indptr.tolist() == b.indptr.tolist()


def test_field_ids() -> None:
    census = D.load_file(str(CENSUS_DUMMY), C(**{"ml.data.type": "dummy"}))
    f = census.field_ids(13)
    assert f.shape == (22792, 13) and f[0].tolist() == [
        3,
        9,
        18,
        39,
        43,
        50,
        65,
        71,
        76,
        80,
        93,
        99,
        106,
    ]
    with pytest.raises(
        ValueError,
        match=r"row at line index 10 has 2 features, expected exactly ml.fm.field.num=3 \(one per field\); 3 of 4 rows differ",
    ):
        small_batch().field_ids(3)
