"""The columns of a prediction file: ours (``pred``, ``label``) or Angel's (``sid, pred, proba,
label``), with the sample ids of an input read with ``ml.data.sid=true``.

The ids never travel to the workers: each worker skips the first field of a line, and the
driver reads the first field of every line of the input itself (the files in name order, as
the workers number their lines), then picks each prediction's id by its line position.

``angel.predict.out.format``:

* ``angelps``: ``sid`` (with ``ml.data.sid=true``), ``pred`` (P(y=1) for binary models, the
  class for multi-class, the value for regression) and ``label`` as the input wrote it (-1
  stays -1);
* ``angel``: Angel's columns: ``sid`` (the sample id, else the row number from 0), ``pred``
  (the model's score: the log-odds of ``proba`` for binary models, the class or the value
  otherwise), ``proba`` (P(y=1); for multi-class the class's probability) and ``label`` (the
  predicted label: +1/-1 for binary models, the class, the value).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from learners.data.reader import input_files
from learners.data.text import line_blocks

__all__ = ["prediction_columns", "read_sids"]

_BLOCK = 8 << 20


def read_sids(path: str) -> np.ndarray:
    """The first field of every line of the input ``path`` (its files in name order), by
    line position over all its files; an empty string for a blank line."""
    out: list[np.ndarray] = []
    for file in input_files(path):
        for lines, _first in line_blocks(file, _BLOCK):
            text = [
                (raw or b"").decode("utf-8", "replace").split(None, 1) for raw in lines.to_pylist()
            ]
            out.append(np.array([t[0] if t else "" for t in text], dtype=object))
    return np.concatenate(out) if out else np.zeros(0, dtype=object)


def prediction_columns(
    pred: Mapping[str, np.ndarray], task: str, layout: str, sids: np.ndarray | None
) -> dict[str, np.ndarray]:
    """The columns to write for ``pred`` (``GraphLearner.predict_rows``: ``pred``, ``label``,
    ``row_index``, ``proba``), in ``layout`` (module docstring). ``sids``: the input's first
    fields by line position (:func:`read_sids`), or None."""
    p = np.asarray(pred["pred"])
    rows = pred.get("row_index")
    sid = None
    if sids is not None and rows is not None:
        sid = sids[np.asarray(rows, dtype=np.int64)]
    if layout == "angelps":
        cols: dict[str, np.ndarray] = {} if sid is None else {"sid": sid}
        cols["pred"] = p
        if "label" in pred:
            cols["label"] = pred["label"]
        return cols
    cols = {"sid": sid if sid is not None else np.arange(len(p), dtype=np.int64)}
    if task == "binary":
        q = np.clip(p.astype(np.float64), 1e-15, 1 - 1e-15)
        cols["pred"] = np.log(q) - np.log1p(-q)
        cols["proba"] = p
        cols["label"] = np.where(p > 0.5, 1, -1).astype(np.int64)
    elif task == "multiclass":
        proba = pred.get("proba")
        cols["pred"] = p
        cols["proba"] = proba if proba is not None else np.full(len(p), np.nan)
        cols["label"] = p
    else:
        cols["pred"] = p
        cols["proba"] = np.full(len(p), np.nan)
        cols["label"] = p
    return cols


def as_table(cols: Mapping[str, Any]) -> Any:
    """The columns as a pyarrow Table (sids as strings)."""
    import pyarrow as pa

    arrays = {}
    for name, col in cols.items():
        if name == "sid" and np.asarray(col).dtype == object:
            arrays[name] = pa.array([str(v) for v in col], pa.string())
        else:
            arrays[name] = pa.array(np.asarray(col))
    return pa.table(arrays)
