"""The open-addressing key index (int32 slots, keys read from the table) against a dict, and a
shard table on it against one on pandas' khash index."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from angelps.server.shard import ParameterShard
from angelps.storage import index, open_index
from angelps.storage.open_index import OpenIndex
from angelps.storage.rows import PagedRows
from angelps.table import OptimizerSpec, TableSpec

I64 = st.integers(-(2**63), 2**63 - 1)
# Small key pools make duplicates across batches likely; the extremes of int64 are in them.
KEYS = st.one_of(I64, st.sampled_from([-(2**63), 2**63 - 1, -1, 0, 1]), st.integers(-50, 50))


class Model:
    """An OpenIndex over a key store, as a table uses it, beside a dict."""

    def __init__(self, size_hint: int = 0, page_rows: int | None = None) -> None:
        self.store = PagedRows(1, np.int64, page_rows=page_rows)
        self.index = OpenIndex(self.store.take1, size_hint)
        self.d: dict[int, int] = {}

    def add(self, keys: np.ndarray) -> None:
        """Look ``keys`` up, insert the absent ones as new slots, check against the dict."""
        got = self.index.lookup(keys)
        want = np.array([self.d.get(int(k), -1) for k in keys], dtype=np.int64)
        np.testing.assert_array_equal(got, want)
        new = np.unique(keys[got < 0])
        n = len(self.d)
        self.store.reserve(n + len(new))
        if len(new):
            self.store.write(n, new.reshape(-1, 1))
        self.index.insert(new, np.arange(n, n + len(new)))
        self.d.update({int(k): n + i for i, k in enumerate(new)})
        np.testing.assert_array_equal(self.index.lookup(keys), [self.d[int(k)] for k in keys])

    def check(self, probe: np.ndarray) -> None:
        keys = np.array(list(self.d), dtype=np.int64)
        np.testing.assert_array_equal(self.index.lookup(keys), list(self.d.values()))
        want = [self.d.get(int(k), -1) for k in probe]
        np.testing.assert_array_equal(self.index.lookup(probe), want)


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(KEYS, max_size=300), min_size=1, max_size=8),
    probe=st.lists(KEYS, max_size=50),
    hint=st.sampled_from([0, 10, 1000]),
)
def test_open_index_equals_a_dict_over_batches_with_repeats(batches, probe, hint):
    m = Model(hint, page_rows=64)  # several pages of keys: take1 crosses pages
    for b in batches:
        m.add(np.array(b, dtype=np.int64))  # duplicates inside a batch: looked up as one key
    m.check(np.array(probe, dtype=np.int64))
    assert m.index.count == len(m.d)
    assert m.index.count <= open_index.MAX_LOAD * m.index.capacity


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.lists(KEYS, max_size=200), min_size=1, max_size=5), data=st.data())
def test_rebuild_after_removing_keys_equals_a_dict(batches, data):
    m = Model()
    for b in batches:
        m.add(np.array(b, dtype=np.int64))
    keys = np.array(list(m.d), dtype=np.int64)
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys))))
    kept = keys[keep] if len(keys) else keys
    # Expiry: the kept rows are renumbered 0..k-1 in the store, then the index is rebuilt.
    if len(kept):
        m.store.write(0, kept.reshape(-1, 1))
    m.index.rebuild(kept)
    m.d = {int(k): i for i, k in enumerate(kept)}
    gone = keys[~keep] if len(keys) else keys
    m.check(gone)
    assert (m.index.lookup(gone) == -1).all()
    m.add(np.concatenate([gone, np.arange(-5, 5)]))  # removed keys come back as new slots


@pytest.mark.parametrize("chunk", [1 << 22, 64, 7])
def test_growth_keeps_every_key_and_the_load_bounded(monkeypatch, chunk):
    # (small chunks: the runs laid by growth meet at chunk bounds, keys behind a run)
    monkeypatch.setattr(open_index, "_CHUNK", chunk)
    rng = np.random.default_rng(3)
    m = Model()
    caps = set()
    for _ in range(12):
        m.add(rng.integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64))
        m.add(rng.integers(0, 40000, 3000))  # consecutive-ish small keys, many repeats
        caps.add(m.index.capacity)
    assert len(caps) > 3  # it grew several times
    m.check(rng.integers(-(2**63), 2**63 - 1, 1000, dtype=np.int64))
    load = m.index.count / m.index.capacity
    assert open_index.LOW_LOAD * 0.99 <= load <= open_index.MAX_LOAD
    assert m.index.nbytes() / m.index.count <= 4 / open_index.LOW_LOAD + 0.01


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.lists(KEYS, max_size=200), min_size=1, max_size=8),
    chunk=st.sampled_from([3, 16, 1 << 22]),
)
def test_growth_in_runs_equals_a_dict(batches, chunk):
    """Growth lays the old buckets' keys as runs (sorted by new home, a chunk at a time): every
    key stays found, every absent one stays absent, whatever the chunks and collisions."""
    old = open_index._CHUNK
    open_index._CHUNK = chunk
    try:
        m = Model(0, page_rows=64)
        for b in batches:
            m.add(np.array(b, dtype=np.int64))
            m.check(np.arange(-60, 60, dtype=np.int64))
    finally:
        open_index._CHUNK = old


def test_growth_lays_spread_keys_as_runs_past_a_wrapped_lead(monkeypatch):
    """Keys packed near the last bucket (their probes wrap to the first ones) among keys spread
    over the table: a growth lays the spread ones as runs and keeps all of them reachable."""
    monkeypatch.setattr(open_index, "_CHUNK", 16)
    m = Model(size_hint=200)
    cap = m.index.capacity
    cand = np.arange(-(10**6), 10**6, dtype=np.int64)
    home = m.index._home(cand)
    tail = cand[home == cap - 1][:30]  # all wrap past the end but one
    spread = cand[np.isin(home, np.arange(20, cap - 20, 3))][::50][:80]
    m.add(np.concatenate([tail, spread]))
    assert m.index.buckets[:5].all()  # the wrapped lead run
    probed: list[int] = []
    place = m.index._place
    m.index._place = lambda keys, tags: (probed.append(len(keys)), place(keys, tags))[1]
    m.index._grow(m.index.count + 100)
    # Only the lead run (the wrapped keys) and the keys behind or past a run are probed in;
    # the rest are laid as runs (a lead put into the first run would push all after it).
    assert sum(probed) <= len(tail) + 2
    m.add(cand[:400])  # grows again, through insert
    m.check(cand[:2000])


def test_a_full_window_of_collisions_is_probed_past():
    """Keys that all hash near one bucket (a long run) are found and inserted past it."""
    m = Model(size_hint=2000)
    cap = m.index.capacity
    # Keys whose home bucket is 0: the top 32 bits of key * golden scaled to cap.
    cand = np.arange(-(10**6), 10**6, dtype=np.int64)
    home = m.index._home(cand)
    same = cand[home == home[0]][:40]
    assert len(same) >= 20 and cap > 100
    m.add(same[:20])
    m.add(same)
    m.check(cand[:500])


def _trained(monkeypatch, kind: str) -> tuple[ParameterShard, dict]:
    monkeypatch.setattr(index, "HASH_KIND", kind)
    spec = TableSpec(
        "emb", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, seed=5,
        optimizer=OptimizerSpec("momentum", momentum=0.9),
    )  # fmt: skip
    shard = ParameterShard(0, 1, [spec], eviction_ttl_updates=3)
    rng = np.random.default_rng(1)
    pulled = {}
    for step in range(8):
        keys = np.unique(rng.integers(-(2**63), 2**63 - 1, 400, dtype=np.int64))
        keys = np.unique(np.concatenate([keys, rng.integers(-30, 30, 40)]))
        pulled[step] = shard.pull({"emb": keys})["emb"]
        g = rng.standard_normal((len(keys), 4)).astype(np.float32)
        shard.push(0, step, {"emb": (keys, g)}, 0.1)
        if step == 5:
            shard.tables["emb"].evict()  # expiry: rows removed, the index rebuilt
    return shard, pulled


def test_a_shard_table_on_the_open_index_equals_one_on_khash(monkeypatch):
    a, pa = _trained(monkeypatch, "open")
    b, pb = _trained(monkeypatch, "khash")
    assert a.tables["emb"].index_kind == "hash" and b.tables["emb"].index_kind == "khash"
    assert a.tables["emb"].evicted == b.tables["emb"].evicted > 0
    for step in pa:
        np.testing.assert_array_equal(pa[step], pb[step])
    ka, wa, sa = a.tables["emb"].export()
    kb, wb, sb = b.tables["emb"].export()
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(wa, wb)
    assert sa.keys() == sb.keys() and len(sa) == 1
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k])
    assert a.tables["emb"].index.nbytes() < b.tables["emb"].index.nbytes() / 2


def test_too_many_rows_for_int32_slots_is_refused():
    m = Model()
    with pytest.raises(ValueError, match="a shard's table holds at most 2147483646 rows"):
        m.index.insert(np.array([7]), np.array([2**31 - 1]))
