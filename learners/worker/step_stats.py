"""What a worker's optimizer updates carry: the chunk's :class:`StepStats`, and the next
micro-batches with their rows in flight (:class:`Prefetched`, learners/worker/train_worker.py's queue)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
from torch import Tensor

from learners.data import Batch
from learners.models.sparse_input import SparseInput

__all__ = ["Prefetched", "Resolved", "RowMap", "Rows", "StepStats", "num_rows"]


@dataclass
class StepStats:
    """What one ``run_steps`` chunk did (summed over its updates)."""

    updates: int = 0
    skipped: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    pull_s: float = 0.0
    compute_s: float = 0.0
    push_s: float = 0.0
    wait_s: float = 0.0
    elapsed_s: float = 0.0
    last_lr: float = 0.0
    #: the last update's momentum and tables' own rates (learners.job.rate_plan.UpdateRates.record)
    last_rates: dict[str, float] = field(default_factory=dict)
    #: rows looked up in / served by the worker cache, and step-call bytes moved
    cache_on: bool = False
    cache_lookups: int = 0
    cache_hits: int = 0
    bytes_moved: int = 0


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
