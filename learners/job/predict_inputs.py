"""In-memory inputs of ``GraphLearner.predict`` and ``evaluate``: tables, data frames, arrays.

Column conventions (the same as a Parquet input, docs/quickstart.md):

* a ``pyarrow.Table`` or ``pandas.DataFrame`` holds one row per sample: the column named by
  ``ml.data.parquet.ids.col`` (``ids``, a list of 0-based feature ids), optionally
  ``ml.data.parquet.values.col`` (``values``, a list of numbers as long as the ids; missing:
  every value is 1) and ``ml.data.parquet.label.col`` (``label``; needed by ``evaluate``);
* a 2-D numpy array ``X`` is dense: column ``j`` is feature id ``j`` and zeros are left out
  (a 1-D array is one sample); the labels come as a separate 1-D array.

Labels go through ``ml.data.label.trans.class`` as a file's labels do; a bad row is a
:class:`~learners.data.problems.DataError` naming the row (``row 3``), as a file's bad line is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from learners.data import DataOptions
from learners.data.batch import Batch, concat
from learners.data.labels import label_transform
from learners.data.parquet import parse_record_batch
from learners.data.problems import DataError, ReadStats, reject

if TYPE_CHECKING:
    from learners.worker.group import WorkerGroup

__all__ = [
    "InMemory",
    "check_ids",
    "in_input_order",
    "is_path",
    "predict_parts",
    "to_batch",
]

#: What ``predict``/``evaluate`` take besides a path.
InMemory = Any  # pa.Table | pandas.DataFrame | np.ndarray (pandas stays an optional import)


def is_path(data: object) -> bool:
    """True for a file or directory name (str or os.PathLike)."""
    return isinstance(data, str) or hasattr(data, "__fspath__")


def _from_table(table: pa.Table, opts: DataOptions, what: str) -> Batch:
    if opts.parquet_ids_col not in table.column_names:
        raise DataError(
            f"{what}: no column {opts.parquet_ids_col} (ml.data.parquet.ids.col): expected a "
            f"list of 0-based feature ids per row; columns: {', '.join(table.column_names)}"
        )
    opts = replace(opts, has_label=opts.parquet_label_col in table.column_names)
    batches, offset = [], 0
    for rb in table.to_batches():
        parsed = parse_record_batch(what, rb, np.arange(rb.num_rows), offset, opts)
        reject(parsed.bad, skip=opts.skip_bad_lines, stats=ReadStats())
        batches.append(parsed.batch)
        offset += rb.num_rows
    return concat(batches) if batches else Batch.empty()


def _from_dense(x: np.ndarray) -> Batch:
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise DataError(f"numpy input: expected a 2-D array [rows, features], got shape {x.shape}")
    if not np.isfinite(x).all():
        row = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise DataError(f"numpy input: row {row}: a value is not finite")
    rows, cols = np.nonzero(x)
    indptr = np.zeros(x.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=x.shape[0]), out=indptr[1:])
    return Batch(
        labels=np.full(x.shape[0], np.nan, np.float32),
        indptr=indptr,
        ids=cols.astype(np.int64),
        values=x[rows, cols].astype(np.float32),
        row_index=np.arange(x.shape[0], dtype=np.int64),
    )


def _with_labels(batch: Batch, labels: Any) -> Batch:
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if y.shape[0] != len(batch):
        raise DataError(f"labels: {y.shape[0]} labels for {len(batch)} rows")
    if not np.isfinite(y).all():
        raise DataError(f"labels: row {int(np.flatnonzero(~np.isfinite(y))[0])} is not finite")
    batch.labels = y.astype(np.float32)
    return batch


def to_batch(data: InMemory, opts: DataOptions, labels: Any = None) -> Batch:
    """``data`` (a pyarrow Table, a pandas DataFrame or a numpy array) as one :class:`Batch`,
    labels transformed as the job's reader does; ``labels`` (1-D) replace the table's."""
    if isinstance(data, pa.Table):
        batch = _from_table(data, opts, "table")
    elif type(data).__module__.startswith("pandas"):
        batch = _from_table(pa.Table.from_pandas(data, preserve_index=False), opts, "DataFrame")
    elif isinstance(data, np.ndarray):
        batch = _from_dense(np.asarray(data, dtype=np.float64))
    else:
        raise TypeError(
            f"expected a path, a pyarrow Table, a pandas DataFrame or a numpy array, "
            f"got {type(data).__name__}"
        )
    if labels is not None:
        batch = _with_labels(batch, labels)
    has = np.isfinite(batch.labels).any()
    if has and len(batch) and opts.label_trans.lower() != "notrans":
        batch.labels = label_transform(batch.labels, opts.label_trans, opts.label_threshold)
    batch.label_trans = opts.label_trans  # (a bad label is then named as given)
    return batch


def check_ids(batch: Batch, num_features: int, data: Any) -> None:
    """A DataError for in-memory rows the model cannot read: a numpy array wider than the
    model's features, or a feature id out of its range (``num_features`` <= 0: unbounded)."""
    if num_features <= 0 or batch.nnz == 0:
        return
    if isinstance(data, np.ndarray) and data.ndim in (1, 2) and data.shape[-1] > num_features:
        raise DataError(
            f"numpy input: {data.shape[-1]} columns, but the model has {num_features} "
            "features (column j is feature id j): pass arrays of at most that width"
        )
    bad = np.flatnonzero((batch.ids < 0) | (batch.ids >= num_features))
    if bad.size:
        row = int(np.searchsorted(batch.indptr, bad[0], side="right") - 1)
        raise DataError(
            f"{type(data).__name__} row {row}: feature id {int(batch.ids[bad[0]])} is out of "
            f"range: the model has {num_features} features (ids 0..{num_features - 1})"
        )


def predict_parts(
    workers: WorkerGroup, data: Any, labels: Any, opts: DataOptions, num_features: int = 0
) -> list[dict[str, Any]]:
    """Every worker's predictions of ``data``: a path (each worker reads its part), or rows in
    memory split into one contiguous part per worker (one call per worker), their ids checked
    against ``num_features`` first (:func:`check_ids`)."""
    if is_path(data):
        if labels is not None:
            raise TypeError("labels= goes with in-memory data, not with a path")
        return workers.execute("predict_file", os.fspath(data))
    batch = to_batch(data, opts, labels)
    check_ids(batch, num_features, data)
    parts = np.array_split(np.arange(len(batch)), len(workers))
    what = type(data).__name__
    return workers.execute_each("predict_input", [(batch.take(rows), what) for rows in parts])


def in_input_order(
    outs: Sequence[dict[str, Any]], with_rows: bool = False
) -> dict[str, np.ndarray]:
    """The workers' predictions as one ``pred`` array in input order (and ``label``, as the
    input wrote it, when the rows have labels); ``with_rows`` adds each row's line position
    (``row_index``) and, for multi-class models, the predicted class's probability
    (``proba``)."""
    outs = [o for o in outs if o["rows"]]
    if not outs:
        empty = {"pred": np.zeros(0, np.float32)}
        return empty | ({"row_index": np.zeros(0, np.int64)} if with_rows else {})
    rows = np.concatenate([o["row_index"] for o in outs])
    order = np.argsort(rows, kind="stable")
    out = {"pred": np.concatenate([o["pred"] for o in outs])[order]}
    labels = [o.get("labels_read", o["labels"]) for o in outs]
    if all(lab is not None for lab in labels):
        joined = np.concatenate(labels)
        if not np.isnan(joined).all():
            out["label"] = joined[order]
    if with_rows:
        out["row_index"] = rows[order]
        probs = [o["prob"] for o in outs if o.get("prob") is not None]
        if len(probs) == len(outs):
            out["proba"] = np.concatenate(probs).max(axis=1)[order]
    return out
