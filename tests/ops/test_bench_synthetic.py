"""bench/synthetic.py: the power-law click-data generator and its teacher; the rank AUC."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from synthetic import SyntheticSpec, auc, generate, write_parquet


def test_auc_matches_sklearn_with_ties() -> None:
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    y = rng.random(5000) < 0.3
    s = np.round(rng.random(5000) + 0.5 * y, 1)  # rounding makes many ties
    assert auc(y, s) == pytest.approx(sklearn.roc_auc_score(y, s), abs=1e-12)
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert np.isnan(auc(np.ones(3), np.arange(3.0)))


def test_ids_stay_in_their_field_and_follow_zipf() -> None:
    spec = SyntheticSpec(num_ids=26_000, seed=1)
    d = generate(spec, 40_000, seed=0)
    v = spec.ids_per_field
    assert d.ids.shape == (40_000, 26) and d.ids.dtype == np.int64
    fields = d.ids // v
    assert (fields == np.arange(26)[None, :]).all()
    # The most frequent id of a field has probability 1/H(v, 1.1).
    h = (np.arange(1, v + 1, dtype=np.float64) ** -1.1).sum()
    top = np.bincount(d.ids[:, 0] - 0, minlength=v).max() / 40_000
    assert top == pytest.approx(1.0 / h, rel=0.05)
    # Popular ids are scattered, not neighbours.
    counts = np.bincount(d.ids[:, 3] - 3 * v, minlength=v)
    top5 = np.sort(np.argsort(counts)[-5:])
    assert np.diff(top5).min() > 1


def test_same_seed_same_rows_and_teacher_is_the_ceiling() -> None:
    spec = SyntheticSpec(num_ids=100_000, seed=7)
    a = generate(spec, 20_000, seed=5)
    b = generate(spec, 20_000, seed=5)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.ids, generate(spec, 20_000, seed=6).ids)
    best = a.best_auc()
    assert 0.8 < best < 0.95
    assert abs(a.labels.mean() - a.teacher_p.mean()) < 0.01
    # A model that knows only the linear part of the teacher ranks worse than the teacher.
    only_bias = auc(a.labels, np.zeros(len(a)))
    assert only_bias == 0.5 and best > only_bias


def test_cover_rows_touch_every_id_once_per_field() -> None:
    spec = SyntheticSpec(num_ids=2_600)
    d = generate(spec, 50, seed=0, cover_rows=spec.ids_per_field)
    cover = d.ids[: spec.ids_per_field]
    for f in range(spec.fields):
        assert np.array_equal(np.sort(cover[:, f]), np.arange(f * 100, (f + 1) * 100))
    assert len(d) == 150


def test_parquet_round_trip(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    d = generate(SyntheticSpec(num_ids=2_600), 1000, seed=0)
    t = pq.read_table(write_parquet(tmp_path / "x.parquet", d, row_group=300))
    assert t.column_names == ["label", "ids"]
    assert np.array_equal(np.array(t["ids"].to_pylist()), d.ids)
    assert np.array_equal(t["label"].to_numpy(), d.labels)


def test_too_few_ids() -> None:
    with pytest.raises(ValueError, match="num_ids=10 gives no id per field for 26 fields"):
        generate(SyntheticSpec(num_ids=10), 5)
