"""A device tier's eviction with the read after the next one known (one worker, two swaps in
flight: learners/worker/held_tables.py): the rows that read will need go last, not pinned,
so fewer rows are written back and asked for again in the same swap; training stays exact."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from angelps import OptimizerSpec, TableSpec
from learners.worker.device_tier import TierBook, TierPolicy
from learners.worker.held_tables import HeldTables
from tests.learners.test_device_tier import _pair, _Shards


def _full_book(policy: TierPolicy) -> TierBook:
    """A tier of 8 rows holding ids 0-7 in slots 0-7, slot i last read at clock i + 1 and its
    id seen i + 1 times; the next read's clock 10."""
    spec = TableSpec("e", 100, 2, sparse=True, optimizer=OptimizerSpec("sgd"))
    shards = _Shards([spec], 1)
    held = HeldTables(
        [spec], 0, 1, "hash", torch.device("cpu"), "gloo", {"e": 8}, policy, lambda: shards
    )
    book = held.books[0]
    slots, _ = book.read(np.arange(8))
    assert slots is not None and sorted(book.key_at[slots].tolist()) == list(range(8))
    book.end_update()
    book.settled()
    order = np.argsort(book.key_at[:8])
    book.used[order] = np.arange(1, 9)
    for i in range(8):
        book.seen.add(np.arange(i, 8))  # (id i seen i + 1 times)
    book._clock = book._floor = 10
    return book


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_the_rows_of_the_read_after_the_next_go_last_and_stay_evictable(eviction: str) -> None:
    book = _full_book(TierPolicy(eviction))

    def ids(victims: np.ndarray) -> list[int]:
        return sorted(book.key_at[victims].tolist())

    assert ids(book._choose(3, 10)) == [0, 1, 2]
    keep = book.lookup(np.array([0, 2]))
    assert ids(book._choose(3, 10, keep)) == [1, 3, 4]
    # (not pinned: where the others are too few, they go too, the oldest or rarest first)
    keep = book.lookup(np.array([0, 2]))
    assert ids(book._choose(7, 10, keep)) == [0, 1, 3, 4, 5, 6, 7]
    assert (book.used < 10).all()  # (nothing pinned at the next read's clock)


class _Counting(_Shards):
    """Shards that count, per swap, the ids both written back and read."""

    both: ClassVar[list[int]] = []

    def swap_call(self, shard: int, writes: Any, reads: Any) -> Any:
        if writes and reads:
            name = next(iter(writes))
            _Counting.both.append(len(np.intersect1d(writes[name][0], reads[name])))
        return super().swap_call(shard, writes, reads)


def _with_and_without(
    same_ids: bool, capacity: int, eviction: str, monkeypatch: pytest.MonkeyPatch
) -> dict[bool, tuple[HeldTables, int]]:
    """:func:`_pair`'s run with the batch after the next one asked for as the next one is
    prefetched, with the room knowing that read (True) and blind to it (False), each checked
    against the tables held whole; the tables of each run, and the rows both written back and
    read by one swap (counted where the shards are :class:`_Counting`)."""
    want, _ = _pair(None, same_ids, True)
    runs = {}
    blind = TierBook.make_room
    for lookahead in (True, False):
        if not lookahead:
            monkeypatch.setattr(TierBook, "make_room", lambda self, soon=None: blind(self))
        _Counting.both = []
        got, held = _pair(capacity, same_ids, True, TierPolicy(eviction), ask=True, two=True)
        for n in ("w", "v"):
            np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
        runs[lookahead] = (held, sum(_Counting.both))
    return runs


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_fewer_rows_go_back_and_come_again_in_one_swap_and_training_stays_exact(
    eviction: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tables keyed alike over 2 shards, 10 updates with the batch after the next one
    asked for as the next one is prefetched: with the lookahead, fewer rows are both written
    back and read by one swap than with the eviction blind to it, the tier's hit rate is
    higher, and every row ends as when the tables are held whole."""
    import tests.learners.test_device_tier as dt

    monkeypatch.setattr(dt, "_Shards", _Counting)
    runs = {}
    for lookahead, (held, both) in _with_and_without(True, 160, eviction, monkeypatch).items():
        counts = held.tier_counts()
        assert held.asked_two > 0 and counts.writebacks > 0
        runs[lookahead] = (both, counts.hits / counts.lookups)
    assert runs[False][0] > 0
    assert runs[True][0] < runs[False][0]
    assert runs[True][1] > runs[False][1]


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_a_book_read_with_ids_of_its_own_tables_keeps_the_read_after_last_too(
    eviction: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tables in one book, each read with ids of its own: the next read is not staged
    (its union is asked for) and one swap is in flight, but the batch after is peeked at all
    the same; the room made for the next read keeps that batch's rows last: a higher hit rate
    than with the room blind to it, and every row as when the tables are held whole."""
    hits = {}
    for lookahead, (held, _) in _with_and_without(False, 200, eviction, monkeypatch).items():
        counts = held.tier_counts()
        assert held.asked_two == 0 and held.asked_ahead > 0 and counts.writebacks > 0
        hits[lookahead] = counts.hits / counts.lookups
    assert hits[True] > hits[False], hits
