"""One worker's part of the job's data: its training and validation rows, and its mini-batches.

Worker ``i`` of ``W`` reads its part of every input (``learners.data.reader``); validation rows
are split off the training input by row number (``learners.data.split``), so the split does
not depend on ``W``. In memory (the default) the part is read once; streamed
(``ml.data.stream``) one counting pass keeps only the validation rows and the training rows'
counts, and every epoch reads its mini-batches from disk again. Either way an epoch's
mini-batches are a pure function of (``ml.seed``, epoch), so a resumed run sees the same ones.

A part that cannot be read (a malformed line, a missing file) does not raise in the constructor:
Ray keeps only the text of an actor constructor's error (``ActorDiedError``), so the error is kept
and raised by :meth:`DataPart.summary`, the first call the driver makes, where it reaches the
driver as itself (``DataError`` naming the file and line) and becomes one line and exit 2.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from learners.data import (
    Batch,
    DataError,
    DataOptions,
    ReadStats,
    concat,
    iter_minibatches,
    iter_stream_minibatches,
    line_of,
    load_file,
    load_train_valid,
    read_file,
    validation_mask,
)
from learners.data.labels import class_index_message

__all__ = ["DataPart", "check_rows_labels"]


class DataPart:
    """Worker ``worker_id``'s part of the data of ``opts``.

    ``read=False``: an empty part (a worker that predicts or evaluates files given per call).
    ``stream``: the training rows stay on disk (``train`` is empty; ``train_rows`` counts them).
    """

    def __init__(
        self, opts: DataOptions, worker_id: int, num_workers: int, stream: bool, read: bool = True
    ) -> None:
        self.opts = opts
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.stream = stream and read
        self.stats = ReadStats()
        self._train_summary: dict[str, int] | None = None
        self.train, self.valid = Batch.empty(), Batch.empty()
        self.error: Exception | None = None
        if not read:
            return
        try:
            self._read()
        except Exception as e:  # raised again by summary(): see the module docstring
            self.error = e

    def _read(self) -> None:
        opts, worker_id, num_workers = self.opts, self.worker_id, self.num_workers
        if self.stream:
            # Inputs larger than memory: one counting pass now (rows, id range; the small
            # validation split is kept), then every epoch reads its batches from disk.
            self.valid, self._train_summary = self._scan()
        else:
            self.train, self.valid = load_train_valid(
                opts, worker_id=worker_id, num_workers=num_workers, stats=self.stats
            )

    def _scan(self) -> tuple[Batch, dict[str, int]]:
        """Stream the part once: the validation rows and the training rows' counts."""
        opts = self.opts
        summary = _Summary()
        valid_parts = []
        for chunk in read_file(
            str(opts.train_path),
            opts,
            worker_id=self.worker_id,
            num_workers=self.num_workers,
            stats=self.stats,
        ):
            if opts.holds_out_validation:
                mask = validation_mask(chunk, opts)
                valid_parts.append(chunk.take(mask))
                chunk = chunk.take(~mask)
            summary.add(chunk)
        if opts.validate_path:
            valid = self.load_file(opts.validate_path)
        else:
            valid = concat(valid_parts) if valid_parts else Batch.empty()
        return valid, summary.as_dict()

    def check_labels(self, check: Callable[[np.ndarray], Any]) -> None:
        """Raise a bad label of the rows held (``check``: the model's, as its steps apply it to
        a batch) as a :class:`DataError` naming the file and line of the first row that makes
        it fail: a step's check knows the batch, not where its rows came from. Streamed
        training rows are checked by each step, without the line."""
        opts = self.opts
        valid_path = opts.validate_path or opts.train_path
        for rows, path in ((self.train, str(opts.train_path)), (self.valid, str(valid_path))):
            check_rows_labels(rows, check, functools.partial(line_of, path, opts))

    def load_file(self, path: str) -> Batch:
        """This worker's part of another input (prediction, evaluation), in memory."""
        return load_file(
            path,
            self.opts,
            worker_id=self.worker_id,
            num_workers=self.num_workers,
            stats=self.stats,
        )

    def train_rows(self) -> int:
        """Training rows of the part (held or streamed)."""
        if self._train_summary is not None:
            return self._train_summary["rows"]
        return int(np.asarray(self.train.indptr).size - 1)

    def minibatches(self, batch_size: int, epoch: int, shuffle: bool, seed: int) -> Iterator[Batch]:
        """The epoch's mini-batches of the training rows (shuffled by (seed, epoch))."""
        if self.stream:
            return iter(
                iter_stream_minibatches(
                    self.opts,
                    batch_size,
                    shuffle=shuffle,
                    seed=seed,
                    epoch=epoch,
                    worker_id=self.worker_id,
                    num_workers=self.num_workers,
                )
            )
        return iter(
            iter_minibatches(self.train, batch_size, shuffle=shuffle, seed=seed, epoch=epoch)
        )

    def summary(self) -> dict[str, Any]:
        """Sizes and id range of the part (the driver sizes the tables from them); raises the
        error that stopped the read, if any."""
        if self.error is not None:
            raise self.error
        out: dict[str, Any] = {}
        for name, part in (("train", self.train), ("valid", self.valid)):
            if name == "train" and self._train_summary is not None:
                out[name] = dict(self._train_summary)
                continue
            summary = _Summary()
            summary.add(part)
            out[name] = summary.as_dict()
        out["skipped_lines"] = int(self.stats.bad_lines)
        if self.stats.bad_examples:
            out["skipped_first"] = self.stats.bad_examples[0]
        return out


class _Summary:
    """Row count, non-zeros, largest id and non-zeros per row of the batches added."""

    def __init__(self) -> None:
        self.rows = self.nnz = 0
        self.max_id, self.min_nnz, self.max_nnz = -1, 1 << 62, 0

    def add(self, batch: Batch) -> None:
        counts = np.diff(np.asarray(batch.indptr))
        if not counts.size:
            return
        ids = np.asarray(batch.ids)
        self.rows += int(counts.size)
        self.nnz += int(ids.size)
        self.max_id = max(self.max_id, int(ids.max()) if ids.size else -1)
        self.min_nnz = min(self.min_nnz, int(counts.min()))
        self.max_nnz = max(self.max_nnz, int(counts.max()))

    def as_dict(self) -> dict[str, int]:
        return {
            "rows": self.rows,
            "nnz": self.nnz,
            "max_id": self.max_id,
            "min_nnz": self.min_nnz if self.rows else 0,
            "max_nnz": self.max_nnz,
        }


def check_rows_labels(
    rows: Batch, check: Callable[[np.ndarray], Any], where: Callable[[int], str]
) -> None:
    """Raise the first label of ``rows`` that ``check`` (the model's) rejects as a
    :class:`DataError` prefixed by ``where`` of its row's ``row_index`` (``FILE:LINE`` of a
    file's rows: :func:`~learners.data.reader.line_of`). A label that is not a class index is
    named as the input has it, before ``rows.label_trans``. Rows without labels (all NaN: a
    predict input, ``ml.data.has.label=false``) pass."""
    y = np.asarray(rows.labels)
    if not len(y) or np.isnan(y).all():
        return
    try:
        check(y)
    except ValueError as e:
        row = _first_failing(y, check)
        said = str(e)
        # A model's class-index message knows the label after the transform only: named again
        # as the input has it, with the transform in effect (learners.data.labels).
        m = _NOT_A_CLASS.match(said)
        if m is not None:
            said = class_index_message(float(y[row]), int(m.group(1)), rows.label_trans)
        raise DataError(f"{where(int(rows.row_index[row]))}: {said}") from None


#: How the models (learners/models) say a label is not a class index: its class count.
_NOT_A_CLASS = re.compile(r"label \S+ is not a class index in 0\.\.-?\d+ \(ml\.num\.class=(\d+)\)")


def _first_failing(y: np.ndarray, check: Callable[[np.ndarray], Any]) -> int:
    """The first ``k`` such that ``check(y[: k + 1])`` fails (``check(y)`` fails; a prefix that
    fails makes every longer one fail, as a check of the set of values does)."""
    lo, hi = 0, len(y) - 1  # y[: hi + 1] fails
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            check(y[: mid + 1])
        except ValueError:
            hi = mid
        else:
            lo = mid + 1
    return hi
