"""Parquet input: one row per sample, a numeric label column, a list<int> ids column (0-based)
and an optional list<float> values column (missing: every value is 1).

The columns are named by ``ml.data.parquet.{label,ids,values}.col``. As with text, a bad row
(a null or non-finite label or value, a negative or out-of-range id, an id repeated within the
row, ids and values of different lengths) is never raised here: :func:`parse_record_batch` returns the good rows and one message
per bad row (``file: row R: reason``, in row order, first problem of the row). A column of the
wrong type or a file that is not Parquet is a schema problem and raises :class:`DataError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from angelps import fs
from learners.data.batch import Batch, first_repeats
from learners.data.options import DataOptions
from learners.data.problems import DataError

__all__ = ["ParsedParquet", "open_parquet", "parse_record_batch"]

_FLOAT32_MAX = np.finfo(np.float32).max


def open_parquet(file: str, opts: DataOptions) -> tuple[pq.ParquetFile, list[str]]:
    """The file and the columns to read from it; DataError when it is not Parquet or lacks one."""
    try:
        pf = pq.ParquetFile(fs.input_file(file))  # a URL opened through pyarrow.fs
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{file}: not a readable Parquet file ({e})") from None
    names = pf.schema_arrow.names
    want = [opts.parquet_ids_col] + ([opts.parquet_label_col] if opts.has_label else [])
    missing = [c for c in want if c not in names]
    if missing:
        raise DataError(
            f"{file}: Parquet column(s) {', '.join(missing)} not found; the file has "
            f"{', '.join(names)} (set ml.data.parquet.label.col / ml.data.parquet.ids.col)"
        )
    return pf, want + ([opts.parquet_values_col] if opts.parquet_values_col in names else [])


@dataclass
class ParsedParquet:
    """One parsed record batch: its good rows and one message per bad row."""

    batch: Batch
    bad: list[str]


def _is_list_of(typ: pa.DataType, *kinds: Callable[[pa.DataType], bool]) -> bool:
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
        return False
    return any(kind(typ.value_type) for kind in kinds)


class _Rows:
    """The first problem of every bad row of one record batch (rows by position)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.problems: dict[int, str] = {}

    def flag(self, mask_rows: np.ndarray, reason: str) -> None:
        for r in np.flatnonzero(mask_rows):
            self.problems.setdefault(int(r), reason)

    def flag_features(self, row_of: np.ndarray, feature_mask: np.ndarray, reason: str) -> None:
        rows = np.zeros(self.n, bool)
        rows[row_of[feature_mask]] = True
        self.flag(rows, reason)


def _labels(file: str, rb: pa.RecordBatch, opts: DataOptions, rows: _Rows) -> np.ndarray:
    if not opts.has_label:
        return np.full(rb.num_rows, np.nan)
    col = opts.parquet_label_col
    lab = rb.column(col)
    if not (pa.types.is_integer(lab.type) or pa.types.is_floating(lab.type)):
        raise DataError(
            f"{file}: Parquet label column {col} has type {lab.type}, expected a number"
        )
    labels = lab.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    rows.flag(~np.isfinite(labels), f"label column {col} is null or not finite")
    return labels


def _ids(
    file: str, rb: pa.RecordBatch, opts: DataOptions, rows: _Rows
) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 [nnz], features per row int64 [n]); a null list counts as an empty row."""
    col = opts.parquet_ids_col
    arr = rb.column(col)
    if not _is_list_of(arr.type, pa.types.is_integer):
        raise DataError(
            f"{file}: Parquet ids column {col} has type {arr.type}, expected list<int64>"
        )
    rows.flag(arr.is_null().to_numpy(zero_copy_only=False), f"ids column {col} is null")
    arr = arr.fill_null(pa.scalar([], arr.type))
    counts = pc.list_value_length(arr).to_numpy().astype(np.int64)
    flat = pc.list_flatten(arr)
    if flat.null_count:
        row_of = np.repeat(np.arange(rows.n), counts)
        rows.flag_features(
            row_of,
            flat.is_null().to_numpy(zero_copy_only=False),
            f"ids column {col} holds a null id",
        )
        flat = flat.fill_null(0)
    return flat.cast(pa.int64()).to_numpy(), counts


def _values(
    file: str, rb: pa.RecordBatch, opts: DataOptions, counts: np.ndarray, rows: _Rows
) -> np.ndarray:
    """Values float64 [nnz] aligned with the ids; 0 where a row's values are bad (it is dropped)."""
    col = opts.parquet_values_col
    if col not in rb.schema.names:
        return np.ones(int(counts.sum()))
    va = rb.column(col)
    if not _is_list_of(va.type, pa.types.is_floating, pa.types.is_integer):
        raise DataError(
            f"{file}: Parquet values column {col} has type {va.type}, expected list<float>"
        )
    vnull = va.is_null().to_numpy(zero_copy_only=False)
    vcounts = np.where(vnull, -1, pc.list_value_length(va).fill_null(0).to_numpy())
    mismatch = vcounts != counts
    rows.flag(
        mismatch,
        f"values column {col} has a different length than ids column {opts.parquet_ids_col}",
    )
    if mismatch.any():
        # Rebuild the values row by row only where they agree; others are dropped below.
        vlist = va.fill_null(pa.scalar([], va.type))
        fixed = [
            vlist[i].as_py() if vcounts[i] == counts[i] else [0.0] * int(counts[i])
            for i in range(rows.n)
        ]
        values = np.asarray([v for row in fixed for v in row], dtype=np.float64)
    else:
        values = pc.list_flatten(va).cast(pa.float64()).fill_null(np.nan)
        values = values.to_numpy(zero_copy_only=False)
    vbad = ~np.isfinite(values) | (np.abs(values) > _FLOAT32_MAX)
    if vbad.any():
        row_of = np.repeat(np.arange(rows.n), counts)
        rows.flag_features(row_of, vbad, f"values column {col} holds a null or non-finite value")
        values = np.where(vbad, 0.0, values)
    return values


def _check_ids(ids: np.ndarray, counts: np.ndarray, opts: DataOptions, rows: _Rows) -> None:
    row_of = np.repeat(np.arange(rows.n), counts)
    rows.flag_features(row_of, ids < 0, "a feature id is negative (Parquet ids are 0-based)")
    index_range = opts.index_range
    if index_range > 0:
        rows.flag_features(
            row_of,
            ids >= index_range,
            f"a feature id is outside ml.feature.index.range={index_range} "
            f"(valid: 0..{index_range - 1})",
        )
    repeats = first_repeats(ids, counts)
    for r, fid in repeats.items():
        rows.problems.setdefault(r, f"feature id {fid} appears more than once in the row")
    if opts.field_num > 0:
        rows.flag(
            counts != opts.field_num, f"expected exactly ml.fm.field.num={opts.field_num} features"
        )


def parse_record_batch(
    file: str, rb: pa.RecordBatch, row_no: np.ndarray, offset: int, opts: DataOptions
) -> ParsedParquet:
    """Rows ``row_no`` (0-based in ``file``, which starts at row index ``offset``) as a batch."""
    rows = _Rows(rb.num_rows)
    labels = _labels(file, rb, opts, rows)
    ids, counts = _ids(file, rb, opts, rows)
    values = _values(file, rb, opts, counts, rows)
    _check_ids(ids, counts, opts, rows)
    indptr = np.zeros(rows.n + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    batch = Batch(
        labels=labels.astype(np.float32),
        indptr=indptr,
        ids=ids,
        values=values.astype(np.float32),
        row_index=row_no + offset,
    )
    if not rows.problems:
        return ParsedParquet(batch, [])
    bad_rows = sorted(rows.problems)
    messages = [f"{file}: row {int(row_no[r])}: {rows.problems[r]}" for r in bad_rows]
    ok = np.ones(rows.n, bool)
    ok[bad_rows] = False
    return ParsedParquet(batch.take(ok), messages)
