"""The mini-batches of an epoch, from rows in memory or streamed from disk.

Invariant: the order is a function of ``(seed, epoch)`` (and the chunk number when streaming)
only, so a run resumed at epoch ``e`` sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from learners.data.batch import Batch, concat
from learners.data.options import DataOptions
from learners.data.problems import ReadStats
from learners.data.split import iter_train_chunks

__all__ = ["iter_minibatches", "iter_stream_minibatches"]


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is not valid: expected an integer >= 1")


def iter_stream_minibatches(
    opts: DataOptions,
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
    _check_batch_size(batch_size)
    carry = Batch.empty()
    chunks = iter_train_chunks(opts, worker_id=worker_id, num_workers=num_workers, stats=stats)
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

    The permutation of epoch ``e`` is ``numpy.random.default_rng([seed, e]).permutation(n)``.
    """
    _check_batch_size(batch_size)
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
