"""Text readers (libsvm, dummy, dense), worker parts, validation split, label transforms, batches."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from angelps.config import ConfigError, load_config
from learners import data as D

REPO = Path(__file__).resolve().parents[2]
A9A = REPO / "data" / "a9a" / "a9a_123d_train.libsvm"
A9A_DUMMY = REPO / "data" / "a9a" / "a9a_123d_train.dummy"
CENSUS_DUMMY = REPO / "data" / "census" / "census_148d_train.dummy"
DNA = REPO / "data" / "dna" / "dna.scale"
ABALONE = REPO / "data" / "abalone" / "abalone_8d_train.libsvm"
ABALONE_DENSE = REPO / "data" / "abalone" / "abalone_8d_train.dense"


def conf(**kv: Any) -> Any:
    return load_config(None, {k.replace("_", "."): v for k, v in kv.items()}, D.KEYS)


def C(**kv: Any) -> Any:
    """A config from dotted keys given as a dict-friendly mapping."""
    return load_config(None, kv, D.KEYS)


def write(tmp_path: Path, text: str, name: str = "f.txt") -> str:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(p)


def read_all(path: str, cfg: Any, **kw: Any) -> D.Batch:
    return D.concat(list(D.read_file(path, cfg, **kw)))


def rows(b: D.Batch) -> list[tuple[float, list[int], list[float]]]:
    return [
        (
            float(b.labels[r]),
            b.ids[b.indptr[r] : b.indptr[r + 1]].tolist(),
            b.values[b.indptr[r] : b.indptr[r + 1]].tolist(),
        )
        for r in range(len(b))
    ]


# --- good lines --------------------------------------------------------------------------------


def test_libsvm_good_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "-1 3:1 11:0.5\n\n+1  1:2.5e-1\t7:-3 \r\n0\n1 2:.5\n")
    b = read_all(p, C(**{"ml.data.type": "libsvm"}))
    assert rows(b) == [
        (-1.0, [2, 10], [1.0, 0.5]),
        (1.0, [0, 6], [0.25, -3.0]),
        (0.0, [], []),
        (1.0, [1], [0.5]),
    ]
    assert b.row_index.tolist() == [0, 2, 3, 4]  # the blank line keeps its line position
    assert b.indptr.dtype == np.int64 and b.ids.dtype == np.int64
    assert b.labels.dtype == np.float32 and b.values.dtype == np.float32


def test_dummy_and_dense_good_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "1 0 5 9\n-1 3\n")
    assert rows(read_all(p, C(**{"ml.data.type": "dummy"}))) == [
        (1.0, [0, 5, 9], [1.0, 1.0, 1.0]),
        (-1.0, [3], [1.0]),
    ]
    p = write(tmp_path, "15 -1 0.5 0\n7 1 2 3e2\n", "d.txt")
    assert rows(read_all(p, C(**{"ml.data.type": "dense"}))) == [
        (15.0, [0, 1, 2], [-1.0, 0.5, 0.0]),
        (7.0, [0, 1, 2], [1.0, 2.0, 300.0]),
    ]


def test_no_label_and_custom_splitor(tmp_path: Path) -> None:
    p = write(tmp_path, "1:1 4:2\n3:0.5\n")
    b = read_all(p, C(**{"ml.data.has.label": False}))
    assert np.isnan(b.labels).all()
    assert b.ids.tolist() == [0, 3, 2]
    p = write(tmp_path, "1,0,4, 7\n0,2\n", "c.txt")
    b = read_all(p, C(**{"ml.data.type": "dummy", "ml.data.splitor": ","}))
    assert rows(b) == [(1.0, [0, 4, 7], [1.0, 1.0, 1.0]), (0.0, [2], [1.0])]
    # A separator of several characters goes through the regular-expression split.
    p = write(tmp_path, "1;;1:0.5 ;; 4:2\n\n0\n-1;;3:1;;\n", "r.txt")
    cfg = C(**{"ml.data.splitor": ";;"})
    assert D._TextFormat.from_conf(cfg).sep_bytes is None
    b = read_all(p, cfg)
    assert rows(b) == [(1.0, [0, 3], [0.5, 2.0]), (0.0, [], []), (-1.0, [2], [1.0])]
    assert b.row_index.tolist() == [0, 2, 3]
    p = write(tmp_path, "1;;1:0.5\n1;;;;3:1\n", "r2.txt")
    with pytest.raises(
        D.DataError,
        match=r"r2\.txt:2: expected '<label> <id>:<value> \.\.\.' \(libsvm, separator ';;'\), "
        r"got '1;;;;3:1'",
    ):
        read_all(p, cfg)


def test_last_line_without_newline_and_tiny_blocks(tmp_path: Path) -> None:
    text = "".join(f"{i % 2} {i + 1}:{i}.5 {i + 3}:1\n" for i in range(50)) + "1 9:9"
    p = write(tmp_path, text)
    cfg = C()
    whole = read_all(p, cfg)
    assert len(whole) == 51 and whole.ids[-1] == 8
    # Blocks of a few bytes split lines anywhere; the carried remainder must rejoin them.
    for block in (1, 7, 64):
        reader = D._Reader(p, cfg, 0, 1, 5, D.ReadStats(), block_bytes=block)
        got = D.concat([b for b in reader if len(b)])
        assert rows(got) == rows(whole)
        assert got.row_index.tolist() == whole.row_index.tolist()


def test_compressed_input_and_byte_order_mark(tmp_path: Path) -> None:
    import gzip

    text = "".join(f"{i % 2} {i + 1}:{i}.25\n" for i in range(100))
    gz = tmp_path / "f.libsvm.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    plain = read_all(write(tmp_path, text), C())
    packed = read_all(str(gz), C(), chunk_rows=30)
    assert rows(packed) == rows(plain) and len(plain) == 100
    bom = read_all(write(tmp_path, "\ufeff1 2:1\n0 3:1\n", "bom.txt"), C())
    assert rows(bom) == [(1.0, [1], [1.0]), (0.0, [2], [1.0])]


def test_real_files_agree_across_formats() -> None:
    lib = D.load_file(str(A9A), C())
    dum = D.load_file(str(A9A_DUMMY), C(**{"ml.data.type": "dummy"}))
    assert len(lib) == 32561 and lib.nnz == 451592
    assert np.array_equal(lib.ids, dum.ids) and np.array_equal(lib.indptr, dum.indptr)
    assert np.array_equal(lib.labels, dum.labels)
    assert (lib.ids.min(), lib.ids.max()) == (0, 122)
    dense = D.load_file(str(ABALONE_DENSE), C(**{"ml.data.type": "dense"}))
    sparse = D.load_file(str(ABALONE), C())
    assert np.array_equal(dense.to_dense(8), sparse.to_dense(8))
    assert np.array_equal(dense.labels, sparse.labels)


# --- bad lines ---------------------------------------------------------------------------------

BAD_CASES = [
    # (format, extra conf, file text, message after "<path>:")
    ("libsvm", {}, "1 1:1\n1 3:x\n", "2: expected '<label> <id>:<value> ...' (libsvm), got '1 3:x'"),
    ("libsvm", {}, "1 3\n", "1: expected '<label> <id>:<value> ...' (libsvm), got '1 3'"),
    ("libsvm", {}, "abc 3:1\n", "1: expected '<label> <id>:<value> ...' (libsvm), got 'abc 3:1'"),
    ("libsvm", {}, "1 -3:1\n", "1: expected '<label> <id>:<value> ...' (libsvm), got '1 -3:1'"),
    ("libsvm", {}, "nan 3:1\n", "1: expected '<label> <id>:<value> ...' (libsvm), got 'nan 3:1'"),
    ("libsvm", {}, "1 0:1\n", "1: feature id 0: libsvm ids start at 1 (ml.data.type=dummy reads 0-based ids)"),
    ("libsvm", {}, "1e999 3:1\n", "1: the label is not a finite number, got '1e999 3:1'"),
    ("libsvm", {}, "1 3:1e39\n", "1: a feature value is not a finite float32 number"),
    ("libsvm", {}, "1 99999999999999999999:1\n", "1: a feature id is too large for a 64-bit integer"),
    (
        "libsvm",
        {"ml.feature.index.range": 10},
        "1 10:1\n1 11:1\n",
        "2: feature id 11 is outside ml.feature.index.range=10 (valid ids in a libsvm file: 1..10)",
    ),
    (
        "dummy",
        {"ml.feature.index.range": 10},
        "1 10\n",
        "1: feature id 10 is outside ml.feature.index.range=10 (valid ids in a dummy file: 0..9)",
    ),
    ("libsvm", {"ml.fm.field.num": 2}, "1 1:1 2:1\n1 1:1\n", "2: expected exactly ml.fm.field.num=2 features, got 1"),
    ("dummy", {}, "1 2 3:1\n", "1: expected '<label> <id> ...' (dummy), got '1 2 3:1'"),
    ("dummy", {}, "1 2.5\n", "1: expected '<label> <id> ...' (dummy), got '1 2.5'"),
    ("dense", {}, "1 2 x\n", "1: expected '<label> <value> ...' (dense), got '1 2 x'"),
    ("dense", {}, "1 2 3\n1 2\n", "2: expected 2 values (as the first row), got 1"),
    ("dense", {"ml.feature.index.range": 3}, "1 2 3\n", "1: expected 3 values (as ml.feature.index.range), got 2"),
    ("libsvm", {"ml.data.has.label": False}, "1 3:1\n", "1: expected '<id>:<value> ...' (libsvm), got '1 3:1'"),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "extra", "text", "message"), BAD_CASES)
def test_bad_lines_raise_with_file_and_line(
    tmp_path: Path, fmt: str, extra: dict[str, Any], text: str, message: str
) -> None:
    p = write(tmp_path, text)
    cfg = C(**{"ml.data.type": fmt, **extra})
    with pytest.raises(D.DataError) as e:
        read_all(p, cfg)
    assert (
        str(e.value) == f"{p}:{message} (set ml.data.skip.bad.lines=true to skip malformed lines)"
    )


@pytest.mark.parametrize(("fmt", "extra", "text", "message"), BAD_CASES)
def test_bad_lines_skipped_and_counted(
    tmp_path: Path, fmt: str, extra: dict[str, Any], text: str, message: str
) -> None:
    p = write(tmp_path, text)
    stats = D.ReadStats()
    b = read_all(
        p, C(**{"ml.data.type": fmt, "ml.data.skip.bad.lines": True, **extra}), stats=stats
    )
    n_lines = text.count("\n")
    assert stats.bad_lines >= 1 and stats.lines == n_lines
    assert stats.rows == len(b) == n_lines - stats.bad_lines
    assert stats.bad_examples[0] == f"{p}:{message}"
    assert "malformed skipped" in stats.summary()


def test_long_bad_line_is_truncated_and_invalid_utf8(tmp_path: Path) -> None:
    p = write(tmp_path, "1 " + "3:1 " * 40 + "oops\n")
    with pytest.raises(D.DataError, match=r"f\.txt:1: expected .*got '1 3:1 3:1 .*\.\.\.'"):
        read_all(p, C())
    p = write(tmp_path, b"1 3:1\n1 \xff\xfe:1\n", "u.txt")
    with pytest.raises(D.DataError, match=r"u\.txt:2: expected '<label> <id>:<value> \.\.\.'"):
        read_all(p, C())


def test_skip_counts_many_bad_lines_in_order(tmp_path: Path) -> None:
    lines = [f"1 {i + 1}:1" if i % 3 else "bad" for i in range(30)]
    p = write(tmp_path, "\n".join(lines) + "\n")
    stats = D.ReadStats()
    b = read_all(p, C(**{"ml.data.skip.bad.lines": True}), chunk_rows=4, stats=stats)
    assert stats.bad_lines == 10 and len(b) == 20
    assert [e.split(":")[1] for e in stats.bad_examples] == ["1", "4", "7", "10", "13"]
    assert b.row_index.tolist() == [i for i in range(30) if i % 3]


def test_first_bad_line_is_reported_whatever_the_check(tmp_path: Path) -> None:
    # Line 2 fails a check after parsing, line 3 the line pattern: line 2 comes first.
    p = write(tmp_path, "1 1:1\n1 0:1\n1 x\n1 2:1e39\n")
    with pytest.raises(D.DataError, match=r"f\.txt:2: feature id 0: libsvm ids start at 1"):
        read_all(p, C())
    stats = D.ReadStats()
    b = read_all(p, C(**{"ml.data.skip.bad.lines": True}), stats=stats)
    assert [e.split(": ", 1)[0].rsplit(":", 1)[1] for e in stats.bad_examples] == ["2", "3", "4"]
    assert b.row_index.tolist() == [0]


def test_missing_input() -> None:
    with pytest.raises(D.DataError, match="no such input file or directory"):
        list(D.read_file("does/not/exist.libsvm", C()))


# --- chunks, workers, directories --------------------------------------------------------------


def reference_parse(text: str, fmt: str) -> list[tuple[int, float, list[int], list[float]]]:
    """A line-by-line Python parser, the oracle of the vectorized one."""
    out = []
    for i, line in enumerate(text.split("\n")):
        tok = line.split()
        if not tok:
            continue
        y = float(tok[0])
        if fmt == "libsvm":
            pairs = [t.split(":") for t in tok[1:]]
            ids, vals = [int(a) - 1 for a, _ in pairs], [float(v) for _, v in pairs]
        elif fmt == "dummy":
            ids, vals = [int(t) for t in tok[1:]], [1.0] * (len(tok) - 1)
        else:
            ids, vals = list(range(len(tok) - 1)), [float(t) for t in tok[1:]]
        out.append((i, y, ids, [float(np.float32(v)) for v in vals]))
    return out


def random_text(rng: np.random.Generator, fmt: str, n: int) -> str:
    lines = []
    for _ in range(n):
        if rng.random() < 0.05:
            lines.append("  ")
            continue
        y = str(rng.choice(["1", "-1", "0", "2.5", "+1"]))
        k = 4 if fmt == "dense" else int(rng.integers(0, 6))
        ids = rng.integers(1, 1000, k)
        vals = [f"{v:.4g}" for v in rng.normal(size=k)]
        seps = rng.choice([" ", "  ", "\t"], k + 1)
        if fmt == "libsvm":
            feats = [f"{i}:{v}" for i, v in zip(ids, vals, strict=True)]
        elif fmt == "dummy":
            feats = [str(i) for i in ids]
        else:
            feats = vals
        lines.append(y + "".join(s + f for s, f in zip(seps, feats, strict=False)))
    return "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")


@pytest.mark.parametrize("fmt", ["libsvm", "dummy", "dense"])
def test_vectorized_parse_matches_reference_in_any_chunking(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(7)
    text = random_text(rng, fmt, 300)
    p = write(tmp_path, text)
    cfg = C(**{"ml.data.type": fmt})
    want = reference_parse(text, fmt)
    for chunk in (1, 13, 100000):
        b = read_all(p, cfg, chunk_rows=chunk)
        got = [(int(ri), *r) for ri, r in zip(b.row_index, rows(b), strict=True)]
        assert got == want


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
    with pytest.raises(D.DataError, match=r"b\.libsvm:2: expected"):
        read_all(str(d), C())
    b = read_all(str(d), C(**{"ml.data.skip.bad.lines": True}))
    assert b.row_index.tolist() == [0, 2, 3]
    assert b.ids.tolist() == [0, 1, 2]


# --- labels --------------------------------------------------------------------------------------


def test_label_transforms_as_angel(tmp_path: Path) -> None:
    y = np.array([-1.0, 0.0, 0.5, 1.0, 3.0], np.float32)
    assert D.label_transform(y, "NoTrans").tolist() == y.tolist()
    assert D.label_transform(y, "PosNegTrans").tolist() == [-1, -1, 1, 1, 1]
    assert D.label_transform(y, "posnegtrans", 0.5).tolist() == [-1, -1, -1, 1, 1]
    assert D.label_transform(y, "ZeroOneTrans").tolist() == [0, 0, 1, 1, 1]
    assert D.label_transform(y, "ZeroOneTrans", 1.0).tolist() == [0, 0, 0, 0, 1]
    assert D.label_transform(y, "AddOneTrans").tolist() == [0, 1, 1.5, 2, 4]
    assert D.label_transform(y, "SubOneTrans").tolist() == [-2, -1, -0.5, 0, 2]
    with pytest.raises(ValueError, match="expected one of NoTrans, PosNegTrans"):
        D.label_transform(y, "Flip")
    # Applied while reading.
    p = write(tmp_path, "0 1:1\n1 1:1\n")
    b = read_all(
        p, C(**{"ml.data.label.trans.class": "PosNegTrans", "ml.data.label.trans.threshold": 0.5})
    )
    assert b.labels.tolist() == [-1.0, 1.0]
    dna = D.load_file(str(DNA), C(**{"ml.data.label.trans.class": "SubOneTrans"}))
    assert D.multiclass_labels(dna.labels, 3).tolist()[:3] == [2, 2, 2]


def test_binary_labels01_accepts_both_conventions() -> None:
    assert D.binary_labels01(np.array([-1, 1, -1])).tolist() == [0, 1, 0]
    assert D.binary_labels01(np.array([0, 1, 1])).tolist() == [0, 1, 1]
    assert D.binary_labels01(np.array([1, 1])).tolist() == [1, 1]
    assert D.binary_labels01(np.array([1, 1])).dtype == np.float32
    with pytest.raises(ValueError, match=r"binary labels must be -1/\+1 or 0/1; found -1, 0, 1 \("):
        D.binary_labels01(np.array([-1, 0, 1]))
    with pytest.raises(ValueError, match="found 0, 1, 2"):
        D.binary_labels01(np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="found 1, nan"):
        D.binary_labels01(np.array([np.nan, 1]))


def test_multiclass_labels_checks_range() -> None:
    with pytest.raises(
        ValueError,
        match=r"0\.\.2 \(ml.num.class=3\); found 3 \(1-based class labels: set ml.data.label.trans.class=SubOneTrans\)",
    ):
        D.multiclass_labels(np.array([1.0, 2.0, 3.0]), 3)
    with pytest.raises(ValueError, match=r"found 0\.5"):
        D.multiclass_labels(np.array([0.5, 1.0]), 3)


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


# --- keys ----------------------------------------------------------------------------------------


def test_keys_check_values() -> None:
    with pytest.raises(
        ConfigError, match=r"ml.data.validate.ratio=1.5 is not valid: expected a number in \[0, 1\)"
    ):
        C(**{"ml.data.validate.ratio": "1.5"})
    with pytest.raises(ConfigError, match=r"ml.data.splitor=s\+ is not valid: .*write \\\\s\+"):
        C(**{"ml.data.splitor": "s+"})
    with pytest.raises(
        ConfigError,
        match=r"ml\.data\.type=csv is not valid: expected one of libsvm, dummy, dense, parquet",
    ):
        C(**{"ml.data.type": "csv"})
    with pytest.raises(ConfigError, match=r"ml\.feature\.index\.range=0 is not valid"):
        C(**{"ml.feature.index.range": "0"})
    assert (
        C(**{"ml.data.label.trans.class": "posnegtrans"})["ml.data.label.trans.class"]
        == "PosNegTrans"
    )


def test_parse_speed_a9a() -> None:
    cfg = C()
    D.load_file(str(A9A), cfg)  # warm up: lazy imports, regular expression compilation
    t = time.perf_counter()
    b = D.load_file(str(A9A), cfg)
    dt = time.perf_counter() - t
    print(
        f"\na9a libsvm: {len(b)} rows, {b.nnz} features parsed in {dt * 1000:.0f} ms "
        f"({len(b) / dt / 1e3:.0f}k rows/s)"
    )
    assert len(b) == 32561
