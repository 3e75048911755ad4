"""Compound schedules by composition: a warmup in front, a sequence, a chain of multipliers.

Children are pure functions of their own count, so a compound schedule is too: its state is
still just its count, and resuming is exact.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from decay.base import ParamError, StepSizeScheduler, _check_int, _check_milestones

__all__ = ["ChainedScheduler", "SequentialLR", "Warmup"]


def _children(owner: str, schedulers: Sequence[StepSizeScheduler]) -> list[StepSizeScheduler]:
    if not isinstance(schedulers, (list, tuple)) or not schedulers:
        raise ParamError(owner, "schedulers", None, "a non-empty list of schedules")
    for i, s in enumerate(schedulers):
        if not isinstance(s, StepSizeScheduler):
            raise ParamError(owner, f"schedulers[{i}]", s, "a StepSizeScheduler")
        if s.metric_driven:
            raise ParamError(
                owner,
                f"schedulers[{i}]",
                type(s).__name__,
                "a schedule that is a function of the update count (a metric-driven "
                "ReduceLROnPlateau cannot be composed)",
            )
    return list(schedulers)


class Warmup(StepSizeScheduler):
    """A linear warmup in front of any schedule: ``lr_at(k) = inner.lr_at(0)·k/W`` for k < W,
    then ``inner.lr_at(k − W)`` (the inner schedule starts after the warmup).

    As in KempnerForge, torch's ``LinearLR`` warmups and Hugging Face, the warmup starts at 0
    (the first update has step size 0). Set by ``ml.opt.decay.warmup.steps`` on any schedule
    without a warmup of its own. In front of a ReduceLROnPlateau (warmup, then plateau: a
    combination torch cannot express), ``step(metric)`` goes to the plateau, and a reduction
    takes effect from the update at which its metric was reported."""

    def __init__(self, inner: StepSizeScheduler, warmup_steps: int) -> None:
        if not isinstance(inner, StepSizeScheduler):
            raise ParamError("Warmup", "inner", inner, "a StepSizeScheduler")
        super().__init__(inner.lr)
        self.inner = inner
        self.warmup_steps = _check_int(self, "warmup_steps", warmup_steps, 0)
        self.metric_driven = inner.metric_driven
        self._peak = inner.lr_at(0)

    def _lr(self, k: int) -> float:
        w = self.warmup_steps
        if k < w:
            return self._peak * (k / w)
        return self.inner._lr(k - w)

    def phases(self) -> list[tuple[int, str]]:
        w = self.warmup_steps
        inner = [(w + k, what) for k, what in self.inner.phases()]
        return [(w, "the end of its warmup"), *inner] if w > 0 else inner

    def _momentum(self, k: int) -> float | None:
        return self.inner._momentum(max(0, k - self.warmup_steps))

    def _boundary(self, count: int) -> bool:
        return count >= self.warmup_steps and self.inner._boundary(count - self.warmup_steps)

    def step(self, metric: float) -> float:
        """Report a metric to a metric-driven inner schedule; returns the next step size."""
        step = getattr(self.inner, "step", None)
        if not self.metric_driven or step is None:
            raise TypeError(f"{self.inner.describe()} is not metric-driven: it has no step(metric)")
        # The inner schedule counts from the end of the warmup.
        self.inner._count = max(0, self._count - self.warmup_steps)
        step(metric)
        return self.peek()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.metric_driven:
            state["inner"] = self.inner.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if self.metric_driven:
            if "inner" not in state:
                raise ValueError("Warmup.load_state_dict: missing 'inner' (the plateau state)")
            self.inner.load_state_dict(state["inner"])


class SequentialLR(StepSizeScheduler):
    """One schedule after another (torch ``SequentialLR``, optax ``join_schedules``): with
    milestones m_1 < m_2 < ..., child i runs on ``[m_i, m_{i+1})`` with its own count restarted
    at 0: ``lr_at(k) = child_i.lr_at(k − m_i)`` (m_0 = 0).

    Matches torch for children whose recursive and closed forms agree (torch restarts a child
    at its milestone from its closed form at 0). Milestones must be >= 1 and strictly
    increasing: torch's milestone 0 leaks the first child's factor (pytorch#185872)."""

    def __init__(self, schedulers: Sequence[StepSizeScheduler], milestones: Sequence[int]) -> None:
        children = _children("SequentialLR", schedulers)
        super().__init__(children[0].lr)
        self.schedulers = children
        if not isinstance(milestones, (list, tuple)) or len(milestones) != len(children) - 1:
            raise ParamError(
                "SequentialLR",
                "milestones",
                list(milestones) if isinstance(milestones, (list, tuple)) else milestones,
                f"{len(children) - 1} integer(s), one fewer than the {len(children)} schedules",
            )
        # One child needs no milestone; otherwise each must be >= 1 and strictly increasing.
        self.milestones = _check_milestones(self, "milestones", milestones, 1) if milestones else []
        self._starts = [0, *self.milestones]

    def _child(self, k: int) -> tuple[StepSizeScheduler, int]:
        i = bisect_right(self.milestones, k)
        return self.schedulers[i], k - self._starts[i]

    def _lr(self, k: int) -> float:
        child, local = self._child(k)
        return child._lr(local)

    def _momentum(self, k: int) -> float | None:
        child, local = self._child(k)
        return child._momentum(local)

    def _boundary(self, count: int) -> bool:
        child, local = self._child(count)
        return child._boundary(local)


class ChainedScheduler(StepSizeScheduler):
    """Product of multipliers (torch ``ChainedScheduler``):
    ``lr_at(k) = b · Π_i child_i.lr_at(k)/child_i.lr`` where b is the first child's ``lr``.

    Equals torch's chain for its multiplicative ("chainable") schedules; torch's absolute ones
    (CyclicLR, OneCycleLR, CosineAnnealingWarmRestarts, LambdaLR) and CosineAnnealingLR with
    ``eta_min > 0`` overwrite or shift the lr in torch, while here every child is a factor.
    The momentum comes from the first child that drives it."""

    def __init__(self, schedulers: Sequence[StepSizeScheduler]) -> None:
        children = _children("ChainedScheduler", schedulers)
        super().__init__(children[0].lr)
        self.schedulers = children

    def _lr(self, k: int) -> float:
        value = self.lr
        for child in self.schedulers:
            if child.lr == 0.0:
                return 0.0
            value *= child._lr(k) / child.lr
        return value

    def _momentum(self, k: int) -> float | None:
        for child in self.schedulers:
            m = child._momentum(k)
            if m is not None:
                return m
        return None

    def _boundary(self, count: int) -> bool:
        return self.schedulers[0]._boundary(count)
