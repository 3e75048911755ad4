"""Training data: libsvm, dummy, dense and Parquet readers that hand out CSR mini-batches.

Formats (``ml.data.type``), as Angel's ``DataParser`` (Angel-ML/angel:
angel-ps/mllib/.../core/utils/DataParser.scala):

============  ======================  ============================================  =========
type          line                    feature ids in :class:`Batch`                 value
============  ======================  ============================================  =========
``libsvm``    ``y i:v i:v ...``       ``i - 1`` (the file's ids are 1-based)        ``v``
``dummy``     ``y i i ...``           ``i`` (0-based in the file)                   1.0
``dense``     ``y v1 v2 ... vd``      ``0 .. d-1``                                  ``vj``
``parquet``   label, ids, values      the ids column as is (0-based)                values
============  ======================  ============================================  =========

Text files are read in blocks of bytes and parsed with vectorized numpy and pyarrow kernels: one
regular expression per line tells the good lines from the bad ones (so a bad line is found with
its number without a Python loop), byte comparisons cut the good lines into tokens packed into
one Arrow string array, and three casts give labels, ids and values. Blank lines are skipped
silently; they still count as lines for the line numbers. A separator of several characters
(``ml.data.splitor`` is a regular expression, as in Angel) goes through a regex split instead.

Worker parts and the validation split. Lines are grouped in blocks of ``P`` consecutive lines,
``P = ceil(1 / ml.data.validate.ratio)`` (``P = 1`` when the ratio is 0). Worker ``w`` of ``W``
reads the lines of the blocks ``b`` with ``b % W == w``. When the validation split applies, the
first line of every block (``line_index % P == 0``) goes to validation: Angel's rule (a sample
goes to validation iff ``count % ceil(1/ratio) == 0``) applied to the line index of the whole
input instead of a per-task counter, so the validation set is the same whatever the number of
workers, and every worker holds its share of it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from angelps.config import Key

__all__ = [
    "KEYS",
    "LABEL_TRANSFORMS",
    "Batch",
    "DataError",
    "ReadStats",
    "binary_labels01",
    "concat",
    "input_files",
    "iter_minibatches",
    "iter_stream_minibatches",
    "iter_train_chunks",
    "label_transform",
    "load_file",
    "load_train_valid",
    "multiclass_labels",
    "read_file",
    "split_period",
    "to_parquet",
]

FORMATS = ("libsvm", "dummy", "dense", "parquet")
LABEL_TRANSFORMS = ("NoTrans", "PosNegTrans", "ZeroOneTrans", "AddOneTrans", "SubOneTrans")
_WHITESPACE_SPLITORS = {r"\s+", r"\s", " ", "\t", r"\t", r"[ \t]+", r"[\s]+"}


def _check_ratio(v: float) -> str | None:
    return None if 0.0 <= v < 1.0 else "a number in [0, 1)"


def _check_range(v: int) -> str | None:
    return None if v == -1 or v >= 1 else "-1 (unbounded) or an integer >= 1"


def _check_splitor(v: str) -> str | None:
    if v == "":
        return r"a non-empty regular expression such as \\s+ or ,"
    if v in ("s+", "s"):
        # java.util.Properties reads "\s" as "s": the user meant whitespace.
        return r"a regular expression; a .properties file reads \s as s, so write \\s+"
    try:
        re.compile(v)
    except re.error as e:
        return f"a valid regular expression ({e})"
    return None


def _check_chunk(v: int) -> str | None:
    return None if v >= 1 else "an integer >= 1"


KEYS = [
    Key(
        "ml.data.type",
        "str",
        "libsvm",
        "Input format: libsvm (1-based ids), dummy (0-based ids, value 1), dense, or parquet.",
        choices=FORMATS,
    ),
    Key(
        "ml.data.splitor",
        "str",
        r"\s+",
        r"Separator between the fields of a text line, a regular expression (Angel's default \s+; in a .properties file write \\s+).",
        check=_check_splitor,
    ),
    Key(
        "ml.data.has.label",
        "bool",
        True,
        "Whether the first field of each line is the label (false: labels are NaN, for prediction).",
    ),
    Key(
        "ml.data.validate.ratio",
        "float",
        0.05,
        "Share of the training input held out for validation: line i goes to validation iff i % ceil(1/ratio) == 0 (0: no validation split).",
        check=_check_ratio,
    ),
    Key(
        "ml.feature.index.range",
        "int",
        -1,
        "Number of feature ids (0-based ids must be < this; libsvm file ids 1..range; dense rows must have this many values); -1: unbounded.",
        check=_check_range,
    ),
    Key(
        "ml.fm.field.num",
        "int",
        -1,
        "Number of fields: every row must have exactly this many features (FM-style models); -1: not checked.",
        check=_check_range,
    ),
    Key(
        "ml.data.label.trans.class",
        "str",
        "NoTrans",
        "Label transform applied while reading: NoTrans; PosNegTrans (y > threshold -> 1 else -1); ZeroOneTrans (y > threshold -> 1 else 0); AddOneTrans (y + 1); SubOneTrans (y - 1).",
        choices=LABEL_TRANSFORMS,
    ),
    Key(
        "ml.data.label.trans.threshold", "float", 0.0, "Threshold of PosNegTrans and ZeroOneTrans."
    ),
    Key(
        "ml.data.skip.bad.lines",
        "bool",
        False,
        "Skip malformed lines and count them (false: the first malformed line stops the job with its file and line number).",
    ),
    Key(
        "ml.data.use.shuffle",
        "bool",
        False,
        "Shuffle the training rows, with a new order every epoch derived from the seed and the epoch.",
    ),
    Key(
        "angel.train.data.path",
        "str",
        None,
        "Training input: a file, or a directory whose files are read in name order.",
    ),
    Key(
        "angel.validate.data.path",
        "str",
        None,
        "Validation input; when set, ml.data.validate.ratio is not used and all of the training input trains.",
    ),
    Key("angel.predict.data.path", "str", None, "Input of prediction (a file or a directory)."),
    Key(
        "ml.data.parquet.label.col",
        "str",
        "label",
        "Parquet input: name of the label column (numeric).",
    ),
    Key(
        "ml.data.parquet.ids.col",
        "str",
        "ids",
        "Parquet input: name of the list<int> column of 0-based feature ids.",
    ),
    Key(
        "ml.data.parquet.values.col",
        "str",
        "values",
        "Parquet input: name of the list<float> column of feature values (a missing column means every value is 1).",
    ),
    Key(
        "ml.data.chunk.rows",
        "int",
        65536,
        "Rows a worker parses at a time when streaming its part of the input.",
        check=_check_chunk,
    ),
]


class DataError(ValueError):
    """Malformed input: names the file, the line (or Parquet row), what was expected and what was found."""


# --- the CSR batch -----------------------------------------------------------------------------


@dataclass(eq=False)  # numpy fields: compare with np.array_equal, not ==
class Batch:
    """A mini-batch in CSR form (numpy only).

    Row ``r`` has the features ``ids[indptr[r]:indptr[r+1]]`` with ``values`` alongside, in file
    order. ``labels`` are after the label transform (NaN when the input has no labels).
    ``row_index`` is each row's 0-based line position in its input (over all files of a
    directory, in name order): the order predictions are written in, and the data position.
    """

    labels: np.ndarray  # float32 [n]
    indptr: np.ndarray  # int64 [n+1]
    ids: np.ndarray  # int64 [nnz]
    values: np.ndarray  # float32 [nnz]
    row_index: np.ndarray  # int64 [n]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def nnz(self) -> int:
        """Number of stored features."""
        return int(self.ids.shape[0])

    @classmethod
    def empty(cls) -> Batch:
        """A batch with no rows."""
        return cls(
            labels=np.zeros(0, np.float32),
            indptr=np.zeros(1, np.int64),
            ids=np.zeros(0, np.int64),
            values=np.zeros(0, np.float32),
            row_index=np.zeros(0, np.int64),
        )

    def row_lengths(self) -> np.ndarray:
        """Number of features of each row, int64 [n]."""
        return np.diff(self.indptr)

    def take(self, rows: np.ndarray) -> Batch:
        """The rows ``rows`` (indices or a boolean mask), in that order, CSR rebuilt."""
        rows = np.asarray(rows)
        if rows.dtype == np.bool_:
            if rows.shape != (len(self),):
                raise ValueError(
                    f"Batch.take: boolean mask of shape {rows.shape}, expected ({len(self)},)"
                )
            rows = np.flatnonzero(rows)
        rows = rows.astype(np.int64, copy=False)
        starts = self.indptr[rows]
        counts = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        # Source position of every kept feature: its row's start plus its offset in the row.
        gather = np.arange(indptr[-1], dtype=np.int64) + np.repeat(starts - indptr[:-1], counts)
        return Batch(
            labels=self.labels[rows],
            indptr=indptr,
            ids=self.ids[gather],
            values=self.values[gather],
            row_index=self.row_index[rows],
        )

    def slice(self, start: int, stop: int) -> Batch:
        """Rows ``start .. stop-1`` as views (no copy; what ``take`` of a range returns)."""
        a, b = int(self.indptr[start]), int(self.indptr[stop])
        return Batch(
            labels=self.labels[start:stop],
            indptr=self.indptr[start : stop + 1] - a,
            ids=self.ids[a:b],
            values=self.values[a:b],
            row_index=self.row_index[start:stop],
        )

    def field_ids(self, num_fields: int) -> np.ndarray:
        """Ids as an ``[n, F]`` array when every row has exactly ``F`` features (FM-style models)."""
        lengths = self.row_lengths()
        bad = np.flatnonzero(lengths != num_fields)
        if bad.size:
            r = int(bad[0])
            raise ValueError(
                f"row at line index {int(self.row_index[r])} has {int(lengths[r])} features, expected "
                f"exactly ml.fm.field.num={num_fields} (one per field); {bad.size} of {len(self)} "
                "rows differ"
            )
        return self.ids.reshape(len(self), num_fields)

    def field_values(self, num_fields: int) -> np.ndarray:
        """Values as an ``[n, F]`` array, with the same check as :meth:`field_ids`."""
        self.field_ids(num_fields)
        return self.values.reshape(len(self), num_fields)

    def to_dense(self, num_features: int) -> np.ndarray:
        """The rows as a dense float32 ``[n, num_features]`` array (duplicate ids are summed)."""
        if self.nnz and int(self.ids.max()) >= num_features:
            raise ValueError(
                f"feature id {int(self.ids.max())} does not fit a dense row of {num_features} "
                "features (set ml.feature.index.range)"
            )
        out = np.zeros((len(self), num_features), np.float32)
        rows = np.repeat(np.arange(len(self)), self.row_lengths())
        np.add.at(out, (rows, self.ids), self.values)
        return out


def concat(batches: Sequence[Batch]) -> Batch:
    """The rows of all batches, in order, as one batch."""
    batches = [b for b in batches if len(b)] or list(batches[:1])
    if not batches:
        return Batch.empty()
    if len(batches) == 1:
        return batches[0]
    nnz = np.cumsum([0] + [b.nnz for b in batches[:-1]])
    indptr = np.concatenate(
        [batches[0].indptr[:1]] + [b.indptr[1:] + o for b, o in zip(batches, nnz, strict=True)]
    )
    return Batch(
        labels=np.concatenate([b.labels for b in batches]),
        indptr=indptr.astype(np.int64, copy=False),
        ids=np.concatenate([b.ids for b in batches]),
        values=np.concatenate([b.values for b in batches]),
        row_index=np.concatenate([b.row_index for b in batches]),
    )


# --- labels ------------------------------------------------------------------------------------


def label_transform(
    labels: np.ndarray, name: str = "NoTrans", threshold: float = 0.0
) -> np.ndarray:
    """Angel's ``TransLabel`` (Angel-ML/angel: .../core/utils/TransLabel.scala), vectorized.

    NoTrans: y. PosNegTrans: 1 if y > threshold else -1. ZeroOneTrans: 1 if y > threshold else 0.
    AddOneTrans: y + 1. SubOneTrans: y - 1. Names are case-insensitive.
    """
    key = name.lower()
    y = np.asarray(labels)
    if key == "notrans":
        return y
    if key == "posnegtrans":
        return np.where(y > threshold, 1.0, -1.0).astype(y.dtype)
    if key == "zeroonetrans":
        return np.where(y > threshold, 1.0, 0.0).astype(y.dtype)
    if key == "addonetrans":
        return y + 1
    if key == "subonetrans":
        return y - 1
    raise ValueError(
        f"ml.data.label.trans.class={name} is not valid: expected one of {', '.join(LABEL_TRANSFORMS)}"
    )


def _show_values(values: np.ndarray, limit: int = 6) -> str:
    shown = ", ".join(f"{v:g}" for v in values[:limit])
    return shown + (f", ... ({values.size} distinct)" if values.size > limit else "")


def binary_labels01(labels: np.ndarray) -> np.ndarray:
    """Binary labels as float32 0/1, accepting a -1/+1 file or a 0/1 file.

    Raises ValueError when the labels are anything else (NaN, 2, a mix of -1 and 0, ...).
    """
    y = np.asarray(labels, dtype=np.float32)
    distinct = np.unique(y)  # NaNs sort last and stay distinct
    is_pm1 = bool(np.isin(distinct, (-1.0, 1.0)).all())
    is_01 = bool(np.isin(distinct, (0.0, 1.0)).all())
    if not (is_pm1 or is_01):
        raise ValueError(
            f"binary labels must be -1/+1 or 0/1; found {_show_values(distinct)} "
            "(map other labels with ml.data.label.trans.class=ZeroOneTrans or PosNegTrans and "
            "ml.data.label.trans.threshold, or set ml.data.has.label=true if the file has labels)"
        )
    return (y > 0).astype(np.float32)


def multiclass_labels(labels: np.ndarray, num_class: int) -> np.ndarray:
    """Class labels as int64 in ``0 .. num_class-1``; ValueError for anything else."""
    y = np.asarray(labels, dtype=np.float64)
    distinct = np.unique(y)
    ok = (
        np.isfinite(distinct)
        & (distinct == np.round(distinct))
        & (distinct >= 0)
        & (distinct < num_class)
    )
    if not ok.all():
        hint = ""
        if (
            distinct.size
            and np.isfinite(distinct).all()
            and distinct.min() >= 1
            and distinct.max() <= num_class
        ):
            hint = " (1-based class labels: set ml.data.label.trans.class=SubOneTrans)"
        raise ValueError(
            f"class labels must be integers in 0..{num_class - 1} (ml.num.class={num_class}); "
            f"found {_show_values(distinct[~ok])}{hint}"
        )
    return y.astype(np.int64)


# --- reading -----------------------------------------------------------------------------------


@dataclass
class ReadStats:
    """Counts of one or more reads; pass one to :func:`read_file` to collect them.

    ``lines`` counts the lines of this worker's part (blank ones included); ``rows`` the rows
    returned; ``bad_lines`` the malformed lines skipped under ``ml.data.skip.bad.lines=true``,
    with the first few messages in ``bad_examples``.
    """

    lines: int = 0
    rows: int = 0
    blank_lines: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    max_examples: int = 5

    def add_bad(self, messages: Sequence[str]) -> None:
        self.bad_lines += len(messages)
        room = self.max_examples - len(self.bad_examples)
        if room > 0:
            self.bad_examples.extend(messages[:room])

    def merge(self, other: ReadStats) -> ReadStats:
        """Sum of two stats (e.g. of two workers)."""
        out = ReadStats(
            lines=self.lines + other.lines,
            rows=self.rows + other.rows,
            blank_lines=self.blank_lines + other.blank_lines,
            bad_lines=self.bad_lines + other.bad_lines,
            max_examples=self.max_examples,
        )
        out.bad_examples = (self.bad_examples + other.bad_examples)[: self.max_examples]
        return out

    def summary(self) -> str:
        """One line for a job summary."""
        s = f"{self.rows} rows from {self.lines} lines"
        if self.blank_lines:
            s += f", {self.blank_lines} blank"
        if self.bad_lines:
            s += f", {self.bad_lines} malformed skipped (first: {self.bad_examples[0]})"
        return s


def split_period(conf: Mapping[str, Any]) -> int:
    """``P = ceil(1 / ml.data.validate.ratio)``, the block length of worker parts; 1 when the ratio is 0."""
    ratio = float(conf.get("ml.data.validate.ratio", 0.05) or 0.0)
    if not 0.0 <= ratio < 1.0:
        raise ValueError(
            f"ml.data.validate.ratio={ratio} is not valid: expected a number in [0, 1)"
        )
    # The epsilon keeps 1/0.05 = 20.000000000000004 from becoming 21.
    return max(1, math.ceil(1.0 / ratio - 1e-9)) if ratio > 0 else 1


def input_files(path: str) -> list[str]:
    """The files of an input path: the file itself, or a directory's visible files in name order.

    Text files may be compressed (``.gz``, ``.bz2``, ``.zst``, ``.lz4``: detected by suffix).
    """
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
        files = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
        if not files:
            raise DataError(f"{path}: the input directory has no data files")
        return files
    if not os.path.exists(path):
        raise DataError(f"{path}: no such input file or directory")
    return [path]


_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"


@dataclass(frozen=True)
class _TextFormat:
    """What one text format's lines look like, compiled once per read."""

    kind: str
    has_label: bool
    sep: str  # regex between fields
    sep_bytes: bytes | None  # non-whitespace separator bytes when bytes can tokenize (fast path)
    index_range: int
    field_num: int
    line_rx: str
    expected: str  # "'<label> <id>:<value> ...' (libsvm)", for error messages

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> _TextFormat:
        kind = str(conf.get("ml.data.type", "libsvm")).lower()
        splitor = str(conf.get("ml.data.splitor", r"\s+"))
        problem = _check_splitor(splitor)
        if problem:
            raise ValueError(f"ml.data.splitor={splitor} is not valid: expected {problem}")
        whitespace = splitor in _WHITESPACE_SPLITORS
        ws = r"[\t\n\f\r ]"  # RE2's \s, spelled out: measurably faster
        sep = rf"{ws}+" if whitespace else rf"{ws}*(?:{splitor}){ws}*"
        # Bytes that separate tokens besides whitespace, when bytes comparisons can tokenize.
        sep_bytes: bytes | None = b":" if kind == "libsvm" else b""
        if not whitespace:
            literal = re.sub(r"\\(.)", r"\1", splitor)
            # A one-character separator that cannot be part of a number tokenizes by bytes.
            if len(literal) == 1 and literal not in "0123456789+-.eE:" and " " < literal < "\x7f":
                sep_bytes = (sep_bytes or b"") + literal.encode()
            else:
                sep_bytes = None
        has_label = bool(conf.get("ml.data.has.label", True))
        token, shape = {
            "libsvm": (rf"\d+:{_NUM}", "<id>:<value>"),
            "dummy": (r"\d+", "<id>"),
            "dense": (_NUM, "<value>"),
        }[kind]
        if has_label:
            body = rf"{_NUM}(?:{sep}{token})*"
            expected = f"<label> {shape} ..."
        else:
            body = rf"{token}(?:{sep}{token})*"
            expected = f"{shape} ..."
        note = kind if whitespace else f"{kind}, separator {splitor!r}"
        return cls(
            kind=kind,
            has_label=has_label,
            sep=sep,
            sep_bytes=sep_bytes,
            index_range=int(conf.get("ml.feature.index.range", -1)),
            field_num=int(conf.get("ml.fm.field.num", -1)),
            # Blank lines match too; they are told apart by having no tokens.
            # Java's String.split drops a trailing empty field, so a trailing separator is fine.
            line_rx=rf"^{ws}*(?:{body}(?:{sep})?)?{ws}*$",
            expected=f"'{expected}' ({note})",
        )


def _shorten(line: str, limit: int = 80) -> str:
    line = line.rstrip("\r\n")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class _Reader:
    """One read of one input (all its files) by one worker."""

    path: str
    conf: Mapping[str, Any]
    worker_id: int
    num_workers: int
    chunk_rows: int
    stats: ReadStats
    transform: bool = True
    block_bytes: int = 8 << 20
    _dense_width: int = -1
    _file_lines: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(
                f"worker_id={self.worker_id} is not valid for num_workers={self.num_workers}"
            )
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows={self.chunk_rows} is not valid: expected an integer >= 1")
        self.kind = str(self.conf.get("ml.data.type", "libsvm")).lower()
        if self.kind not in FORMATS:
            raise ValueError(
                f"ml.data.type={self.kind} is not valid: expected one of {', '.join(FORMATS)}"
            )
        self.period = split_period(self.conf)
        self.skip_bad = bool(self.conf.get("ml.data.skip.bad.lines", False))
        self.trans_name = str(self.conf.get("ml.data.label.trans.class", "NoTrans"))
        self.trans_threshold = float(self.conf.get("ml.data.label.trans.threshold", 0.0))
        label_transform(np.zeros(1), self.trans_name, self.trans_threshold)  # validates the name
        if self.kind != "parquet":
            self.fmt = _TextFormat.from_conf(self.conf)
            if self.kind == "dense" and self.fmt.index_range > 0:
                self._dense_width = self.fmt.index_range

    # -- shared ---------------------------------------------------------------------------------

    def _mine(self, first_index: int, n: int) -> np.ndarray:
        """Positions (0..n-1) of this worker's lines among n lines starting at line index first_index."""
        idx = np.arange(first_index, first_index + n, dtype=np.int64)
        if self.num_workers == 1:
            return idx - first_index
        return np.flatnonzero((idx // self.period) % self.num_workers == self.worker_id)

    def _finish(self, batch: Batch) -> Batch:
        if self.transform and len(batch) and self.trans_name.lower() != "notrans":
            batch.labels = label_transform(batch.labels, self.trans_name, self.trans_threshold)
        self.stats.rows += len(batch)
        return batch

    def _reject(self, where: list[str], reasons: list[str]) -> None:
        """Raise for the first bad line, or count them all when skipping."""
        messages = [f"{w}: {r}" for w, r in zip(where, reasons, strict=True)]
        if not self.skip_bad:
            raise DataError(
                messages[0] + " (set ml.data.skip.bad.lines=true to skip malformed lines)"
            )
        self.stats.add_bad(messages)

    def __iter__(self) -> Iterator[Batch]:
        offset = 0  # line index of the current file's first line within the whole input
        for file in input_files(self.path):
            if self.kind == "parquet":
                yield from self._parquet(file, offset)
                offset += pq.ParquetFile(file).metadata.num_rows
            else:
                yield from self._text(file, offset)
                offset += self._file_lines

    # -- text -----------------------------------------------------------------------------------

    def _line_blocks(self, file: str) -> Iterator[tuple[pa.Array, int]]:
        """(binary array of whole lines, index of the first line within the file), block by block."""
        first = 0
        carry = b""
        # compression="detect" reads .gz, .bz2, .zst, .lz4 by the file's suffix.
        with pa.input_stream(file, compression="detect") as f:
            while True:
                buf = f.read(self.block_bytes)
                if not buf:
                    break
                if first == 0 and not carry and buf.startswith(b"\xef\xbb\xbf"):
                    buf = buf[3:]  # a UTF-8 byte order mark is not part of the first line
                data = carry + buf if carry else buf
                ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
                if ends.size == 0:
                    carry = data
                    continue
                stop = int(ends[-1]) + 1
                yield _lines_array(data, ends), first
                first += ends.size
                carry = data[stop:]
        if carry:
            yield (
                _lines_array(carry, np.array([len(carry) - 1], np.int64), last_has_newline=False),
                first,
            )

    def _text(self, file: str, offset: int) -> Iterator[Batch]:
        """Parsed chunks of this worker's lines; leaves the file's line count in ``_file_lines``."""
        seen = 0
        step = self.chunk_rows * self.num_workers
        for lines, first in self._line_blocks(file):
            for start in range(0, len(lines), step):
                part = lines.slice(start, step)
                all_pos = self._mine(offset + first + start, len(part))
                # Whole blocks of P lines go to one worker, so a slice may hold more than
                # chunk_rows of this worker's lines: parse them in pieces.
                for k in range(0, all_pos.size, self.chunk_rows):
                    pos = all_pos[k : k + self.chunk_rows]
                    mine = part.take(pa.array(pos)) if pos.size != len(part) else part
                    line_no = first + start + pos  # 0-based within the file
                    self.stats.lines += len(mine)
                    yield self._finish(self._parse(file, mine, line_no, offset))
            seen = first + len(lines)
        self._file_lines = seen

    def _parse(self, file: str, lines: pa.Array, line_no: np.ndarray, offset: int) -> Batch:
        fmt = self.fmt
        # Problems by line (0-based in the file), reported in line order once all checks ran.
        problems: dict[int, str] = {}
        good = pc.match_substring_regex(lines, fmt.line_rx).to_numpy(zero_copy_only=False)
        if not good.all():
            for r in np.flatnonzero(~good):
                got = _shorten(_decode(lines[int(r)].as_py()))
                problems[int(line_no[r])] = f"expected {fmt.expected}, got '{got}'"
            keep = np.flatnonzero(good)
            lines = lines.take(pa.array(keep))
            line_no = line_no[keep]
        if len(lines) == 0:
            self._report(file, problems)
            return Batch.empty()
        # Good lines are ASCII (the regular expression admits nothing else), so valid UTF-8.
        if fmt.sep_bytes is not None:
            flat, counts = _tokenize(lines, fmt.sep_bytes)
        else:
            text = lines.cast(pa.string())
            if fmt.kind == "libsvm":
                text = pc.replace_substring(text, ":", " ")
            text = pc.replace_substring_regex(text, fmt.sep, " ")
            tokens = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(text))
            counts = pc.list_value_length(tokens).to_numpy().astype(np.int64)
            counts[pc.equal(pc.list_element(tokens, 0), "").to_numpy(zero_copy_only=False)] = 0
            flat = pc.list_flatten(tokens)
            flat = flat.filter(pc.not_equal(flat, ""))
        blank = counts == 0
        if blank.any():
            # Blank lines have no tokens: dropping their rows leaves the tokens as they are.
            self.stats.blank_lines += int(blank.sum())
            counts = counts[~blank]
            line_no = line_no[~blank]
            if counts.size == 0:
                self._report(file, problems)
                return Batch.empty()
            lines = lines.filter(pa.array(~blank))
        n = len(lines)
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        first_feature = starts[:-1]
        if fmt.has_label:
            labels = _to_float(flat.take(pa.array(first_feature)))
            first_feature = first_feature + 1
            counts = counts - 1
        else:
            labels = np.full(n, np.nan)
        per = 2 if fmt.kind == "libsvm" else 1
        nfeat = counts // per
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(nfeat, out=indptr[1:])
        # Token position of every feature: its row's first feature token plus per * rank in row.
        rank = np.arange(indptr[-1], dtype=np.int64) - np.repeat(indptr[:-1], nfeat)
        pos = np.repeat(first_feature, nfeat) + per * rank
        if fmt.kind == "dense":
            values = _to_float(flat.take(pa.array(pos)))
            ids = rank
        else:
            id_tok = flat.take(pa.array(pos))
            too_long = pc.greater(pc.utf8_length(id_tok), 18).to_numpy(zero_copy_only=False)
            if too_long.any():
                # Ids beyond int64 would fail the cast without telling where: flag those tokens.
                id_tok = pc.if_else(pa.array(too_long), "0", id_tok)
            ids = pc.cast(id_tok, pa.int64()).to_numpy()
            if fmt.kind == "libsvm":
                values = _to_float(flat.take(pa.array(pos + 1)))
                ids = ids - 1
            else:
                values = np.ones(ids.shape[0], np.float64)
        row_of = np.repeat(np.arange(n), nfeat)
        flagged = np.zeros(n, bool)

        def flag(mask_rows: np.ndarray, reason: Any) -> None:
            for r in np.flatnonzero(mask_rows & ~flagged):
                problems[int(line_no[r])] = reason(int(r)) if callable(reason) else reason
            flagged[mask_rows] = True

        if fmt.has_label:
            flag(
                ~np.isfinite(labels),
                lambda r: (
                    f"the label is not a finite number, got '{_shorten(_decode(lines[r].as_py()))}'"
                ),
            )
        vbad = ~np.isfinite(values) | (np.abs(values) > np.finfo(np.float32).max)
        if vbad.any():
            rows_vbad = np.zeros(n, bool)
            rows_vbad[row_of[vbad]] = True
            flag(rows_vbad, "a feature value is not a finite float32 number")
            # The row is dropped (or the read stops): zeros avoid an overflow in the cast.
            values = np.where(vbad, 0.0, values)
        if fmt.kind != "dense":
            base = 1 if fmt.kind == "libsvm" else 0
            if too_long.any():
                r_long = np.zeros(n, bool)
                r_long[row_of[too_long]] = True
                flag(r_long, "a feature id is too large for a 64-bit integer")
            if fmt.kind == "libsvm":
                r_zero = np.zeros(n, bool)
                r_zero[row_of[(ids < 0) & ~too_long]] = True
                flag(
                    r_zero,
                    "feature id 0: libsvm ids start at 1 (ml.data.type=dummy reads 0-based ids)",
                )
            if fmt.index_range > 0:
                over = ids >= fmt.index_range
                if over.any():
                    first_over: dict[int, int] = {}
                    for r, i in zip(row_of[over], ids[over], strict=True):
                        first_over.setdefault(int(r), int(i))
                    r_over = np.zeros(n, bool)
                    r_over[list(first_over)] = True
                    flag(
                        r_over,
                        lambda r: (
                            f"feature id {first_over[r] + base} is outside ml.feature.index.range="
                            f"{fmt.index_range} (valid ids in a {fmt.kind} file: {base}..{fmt.index_range - 1 + base})"
                        ),
                    )
        else:
            if self._dense_width < 0:
                self._dense_width = int(nfeat[0])
            width = self._dense_width
            src = "ml.feature.index.range" if fmt.index_range > 0 else "the first row"
            flag(
                nfeat != width, lambda r: f"expected {width} values (as {src}), got {int(nfeat[r])}"
            )
        if fmt.field_num > 0:
            flag(
                nfeat != fmt.field_num,
                lambda r: (
                    f"expected exactly ml.fm.field.num={fmt.field_num} features, got {int(nfeat[r])}"
                ),
            )
        batch = Batch(
            labels=labels.astype(np.float32),
            indptr=indptr,
            ids=ids.astype(np.int64, copy=False),
            values=values.astype(np.float32),
            row_index=line_no + offset,
        )
        self._report(file, problems)
        return batch.take(~flagged) if flagged.any() else batch

    def _report(self, file: str, problems: Mapping[int, str]) -> None:
        """Raise for the first bad line of a chunk, or count them all when skipping."""
        if problems:
            lines = sorted(problems)
            self._reject([f"{file}:{i + 1}" for i in lines], [problems[i] for i in lines])

    # -- parquet --------------------------------------------------------------------------------

    def _parquet(self, file: str, offset: int) -> Iterator[Batch]:
        label_col = str(self.conf.get("ml.data.parquet.label.col", "label"))
        ids_col = str(self.conf.get("ml.data.parquet.ids.col", "ids"))
        values_col = str(self.conf.get("ml.data.parquet.values.col", "values"))
        has_label = bool(self.conf.get("ml.data.has.label", True))
        index_range = int(self.conf.get("ml.feature.index.range", -1))
        field_num = int(self.conf.get("ml.fm.field.num", -1))
        try:
            pf = pq.ParquetFile(file)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{file}: not a readable Parquet file ({e})") from None
        names = pf.schema_arrow.names
        want = [ids_col] + ([label_col] if has_label else [])
        missing = [c for c in want if c not in names]
        if missing:
            raise DataError(
                f"{file}: Parquet column(s) {', '.join(missing)} not found; the file has "
                f"{', '.join(names)} (set ml.data.parquet.label.col / ml.data.parquet.ids.col)"
            )
        columns = want + ([values_col] if values_col in names else [])
        first = 0
        for rb in pf.iter_batches(batch_size=self.chunk_rows * self.num_workers, columns=columns):
            all_pos = self._mine(offset + first, rb.num_rows)
            start = first
            first += rb.num_rows
            for k in range(0, all_pos.size, self.chunk_rows):
                pos = all_pos[k : k + self.chunk_rows]
                part = rb.take(pa.array(pos))
                self.stats.lines += part.num_rows
                yield self._finish(
                    self._parquet_batch(
                        file,
                        part,
                        start + pos,
                        offset,
                        label_col,
                        ids_col,
                        values_col,
                        has_label,
                        index_range,
                        field_num,
                    )
                )

    def _parquet_batch(
        self,
        file: str,
        rb: pa.RecordBatch,
        row_no: np.ndarray,
        offset: int,
        label_col: str,
        ids_col: str,
        values_col: str,
        has_label: bool,
        index_range: int,
        field_num: int,
    ) -> Batch:
        n = rb.num_rows
        problems: dict[int, str] = {}

        def flag(mask_rows: np.ndarray, reason: str) -> None:
            for r in np.flatnonzero(mask_rows):
                problems.setdefault(int(r), reason)

        if has_label:
            lab = rb.column(label_col)
            if not (pa.types.is_integer(lab.type) or pa.types.is_floating(lab.type)):
                raise DataError(
                    f"{file}: Parquet label column {label_col} has type {lab.type}, expected a number"
                )
            labels = lab.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
            flag(~np.isfinite(labels), f"label column {label_col} is null or not finite")
        else:
            labels = np.full(n, np.nan)
        ids_arr = rb.column(ids_col)
        if not (
            pa.types.is_list(ids_arr.type) or pa.types.is_large_list(ids_arr.type)
        ) or not pa.types.is_integer(ids_arr.type.value_type):
            raise DataError(
                f"{file}: Parquet ids column {ids_col} has type {ids_arr.type}, expected list<int64>"
            )
        flag(ids_arr.is_null().to_numpy(zero_copy_only=False), f"ids column {ids_col} is null")
        ids_arr = ids_arr.fill_null(pa.scalar([], ids_arr.type))
        counts = pc.list_value_length(ids_arr).to_numpy().astype(np.int64)
        flat_ids = pc.list_flatten(ids_arr)
        row_of = np.repeat(np.arange(n), counts)
        if flat_ids.null_count:
            r = np.zeros(n, bool)
            r[row_of[flat_ids.is_null().to_numpy(zero_copy_only=False)]] = True
            flag(r, f"ids column {ids_col} holds a null id")
            flat_ids = flat_ids.fill_null(0)
        ids = flat_ids.cast(pa.int64()).to_numpy()
        if values_col in rb.schema.names:
            va = rb.column(values_col)
            if not (pa.types.is_list(va.type) or pa.types.is_large_list(va.type)) or not (
                pa.types.is_floating(va.type.value_type) or pa.types.is_integer(va.type.value_type)
            ):
                raise DataError(
                    f"{file}: Parquet values column {values_col} has type {va.type}, expected list<float>"
                )
            vnull = va.is_null().to_numpy(zero_copy_only=False)
            vcounts = np.where(vnull, -1, pc.list_value_length(va).fill_null(0).to_numpy())
            flag(
                vcounts != counts,
                f"values column {values_col} has a different length than ids column {ids_col}",
            )
            if (vcounts != counts).any():
                # Rebuild the values row by row only where they agree; others are dropped below.
                vlist = va.fill_null(pa.scalar([], va.type))
                fixed = [
                    vlist[i].as_py() if vcounts[i] == counts[i] else [0.0] * int(counts[i])
                    for i in range(n)
                ]
                values = np.asarray([v for row in fixed for v in row], dtype=np.float64)
            else:
                values = (
                    pc.list_flatten(va)
                    .cast(pa.float64())
                    .fill_null(np.nan)
                    .to_numpy(zero_copy_only=False)
                )
            vbad = ~np.isfinite(values) | (np.abs(values) > np.finfo(np.float32).max)
            if vbad.any():
                r = np.zeros(n, bool)
                r[row_of[vbad]] = True
                flag(r, f"values column {values_col} holds a null or non-finite value")
                values = np.where(vbad, 0.0, values)
        else:
            values = np.ones(ids.shape[0])
        r = np.zeros(n, bool)
        r[row_of[ids < 0]] = True
        flag(r, "a feature id is negative (Parquet ids are 0-based)")
        if index_range > 0:
            r = np.zeros(n, bool)
            r[row_of[ids >= index_range]] = True
            flag(
                r,
                f"a feature id is outside ml.feature.index.range={index_range} (valid: 0..{index_range - 1})",
            )
        if field_num > 0:
            flag(counts != field_num, f"expected exactly ml.fm.field.num={field_num} features")
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        batch = Batch(
            labels=labels.astype(np.float32),
            indptr=indptr,
            ids=ids,
            values=values.astype(np.float32),
            row_index=row_no + offset,
        )
        if problems:
            bad_rows = sorted(problems)
            self._reject(
                [f"{file}: row {int(row_no[r])}" for r in bad_rows],
                [problems[r] for r in bad_rows],
            )
            ok = np.ones(n, bool)
            ok[bad_rows] = False
            batch = batch.take(ok)
        return batch


def _lines_array(data: bytes, ends: np.ndarray, last_has_newline: bool = True) -> pa.Array:
    """A zero-copy binary array of the lines of ``data`` ending at the newline positions ``ends``."""
    offsets = np.empty(ends.size + 1, np.int32 if len(data) < 2**31 else np.int64)
    offsets[0] = 0
    offsets[1:] = ends + 1
    typ = pa.binary() if offsets.dtype == np.int32 else pa.large_binary()
    return pa.Array.from_buffers(typ, ends.size, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _tokenize(lines: pa.Array, seps: bytes) -> tuple[pa.Array, np.ndarray]:
    """Split lines at whitespace and at the bytes ``seps``: (all tokens, tokens per line).

    Only for lines that passed the format's regular expression: then every byte <= 0x20 is
    whitespace, and vectorized byte comparisons find the separators. The other bytes are packed
    together, so the tokens lie back to back in one buffer and the token offsets are the
    cumulative token lengths: one string array for all tokens, no Python loop.
    """
    n = len(lines)
    _, offsets_buf, data_buf = lines.buffers()
    large = pa.types.is_large_binary(lines.type)
    width = 8 if large else 4
    offsets = np.frombuffer(
        offsets_buf, np.int64 if large else np.int32, count=n + 1, offset=lines.offset * width
    )
    region = np.frombuffer(data_buf, np.uint8)[offsets[0] : offsets[n]]
    starts = (offsets - offsets[0]).astype(np.int64)
    keep = region > 32
    for c in seps:
        keep &= region != c
    # Token edges: where keep changes; a token begins at an even edge and ends at the next one.
    edge = np.empty(region.size + 1, bool)
    edge[0] = keep[0]
    edge[-1] = keep[-1]
    np.not_equal(keep[1:], keep[:-1], out=edge[1:-1])
    edges = np.flatnonzero(edge)
    # A line without a trailing separator (a file's last line) must not run into the next one.
    inner = starts[1:-1]
    forced = inner[keep[inner] & keep[inner - 1]]
    if forced.size:
        edges = np.sort(np.concatenate([edges, forced, forced]))
    begin, end = edges[0::2], edges[1::2]
    packed = region[keep]
    big = packed.size >= 2**31
    tok_off = np.zeros(begin.size + 1, np.int64 if big else np.int32)
    np.cumsum(end - begin, out=tok_off[1:])
    tokens = pa.Array.from_buffers(
        pa.large_string() if big else pa.string(),
        begin.size,
        [None, pa.py_buffer(tok_off), pa.py_buffer(packed)],
    )
    return tokens, np.diff(np.searchsorted(begin, starts)).astype(np.int64)


def _decode(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="replace")


def _to_float(tokens: pa.Array) -> np.ndarray:
    return pc.cast(tokens, pa.float64()).to_numpy(zero_copy_only=False)


def read_file(
    path: str,
    conf: Mapping[str, Any],
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    chunk_rows: int = 65536,
    stats: ReadStats | None = None,
) -> Iterator[Batch]:
    """Stream this worker's part of an input (a file or a directory) as batches of at most ``chunk_rows`` rows.

    The format comes from ``ml.data.type``; labels go through ``ml.data.label.trans.class``.
    A malformed line raises :class:`DataError` naming the file and line, or is skipped and
    counted in ``stats`` with ``ml.data.skip.bad.lines=true``. Batches may be empty.
    """
    reader = _Reader(
        path, conf, worker_id, num_workers, chunk_rows, stats if stats is not None else ReadStats()
    )
    for batch in reader:
        if len(batch):
            yield batch


def load_file(
    path: str,
    conf: Mapping[str, Any],
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    stats: ReadStats | None = None,
) -> Batch:
    """This worker's part of an input, in memory (e.g. for prediction or evaluation)."""
    chunk = int(conf.get("ml.data.chunk.rows", 65536))
    return concat(
        list(
            read_file(
                path,
                conf,
                worker_id=worker_id,
                num_workers=num_workers,
                chunk_rows=chunk,
                stats=stats,
            )
        )
    )


def _validation_mask(batch: Batch, period: int) -> np.ndarray:
    return batch.row_index % period == 0


def load_train_valid(
    conf: Mapping[str, Any],
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    stats: ReadStats | None = None,
) -> tuple[Batch, Batch]:
    """This worker's training and validation rows.

    With ``angel.validate.data.path`` set, all of ``angel.train.data.path`` trains and that input
    validates. Otherwise line ``i`` of the training input validates iff
    ``i % ceil(1/ml.data.validate.ratio) == 0`` (deterministic, as Angel's per-task
    ``count % ceil(1/ratio)``, but counted over the whole input so it does not depend on the
    number of workers); a ratio of 0 gives an empty validation set.
    """
    train_path = conf.get("angel.train.data.path")
    if not train_path:
        raise ValueError("angel.train.data.path is not set: expected the path of the training data")
    stats = stats if stats is not None else ReadStats()
    valid_path = conf.get("angel.validate.data.path")
    train = load_file(
        str(train_path), conf, worker_id=worker_id, num_workers=num_workers, stats=stats
    )
    if valid_path:
        valid = load_file(
            str(valid_path), conf, worker_id=worker_id, num_workers=num_workers, stats=stats
        )
        return train, valid
    if float(conf.get("ml.data.validate.ratio", 0.05) or 0.0) == 0.0:
        return train, Batch.empty()
    mask = _validation_mask(train, split_period(conf))
    return train.take(~mask), train.take(mask)


def iter_train_chunks(
    conf: Mapping[str, Any],
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    stats: ReadStats | None = None,
) -> Iterator[Batch]:
    """Stream this worker's training rows chunk by chunk, for inputs larger than memory.

    The same rows, in the same order, as ``load_train_valid(...)[0]``: validation lines (when
    the split applies) are left out. Shuffle within a chunk with :func:`iter_minibatches`.
    """
    train_path = conf.get("angel.train.data.path")
    if not train_path:
        raise ValueError("angel.train.data.path is not set: expected the path of the training data")
    split = (
        not conf.get("angel.validate.data.path")
        and float(conf.get("ml.data.validate.ratio", 0.05) or 0.0) > 0
    )
    period = split_period(conf)
    chunk = int(conf.get("ml.data.chunk.rows", 65536))
    for batch in read_file(
        str(train_path),
        conf,
        worker_id=worker_id,
        num_workers=num_workers,
        chunk_rows=chunk,
        stats=stats,
    ):
        if split:
            batch = batch.take(~_validation_mask(batch, period))
        if len(batch):
            yield batch


def iter_stream_minibatches(
    conf: Mapping[str, Any],
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    worker_id: int = 0,
    num_workers: int = 1,
    drop_last: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[Batch]:
    """Mini-batches read from disk during the epoch, for training inputs larger than memory.

    Holds one chunk of ``ml.data.chunk.rows`` rows (plus fewer than ``batch_size`` left over from
    the previous chunk) at a time. Chunks come in file order; with ``shuffle`` the rows of pool
    ``c`` are permuted by ``numpy.random.default_rng([seed, epoch, c])``, a shuffle within a
    window of one chunk, the same in a resumed run. Every batch has ``batch_size`` rows but
    possibly the last, which ``drop_last`` leaves out.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is not valid: expected an integer >= 1")
    carry = Batch.empty()
    chunks = iter_train_chunks(conf, worker_id=worker_id, num_workers=num_workers, stats=stats)
    for c, chunk in enumerate(chunks):
        pool = concat([carry, chunk])
        n = len(pool)
        order = np.random.default_rng([seed, epoch, c]).permutation(n) if shuffle else np.arange(n)
        full = n - n % batch_size
        for start in range(0, full, batch_size):
            yield pool.take(order[start : start + batch_size])
        carry = pool.take(order[full:])
    if len(carry) and not drop_last:
        yield carry


def iter_minibatches(
    data: Batch,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    drop_last: bool = False,
) -> Iterator[Batch]:
    """Mini-batches of ``batch_size`` rows; with ``shuffle``, in an order fixed by ``(seed, epoch)``.

    The permutation of epoch ``e`` is ``numpy.random.default_rng([seed, e]).permutation(n)``, so
    a run resumed at epoch ``e`` sees the same batches as an uninterrupted one.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is not valid: expected an integer >= 1")
    n = len(data)
    stop = n - n % batch_size if drop_last else n
    if not shuffle:
        # In file order: views of the rows, no gather.
        for start in range(0, stop, batch_size):
            yield data.slice(start, min(start + batch_size, n))
        return
    order = np.random.default_rng([seed, epoch]).permutation(n)
    for start in range(0, stop, batch_size):
        yield data.take(order[start : start + batch_size])


def to_parquet(
    src: str, dst: str, conf: Mapping[str, Any], *, row_group_rows: int = 1 << 20
) -> ReadStats:
    """Convert a text input (libsvm, dummy or dense, per ``conf``) to Parquet, streaming.

    Writes the columns named by ``ml.data.parquet.{label,ids,values}.col``: the labels as read
    (before the label transform, so the same configuration reads both files alike), the 0-based
    ids and the values. Rows keep their order; blank lines are dropped. Returns the read counts.
    """
    if str(conf.get("ml.data.type", "libsvm")).lower() == "parquet":
        raise ValueError("to_parquet: the source is already Parquet (ml.data.type=parquet)")
    label_col = str(conf.get("ml.data.parquet.label.col", "label"))
    ids_col = str(conf.get("ml.data.parquet.ids.col", "ids"))
    values_col = str(conf.get("ml.data.parquet.values.col", "values"))
    schema = pa.schema(
        [
            (label_col, pa.float32()),
            (ids_col, pa.list_(pa.int64())),
            (values_col, pa.list_(pa.float32())),
        ]
    )
    stats = ReadStats()
    reader = _Reader(
        src, conf, 0, 1, int(conf.get("ml.data.chunk.rows", 65536)), stats, transform=False
    )
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)

    def write(writer: pq.ParquetWriter, b: Batch) -> None:
        offsets = pa.array(b.indptr.astype(np.int32) if b.nnz < 2**31 else b.indptr)
        table = pa.table(
            [
                pa.array(b.labels),
                pa.ListArray.from_arrays(offsets, pa.array(b.ids)),
                pa.ListArray.from_arrays(offsets, pa.array(b.values)),
            ],
            schema=schema,
        )
        writer.write_table(table, row_group_size=row_group_rows)

    # Chunks are regrouped so that every row group but the last has exactly row_group_rows rows.
    pending: list[Batch] = []
    count = 0
    with pq.ParquetWriter(dst, schema) as writer:
        for b in reader:
            pending.append(b)
            count += len(b)
            if count >= row_group_rows:
                whole = concat(pending)
                cut = count - count % row_group_rows
                write(writer, whole.take(np.arange(cut)))
                pending, count = [whole.take(np.arange(cut, count))], count - cut
        if count:
            write(writer, concat(pending))
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m learners.data SRC DST [--set key=value ...]``: convert text input to Parquet."""
    import argparse

    from angelps.config import load_config

    parser = argparse.ArgumentParser(
        prog="python -m learners.data",
        description="Convert a libsvm, dummy or dense input (a file or a directory) to Parquet.",
    )
    parser.add_argument("src", help="text input")
    parser.add_argument("dst", help="Parquet file to write")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a data key, e.g. ml.data.type=dummy (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        conf = load_config(None, args.set, KEYS)
        stats = to_parquet(args.src, args.dst, conf)
    except ValueError as e:  # DataError and ConfigError included
        print(f"error: {e}")
        return 2
    print(f"{args.dst}: {stats.summary()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
