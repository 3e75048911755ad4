"""The text formats (libsvm, dummy, dense): good lines, bad lines, blocks, compression, speed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from learners import data as D
from learners.data.reader import Reader
from learners.data.text import TextFormat
from tests.learners.data_helpers import (
    A9A,
    A9A_DUMMY,
    ABALONE,
    ABALONE_DENSE,
    C,
    read_all,
    rows,
    write,
)

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
    assert TextFormat.from_options(cfg).sep_bytes is None
    b = read_all(p, cfg)
    assert rows(b) == [(1.0, [0, 3], [0.5, 2.0]), (0.0, [], []), (-1.0, [2], [1.0])]
    assert b.row_index.tolist() == [0, 2, 3]
    p = write(tmp_path, "1;;1:0.5\n1;;;;3:1\n", "r2.txt")
    with pytest.raises(
        D.DataError,
        match=r"r2\.txt:2: an empty field \(two separators in a row\); expected '<label> <id>:<value> \.\.\.' \(libsvm, separator ';;'\), "
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
        reader = Reader(p, cfg, 0, 1, 5, D.ReadStats(), block_bytes=block)
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
    ("libsvm", {}, "1 1:1\n1 3:x\n", "2: the value of feature 3 is 'x', not a number; expected '<label> <id>:<value> ...' (libsvm), got '1 3:x'"),
    ("libsvm", {}, "1 3\n", "1: feature '3' has no ':<value>'; expected '<label> <id>:<value> ...' (libsvm), got '1 3'; the line is dummy: set ml.data.type=dummy?"),
    ("libsvm", {}, "abc 3:1\n", "1: the label is 'abc', not a number (a sample id first? set ml.data.sid=true); expected '<label> <id>:<value> ...' (libsvm), got 'abc 3:1'"),
    ("libsvm", {}, "1 -3:1\n", "1: feature id -3 is negative (libsvm ids start at 1); expected '<label> <id>:<value> ...' (libsvm), got '1 -3:1'"),
    ("libsvm", {}, "nan 3:1\n", "1: the label is 'nan', not a finite number; expected '<label> <id>:<value> ...' (libsvm), got 'nan 3:1'"),
    ("libsvm", {}, "1 0:1\n", "1: feature id 0: libsvm ids start at 1 (ml.data.type=dummy reads 0-based ids)"),
    ("libsvm", {}, "1e999 3:1\n", "1: the label is not a finite number, got '1e999 3:1'"),
    ("libsvm", {}, "1 3:1e39\n", "1: a feature value is not a finite float32 number"),
    ("libsvm", {}, "1 99999999999999999999:1\n", "1: a feature id has more than 18 digits (ids must fit a 64-bit integer)"),
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
    ("dummy", {}, "1 2 3:1\n", "1: feature '3:1' is not an id (dummy lines hold ids without values); expected '<label> <id> ...' (dummy), got '1 2 3:1'"),
    ("dummy", {}, "1 2.5\n", "1: feature id '2.5' is not a valid dummy id (a non-negative integer); expected '<label> <id> ...' (dummy), got '1 2.5'; the line is dense: set ml.data.type=dense?"),
    ("dense", {}, "1 2 x\n", "1: a value is 'x', not a number; expected '<label> <value> ...' (dense), got '1 2 x'"),
    ("dense", {}, "1 2 3\n1 2\n", "2: expected 2 values (as the first row), got 1"),
    ("dense", {"ml.feature.index.range": 3}, "1 2 3\n", "1: expected 3 values (as ml.feature.index.range), got 2"),
    ("libsvm", {"ml.data.has.label": False}, "1 3:1\n", "1: feature '1' has no ':<value>'; expected '<id>:<value> ...' (libsvm), got '1 3:1'"),
    ("libsvm", {}, "1 3: 5:1\n", "1: feature '3:' has no value; expected '<label> <id>:<value> ...' (libsvm), got '1 3: 5:1'"),
    ("libsvm", {}, "1 3:inf\n", "1: the value of feature 3 is 'inf', not a finite number; expected '<label> <id>:<value> ...' (libsvm), got '1 3:inf'"),
    ("libsvm", {}, "1 3:1 5:1 3:2\n", "1: feature id 3 appears more than once (a line holds each id at most once)"),
    ("dummy", {}, "1 7 2 7\n", "1: feature id 7 appears more than once (a line holds each id at most once)"),
    ("dummy", {}, "1 -2\n", "1: feature id '-2' is not a valid dummy id (a non-negative integer); expected '<label> <id> ...' (dummy), got '1 -2'; the line is dense: set ml.data.type=dense?"),
    ("dense", {}, "1 2 -inf\n", "1: a value is '-inf', not a finite number; expected '<label> <value> ...' (dense), got '1 2 -inf'"),
    (
        "libsvm",
        {},
        "1 3:1 \x1b[2J\r\x00\n",
        "1: the line holds control characters or non-ASCII bytes (binary data?); expected "
        "'<label> <id>:<value> ...' (libsvm), got '1 3:1 \\x1b[2J\\r\\x00'",
    ),
    (
        "libsvm",
        {},
        b"1 \xff\xfe:1\n",
        "1: the line holds control characters or non-ASCII bytes (binary data?); expected "
        "'<label> <id>:<value> ...' (libsvm), got '1 \\xff\\xfe:1'",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "extra", "text", "message"), BAD_CASES)
def test_bad_lines_raise_with_file_and_line(
    tmp_path: Path, fmt: str, extra: dict[str, Any], text: str, message: str
) -> None:
    p = write(tmp_path, text)
    cfg = C(**{"ml.data.type": fmt, **extra})
    with pytest.raises(D.DataError) as e:
        read_all(p, cfg)
    # a line in another format names it; skipping lines is suggested otherwise
    tail = (
        ""
        if "set ml.data.type=" in message
        else " (set ml.data.skip.bad.lines=true to skip malformed lines)"
    )
    assert str(e.value) == f"{p}:{message}{tail}"


@pytest.mark.parametrize(("fmt", "extra", "text", "message"), BAD_CASES)
def test_bad_lines_skipped_and_counted(
    tmp_path: Path, fmt: str, extra: dict[str, Any], text: str, message: str
) -> None:
    p = write(tmp_path, text)
    stats = D.ReadStats()
    b = read_all(
        p, C(**{"ml.data.type": fmt, "ml.data.skip.bad.lines": True, **extra}), stats=stats
    )
    n_lines = text.count("\n" if isinstance(text, str) else b"\n")
    assert stats.bad_lines >= 1 and stats.lines == n_lines
    assert stats.rows == len(b) == n_lines - stats.bad_lines
    assert stats.bad_examples[0] == f"{p}:{message}"
    assert "malformed skipped" in stats.summary()


def test_long_bad_line_is_truncated_and_invalid_utf8(tmp_path: Path) -> None:
    p = write(tmp_path, "1 " + "3:1 " * 40 + "oops\n")
    with pytest.raises(
        D.DataError,
        match=r"f\.txt:1: feature 'oops' has no ':<value>'; expected .*got '1 3:1 3:1 .*\.\.\.'",
    ):
        read_all(p, C())
    p = write(tmp_path, b"1 3:1\n1 \xff\xfe:1\n", "u.txt")
    with pytest.raises(
        D.DataError, match=r"u\.txt:2: the line holds control .*got '1 \\xff\\xfe:1'"
    ):
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


# --- the vectorized parser against a line-by-line one ---------------------------------------


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


# --- speed ---------------------------------------------------------------------------------------


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
