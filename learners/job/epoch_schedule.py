"""The step-size schedules between epochs: ReduceLROnPlateau fed the watched validation metric,
per-epoch decay advanced (:func:`schedule_epoch`, called by the training loop after validation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeGuard

from angelconf.config import ConfigError
from decay import StepSizeScheduler
from learners.job.loop_options import TrainPlan
from learners.job.rate_plan import RatePlan

__all__ = ["is_plateau", "schedule_epoch"]


class _MetricDriven(Protocol):
    def step(self, metric: float) -> float: ...


def is_plateau(sched: StepSizeScheduler) -> TypeGuard[_MetricDriven]:
    """ReduceLROnPlateau (alone or inside a composition): a schedule fed the validation metric
    through ``step(metric)`` rather than driven by the update count alone."""
    return sched.metric_driven and hasattr(sched, "step")


def schedule_epoch(
    rates: RatePlan, plan: TrainPlan, row: Mapping[str, Any], metric_name: str
) -> bool:
    """The schedules of ``rates`` after an epoch whose record is ``row``: each ReduceLROnPlateau
    fed ``metric_name`` (the watched validation metric, decided once by the learner), then the
    epoch ended (per-epoch decay advanced: :meth:`RatePlan.end_epoch`). True when a schedule is
    metric-driven: its state is then no function of the update count, and the workers need
    the plan again. ConfigError when the metric is watched but the model does not report it."""
    driven = False
    for sched in rates.schedules():  # the job's schedule and the tables' own
        driven = _metric_step(sched, plan, row, metric_name) or driven
    rates.end_epoch()
    return driven


def _metric_step(
    sched: StepSizeScheduler, plan: TrainPlan, row: Mapping[str, Any], metric_name: str
) -> bool:
    """ReduceLROnPlateau fed the watched metric (True), or nothing to do (False)."""
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
    if not is_plateau(plateau):
        return False
    watched = row.get(metric_name)
    if watched is None:
        raise ConfigError(
            "ReduceLROnPlateau needs a validation metric: set ml.data.validate.ratio > 0 "
            "or angel.validate.data.path"
        )
    plateau.step(watched)
    return True
