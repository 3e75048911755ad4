"""A training worker's rows: its share of the training input and of the validation set.

With ``angel.validate.data.path`` set, all of ``angel.train.data.path`` trains and that input
validates. Otherwise line ``i`` of the training input validates iff ``i % P == 0``, ``P =
ceil(1/ml.data.validate.ratio)``: Angel's rule (a sample goes to validation iff ``count %
ceil(1/ratio) == 0``) applied to the line index of the whole input instead of a per-task
counter, so the validation set is the same whatever the number of workers, and every worker
holds its share of it. A ratio of 0 gives an empty validation set.

:func:`load_train_valid` holds both in memory; :func:`iter_train_chunks` streams the same
training rows, in the same order, for inputs larger than memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from learners.data.batch import Batch
from learners.data.options import DataOptions, split_period
from learners.data.problems import ReadStats
from learners.data.reader import load_file, read_file

__all__ = ["iter_train_chunks", "load_train_valid", "validation_mask"]


def validation_mask(batch: Batch, opts: DataOptions) -> np.ndarray:
    """Which rows of ``batch`` (read from the training input) are validation rows."""
    return batch.row_index % split_period(opts) == 0


def _train_path(opts: DataOptions) -> str:
    if not opts.train_path:
        raise ValueError("angel.train.data.path is not set: expected the path of the training data")
    return opts.train_path


def load_train_valid(
    opts: DataOptions,
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    stats: ReadStats | None = None,
) -> tuple[Batch, Batch]:
    """This worker's training and validation rows, in memory."""
    train_path = _train_path(opts)
    stats = stats if stats is not None else ReadStats()

    def load(path: str) -> Batch:
        return load_file(path, opts, worker_id=worker_id, num_workers=num_workers, stats=stats)

    train = load(train_path)
    if opts.validate_path:
        return train, load(opts.validate_path)
    if not opts.holds_out_validation:
        return train, Batch.empty()
    mask = validation_mask(train, opts)
    return train.take(~mask), train.take(mask)


def iter_train_chunks(
    opts: DataOptions,
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    stats: ReadStats | None = None,
) -> Iterator[Batch]:
    """Stream this worker's training rows chunk by chunk, for inputs larger than memory.

    The same rows, in the same order, as ``load_train_valid(...)[0]``: validation lines (when
    the split applies) are left out. Shuffle within a chunk with
    :func:`learners.data.iter_stream_minibatches`.
    """
    train_path = _train_path(opts)
    for batch in read_file(
        train_path, opts, worker_id=worker_id, num_workers=num_workers, stats=stats
    ):
        if opts.holds_out_validation:
            batch = batch.take(~validation_mask(batch, opts))
        if len(batch):
            yield batch
