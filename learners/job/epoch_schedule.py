"""The step-size schedule between epochs: ReduceLROnPlateau fed the watched validation metric,
per-epoch decay advanced (:func:`schedule_epoch`, called by GraphLearner after validation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeGuard

from angelconf.config import ConfigError
from decay import StepSizeScheduler
from learners.job.loop_options import TrainPlan

__all__ = ["is_plateau", "schedule_epoch"]


class _MetricDriven(Protocol):
    def step(self, metric: float) -> float: ...


def is_plateau(sched: StepSizeScheduler) -> TypeGuard[_MetricDriven]:
    """ReduceLROnPlateau (alone or inside a composition): a schedule fed the validation metric
    through ``step(metric)`` rather than driven by the update count alone."""
    return sched.metric_driven and hasattr(sched, "step")


def schedule_epoch(
    sched: StepSizeScheduler,
    plan: TrainPlan,
    row: Mapping[str, Any],
    metric_name: str,
    unit: str = "updates",
) -> None:
    """The schedule after an epoch whose record is ``row``: ReduceLROnPlateau fed
    ``metric_name`` (the watched validation metric, decided once by the learner); per-epoch
    decay advanced (``unit`` updates only: a schedule counted in samples or epochs reads its
    position from the samples seen). ConfigError when the metric is watched but the model
    does not report it."""
    if (
        any(k.startswith("valid_") for k in row)
        and metric_name not in row
        and (plan.early_stop_patience > 0 or is_plateau(sched))
    ):
        names = ", ".join(sorted(k for k in row if k.startswith("valid_")))
        raise ConfigError(
            f"ml.early.stop.metric={plan.early_stop_metric}: this model reports "
            f"no {metric_name}; valid names: {names}"
        )
    plateau = sched
    if is_plateau(plateau):
        watched = row.get(metric_name)
        if watched is None:
            raise ConfigError(
                "ReduceLROnPlateau needs a validation metric: set ml.data.validate.ratio > 0 "
                "or angel.validate.data.path"
            )
        plateau.step(watched)
    if not plan.decay_on_batch and unit == "updates":
        sched.advance()
