"""A swap's second table of the same keys checks the first one's slots before it probes its
index (angelps/storage/index.py ``hinted_lookup``, angelps/server/shard_swap.py ``_hint``): the
tables of a device tier's book are created alike, so one probe of an index serves both; where
their slots differ, the keys are looked up, and the rows read and written are the same."""

from __future__ import annotations

import numpy as np
import pytest

from angelps.server import shard_swap
from angelps.server.shard import ParameterShard
from angelps.storage import row_threads
from angelps.storage.index import hinted_lookup
from angelps.storage.open_index import OpenIndex
from angelps.storage.row_threads import RowThreads
from angelps.table import OptimizerSpec, TableSpec

MOM = OptimizerSpec("momentum")
EMB = TableSpec("emb", rows=-1, cols=8, sparse=True, init_std=0.1, seed=3, optimizer=MOM)
WIDE = TableSpec("wide", rows=-1, cols=1, sparse=True, init_std=0.1, seed=4, optimizer=MOM)


def test_a_hint_is_taken_where_the_key_is_there_and_looked_up_elsewhere() -> None:
    held = np.array([40, -7, 3, 2**62, 11], dtype=np.int64)
    idx = OpenIndex(lambda s: held[s])
    idx.insert(held, np.arange(5))
    keys = np.array([3, 11, 40, 99, -7, 2**62], dtype=np.int64)
    want = idx.lookup(keys)
    assert want.tolist() == [2, 4, 0, -1, 1, 3]
    for hint in (
        want,  # right
        np.array([2, 0, 0, -1, 1, 3]),  # 11's slot wrong
        np.array([-1, -1, -1, -1, -1, -1]),  # none known
        np.array([2, 4, 9, 3, 1, 99]),  # past the rows held, and 99 at 2**62's slot
    ):
        assert hinted_lookup(idx, lambda s: held[s], 5, keys, hint).tolist() == want.tolist()
    assert hinted_lookup(idx, lambda s: held[s], 5, keys, None).tolist() == want.tolist()


def _shard(first_pull: dict[str, np.ndarray]) -> ParameterShard:
    shard = ParameterShard(0, 1, [EMB, WIDE])
    for name, keys in first_pull.items():  # (rows made by one table alone: slots that differ)
        shard.tables[name].take_rows(keys)
    return shard


def _run(shard: ParameterShard, par: RowThreads | None) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    out = []
    for _ in range(3):
        read = np.unique(rng.integers(-50, 50, 60))
        back = np.unique(rng.integers(-50, 50, 40))
        writes = {
            "emb": (back, rng.standard_normal((len(back), 16)).astype(np.float32)),
            "wide": (back, rng.standard_normal((len(back), 2)).astype(np.float32)),
        }
        got = shard_swap.swap(shard._table, writes, {"emb": read, "wide": read}, par)
        out += [got["emb"], got["wide"]]
    for name in ("emb", "wide"):
        keys, w, state = shard.export(name)
        out += [keys, w, state["v"]]
    return out


@pytest.mark.parametrize("par", [None, 2])
@pytest.mark.parametrize("first", [{}, {"wide": np.array([7, -3, 30], dtype=np.int64)}])
def test_a_swap_reads_and_writes_the_rows_it_would_without_the_hint(
    monkeypatch: pytest.MonkeyPatch, par: int | None, first: dict[str, np.ndarray]
) -> None:
    monkeypatch.setattr(row_threads, "MIN_PART_ROWS", 8)  # (parts of these few keys too)
    threads = None if par is None else RowThreads(par)
    got = _run(_shard(first), threads)
    monkeypatch.setattr(shard_swap, "_hint", lambda last, keys: None)
    want = _run(_shard(first), threads)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_one_probe_of_an_index_serves_both_tables_of_a_book(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard = _shard({})
    keys = np.arange(0, 3000, 3, dtype=np.int64)
    shard_swap.swap(shard._table, {}, {"emb": keys, "wide": keys})  # (both made alike)
    probed: list[int] = []
    lookup = OpenIndex.lookup

    def counted(self: OpenIndex, k: np.ndarray) -> np.ndarray:
        probed.append(len(k))
        return lookup(self, k)

    monkeypatch.setattr(OpenIndex, "lookup", counted)
    block = np.zeros((len(keys), 16), dtype=np.float32)
    writes = {"emb": (keys, block), "wide": (keys, np.zeros((len(keys), 2), np.float32))}
    got = shard_swap.swap(shard._table, writes, {"emb": keys, "wide": keys})
    assert probed == [len(keys), len(keys)]  # (one for the write-backs, one for the reads)
    assert not got["emb"].any() and not got["wide"].any()
