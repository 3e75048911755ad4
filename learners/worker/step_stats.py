"""What a worker's optimizer updates carry: the chunk's :class:`StepStats` (defined in the
torch-free :mod:`learners.worker.chunk_stats`, which the driver unpickles), and the next
micro-batches with their rows in flight (:class:`Prefetched`, learners/worker/train_worker.py's
queue)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

import numpy as np
from torch import Tensor

from learners.data import Batch
from learners.models.sparse_input import SparseInput
from learners.worker.chunk_stats import StepStats

__all__ = ["Prefetched", "Resolved", "RowMap", "Rows", "StepStats", "num_rows"]


#: A table's rows for a batch: as pulled (numpy), or assembled by the worker cache (a tensor).
RowMap = Mapping[str, "np.ndarray | Tensor"]


class Rows(Protocol):
    """A pending pull: the rows of every requested table once ``result()`` returns."""

    def result(self) -> RowMap: ...


class Resolved:
    """A future whose value is already here (rows prefetched by the previous ``run_steps``)."""

    def __init__(self, value: RowMap) -> None:
        self.value = value

    def result(self) -> RowMap:
        return self.value


class Prefetched(NamedTuple):
    """The next micro-batch with its rows in flight: everything of its input but the rows."""

    batch: Batch
    x: SparseInput
    y: Tensor | None
    req: dict[str, np.ndarray]
    rows: Rows


def num_rows(batch: Batch) -> int:
    """The number of rows (samples) of ``batch``."""
    return int(np.asarray(batch.indptr).size - 1)
