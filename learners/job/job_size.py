"""The job's shape once the workers have read their data: :class:`JobSize`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from learners.job.loop_options import TrainPlan
from learners.job.no_rows import no_rows_error

__all__ = ["JobSize"]


@dataclass(frozen=True)
class JobSize:
    """The job's shape, known once the workers have read their data parts."""

    num_features: int
    #: ids per sample of the field models (ml.fm.field.num), None when samples vary
    num_fields: int | None
    #: rows per mini-batch on each worker
    batch_size: int
    #: optimizer updates per epoch, the same on every worker (BSP)
    updates_per_epoch: int
    train_rows: tuple[int, ...] = ()
    valid_rows: tuple[int, ...] = ()
    skipped_lines: int = 0
    #: the first skipped line's message (FILE:LINE: what is wrong), None when none was skipped
    skipped_first: str | None = None

    @classmethod
    def of_parts(
        cls,
        plan: TrainPlan,
        summaries: Sequence[Mapping[str, Any]],
        feature_range: int,
        field_num: int,
    ) -> JobSize:
        """Size the job from every worker's ``data_summary()``.

        ``feature_range`` (ml.feature.index.range) and ``field_num`` (ml.fm.field.num) take
        precedence over what the data shows when > 0.
        """
        max_id = max(s[p]["max_id"] for s in summaries for p in ("train", "valid"))
        train_rows = tuple(int(s["train"]["rows"]) for s in summaries)
        if sum(train_rows) == 0:  # (more workers would not help: say what is wrong)
            raise no_rows_error(summaries)
        if min(train_rows) == 0:
            raise ValueError(
                f"worker {train_rows.index(0)} has no training rows: the input has "
                f"{sum(train_rows)} rows for {len(summaries)} workers (lower "
                "angel.workergroup.number)"
            )
        if plan.updates_per_epoch is not None:
            batch = max(1, math.ceil(min(train_rows) / (plan.updates_per_epoch * plan.accum)))
        else:
            batch = plan.minibatch_size
        return cls(
            num_features=feature_range if feature_range > 0 else max_id + 1,
            num_fields=field_num if field_num > 0 else None,
            batch_size=batch,
            # Lock-step: every worker makes the same number of updates per epoch (BSP); the
            # smallest part sets it, so no worker waits for a push that never comes.
            updates_per_epoch=max(1, math.ceil(min(train_rows) / batch) // plan.accum),
            train_rows=train_rows,
            valid_rows=tuple(int(s["valid"]["rows"]) for s in summaries),
            skipped_lines=sum(int(s.get("skipped_lines", 0)) for s in summaries),
            skipped_first=next(
                (str(s["skipped_first"]) for s in summaries if s.get("skipped_first")), None
            ),
        )
