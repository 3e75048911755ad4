"""Reading an input: worker parts, chunks, directories, the validation split, mini-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from learners import data as D
from tests.learners.data_helpers import A9A, DNA, C, read_all, write


def test_missing_input() -> None:
    with pytest.raises(D.DataError, match="no such input file or directory"):
        list(D.read_file("does/not/exist.libsvm", C()))


# --- chunks, workers, directories --------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_worker_parts_are_disjoint_and_cover(workers: int) -> None:
    cfg = C()
    whole = D.load_file(str(A9A), cfg)
    parts = [
        read_all(str(A9A), cfg, worker_id=w, num_workers=workers, chunk_rows=5000)
        for w in range(workers)
    ]
    idx = np.concatenate([p.row_index for p in parts])
    assert idx.size == len(whole) and np.unique(idx).size == idx.size
    merged = D.concat(parts).take(np.argsort(idx))
    assert np.array_equal(merged.ids, whole.ids) and np.array_equal(merged.labels, whole.labels)
    # Each worker reads whole blocks of P = ceil(1/0.05) = 20 lines, round robin.
    for w, p in enumerate(parts):
        assert ((p.row_index // 20) % workers == w).all()


def test_chunks_never_exceed_chunk_rows() -> None:
    cfg = C()
    for w in range(3):
        sizes = [
            len(b) for b in D.read_file(str(DNA), cfg, worker_id=w, num_workers=3, chunk_rows=7)
        ]
        assert max(sizes) == 7 and sum(sizes) > 600


def test_validation_split_is_angels_rule_and_independent_of_workers(tmp_path: Path) -> None:
    cfg = C(**{"angel.train.data.path": str(A9A)})
    train, valid = D.load_train_valid(cfg)
    assert len(valid) == 1629 and len(train) == 32561 - 1629  # ceil(32561 / 20)
    assert (valid.row_index % 20 == 0).all() and (train.row_index % 20 != 0).all()
    for workers in (2, 3):
        vs = [D.load_train_valid(cfg, worker_id=w, num_workers=workers)[1] for w in range(workers)]
        assert (
            sorted(np.concatenate([v.row_index for v in vs]).tolist()) == valid.row_index.tolist()
        )
        sizes = [len(v) for v in vs]
        assert max(sizes) - min(sizes) <= 1  # every worker holds its share
    cfg3 = C(**{"angel.train.data.path": str(A9A), "ml.data.validate.ratio": 0.3})
    assert D.split_period(cfg3) == 4
    assert len(D.load_train_valid(cfg3)[1]) == 8141  # ceil(32561 / 4)
    none = C(**{"angel.train.data.path": str(A9A), "ml.data.validate.ratio": 0.0})
    tr, va = D.load_train_valid(none)
    assert len(tr) == 32561 and len(va) == 0
    vp = write(tmp_path, "1 1:1\n-1 2:1\n")
    tr, va = D.load_train_valid(
        C(**{"angel.train.data.path": str(A9A), "angel.validate.data.path": vp})
    )
    assert len(tr) == 32561 and va.ids.tolist() == [0, 1]
    with pytest.raises(ValueError, match=r"angel\.train\.data\.path is not set"):
        D.load_train_valid(C())


def test_streaming_train_chunks_equal_in_memory_train() -> None:
    cfg = C(**{"angel.train.data.path": str(A9A), "ml.data.chunk.rows": 3000})
    for w in range(2):
        train, _ = D.load_train_valid(cfg, worker_id=w, num_workers=2)
        chunks = list(D.iter_train_chunks(cfg, worker_id=w, num_workers=2))
        assert len(chunks) > 2 and max(len(c) for c in chunks) <= 3000
        streamed = D.concat(chunks)
        assert np.array_equal(streamed.row_index, train.row_index)
        assert np.array_equal(streamed.ids, train.ids)


def test_stream_minibatches_hold_one_chunk_and_cover_the_train_rows() -> None:
    cfg = C(**{"angel.train.data.path": str(A9A), "ml.data.chunk.rows": 2500})
    train, _ = D.load_train_valid(cfg, worker_id=1, num_workers=2)
    kw: dict[str, Any] = {"worker_id": 1, "num_workers": 2}
    plain = list(D.iter_stream_minibatches(cfg, 100, shuffle=False, seed=0, epoch=0, **kw))
    assert np.array_equal(D.concat(plain).row_index, train.row_index)
    shuffled = list(D.iter_stream_minibatches(cfg, 100, shuffle=True, seed=3, epoch=1, **kw))
    sizes = [len(b) for b in shuffled]
    assert sizes[:-1] == [100] * (len(sizes) - 1) and sum(sizes) == len(train)
    order = np.concatenate([b.row_index for b in shuffled])
    assert np.array_equal(np.sort(order), train.row_index)
    assert not np.array_equal(order, train.row_index)
    again = list(D.iter_stream_minibatches(cfg, 100, shuffle=True, seed=3, epoch=1, **kw))
    assert np.array_equal(np.concatenate([b.row_index for b in again]), order)
    # A window of one chunk: the first batches come from the first chunk only.
    first = next(D.iter_train_chunks(cfg, **kw))
    head = (len(first) // 100) * 100
    assert np.isin(order[:head], first.row_index).all() and head > 2000
    dropped = list(
        D.iter_stream_minibatches(cfg, 100, shuffle=True, seed=3, epoch=1, drop_last=True, **kw)
    )
    assert [len(b) for b in dropped] == [100] * (len(train) // 100)


def test_directory_input_continues_line_index(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.libsvm").write_text("1 1:1\n\n-1 2:1\n")
    (d / "b.libsvm").write_text("1 3:1\n1 4:x\n")
    (d / "_SUCCESS").write_text("")
    with pytest.raises(
        D.DataError, match=r"b\.libsvm:2: the value of feature 4 is .x., not a number; expected"
    ):
        read_all(str(d), C())
    b = read_all(str(d), C(**{"ml.data.skip.bad.lines": True}))
    assert b.row_index.tolist() == [0, 2, 3]
    assert b.ids.tolist() == [0, 1, 2]


# --- mini-batches --------------------------------------------------------------------------------


def test_iter_minibatches_order_is_a_function_of_seed_and_epoch() -> None:
    data = D.load_file(str(DNA), C())

    def order(seed: int, epoch: int, **kw: Any) -> list[int]:
        return [
            int(i)
            for mb in D.iter_minibatches(data, 128, seed=seed, epoch=epoch, **kw)
            for i in mb.row_index
        ]

    a = order(1, 3, shuffle=True)
    assert a == order(1, 3, shuffle=True)
    assert a != order(1, 4, shuffle=True) and a != order(2, 3, shuffle=True)
    assert sorted(a) == list(range(2000))
    assert order(1, 3, shuffle=False) == list(range(2000))
    sizes = [len(mb) for mb in D.iter_minibatches(data, 128, shuffle=True, seed=0, epoch=0)]
    assert sizes == [128] * 15 + [80]
    sizes = [
        len(mb)
        for mb in D.iter_minibatches(data, 128, shuffle=True, seed=0, epoch=0, drop_last=True)
    ]
    assert sizes == [128] * 15
    with pytest.raises(ValueError, match="batch_size=0"):
        next(D.iter_minibatches(data, 0, shuffle=False, seed=0, epoch=0))


def test_unshuffled_minibatches_are_the_rows_take_would_give() -> None:
    """In file order batches are views (Batch.slice), equal to take() of the same rows."""
    data = D.load_file(str(DNA), C())
    for drop_last, sizes in ((False, [300] * 6 + [200]), (True, [300] * 6)):
        got = list(
            D.iter_minibatches(data, 300, shuffle=False, seed=0, epoch=0, drop_last=drop_last)
        )
        assert [len(mb) for mb in got] == sizes
        for i, mb in enumerate(got):
            ref = data.take(np.arange(i * 300, i * 300 + len(mb)))
            for f in ("labels", "indptr", "ids", "values", "row_index"):
                np.testing.assert_array_equal(getattr(mb, f), getattr(ref, f))
