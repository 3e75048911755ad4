"""Schedules that reproduce ``torch.optim.lr_scheduler`` (one parameter group, nothing else
touching the lr): ``lr_at(k)`` is torch's lr after ``k`` calls of ``scheduler.step()``.

Source: pytorch/pytorch, torch/optim/lr_scheduler.py. Each value is computed in closed form from
k, with torch's own closed-form expression and operation order where torch has one, so it matches
torch's recursive (chainable) updates to within rounding and a resumed schedule is exact. ``b`` is
the initial step size ``lr`` (``ml.learn.rate``) below.

This module holds the schedules that are a plain formula of k (step, multi-step, constant,
linear, exponential, polynomial, cosine, SGDR, and the Python-only LambdaLR/MultiplicativeLR);
the cyclical ones with their momentum cycle are in ``decay.cyclic``, the metric-driven
ReduceLROnPlateau in ``decay.plateau``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence

from decay.base import (
    ParamError,
    StepSizeScheduler,
    _check_float,
    _check_int,
    _check_milestones,
    _finite,
    _is_real,
    _pow,
)

__all__ = [
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "ExponentialLR",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "PolynomialLR",
    "StepLR",
]


class StepLR(StepSizeScheduler):
    """Step decay: ``lr_at(k) = b · gamma^⌊k / step_size⌋`` (torch ``StepLR``)."""

    def __init__(self, lr: float, step_size: int, gamma: float = 0.1) -> None:
        super().__init__(lr)
        self.step_size = _check_int(self, "step_size", step_size, 1)
        self.gamma = _check_float(
            self, "gamma", gamma, _is_real(gamma) and gamma > 0, "a number > 0"
        )

    def _lr(self, k: int) -> float:
        return self.lr * _pow(self, k, self.gamma, k // self.step_size)

    def phases(self) -> list[tuple[int, str]]:
        return [(self.step_size, "its first decay")]


class MultiStepLR(StepSizeScheduler):
    """Decay at milestones: ``lr_at(k) = b · gamma^(number of milestones <= k)`` (torch
    ``MultiStepLR``). Milestones must be strictly increasing (torch silently stacks duplicates)."""

    def __init__(self, lr: float, milestones: Sequence[int], gamma: float = 0.1) -> None:
        super().__init__(lr)
        self.milestones = _check_milestones(self, "milestones", milestones, 0)
        self.gamma = _check_float(
            self, "gamma", gamma, _is_real(gamma) and gamma > 0, "a number > 0"
        )

    def _lr(self, k: int) -> float:
        return self.lr * _pow(self, k, self.gamma, bisect_right(self.milestones, k))

    def phases(self) -> list[tuple[int, str]]:
        return [(self.milestones[0], "its first milestone")] if self.milestones else []


class ConstantLR(StepSizeScheduler):
    """``lr_at(k) = b · factor`` for k < total_iters, then ``b`` (torch ``ConstantLR``).

    Unlike torch, ``factor = 0`` is rejected: torch accepts it and then raises
    ZeroDivisionError at ``k = total_iters``.
    """

    def __init__(self, lr: float, factor: float = 1.0 / 3, total_iters: int = 5) -> None:
        super().__init__(lr)
        self.factor = _check_float(
            self, "factor", factor, _is_real(factor) and 0 < factor <= 1, "a number in (0, 1]"
        )
        self.total_iters = _check_int(self, "total_iters", total_iters, 1)

    def _lr(self, k: int) -> float:
        return self.lr * (self.factor + (k >= self.total_iters) * (1 - self.factor))


class LinearLR(StepSizeScheduler):
    """Linear ramp of the factor: ``lr_at(k) = b · (s + (e − s)·min(T, k)/T)`` with
    s = start_factor, e = end_factor, T = total_iters (torch ``LinearLR``)."""

    def __init__(
        self,
        lr: float,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
    ) -> None:
        super().__init__(lr)
        self.start_factor = _check_float(
            self,
            "start_factor",
            start_factor,
            _is_real(start_factor) and 0 < start_factor <= 1,
            "a number in (0, 1]",
        )
        self.end_factor = _check_float(
            self,
            "end_factor",
            end_factor,
            _is_real(end_factor) and 0 <= end_factor <= 1,
            "a number in [0, 1]",
        )
        self.total_iters = _check_int(self, "total_iters", total_iters, 1)

    def _lr(self, k: int) -> float:
        s, e, t = self.start_factor, self.end_factor, self.total_iters
        return self.lr * (s + (e - s) * min(t, k) / t)


class ExponentialLR(StepSizeScheduler):
    """``lr_at(k) = b · gamma^k`` (torch ``ExponentialLR``; gamma is required)."""

    def __init__(self, lr: float, gamma: float) -> None:
        super().__init__(lr)
        self.gamma = _check_float(
            self, "gamma", gamma, _is_real(gamma) and gamma > 0, "a number > 0"
        )

    def _lr(self, k: int) -> float:
        return self.lr * _pow(self, k, self.gamma, k)


class PolynomialLR(StepSizeScheduler):
    """``lr_at(k) = b · (1 − min(T, k)/T)^power``, T = total_iters: 0 from k = T on
    (torch ``PolynomialLR``)."""

    def __init__(self, lr: float, total_iters: int = 5, power: float = 1.0) -> None:
        super().__init__(lr)
        self.total_iters = _check_int(self, "total_iters", total_iters, 1)
        self.power = _check_float(
            self, "power", power, _is_real(power) and power >= 0, "a number >= 0"
        )

    def _lr(self, k: int) -> float:
        t = self.total_iters
        return self.lr * (1.0 - min(t, k) / t) ** self.power


class CosineAnnealingLR(StepSizeScheduler):
    """``lr_at(k) = eta_min + (b − eta_min)·(1 + cos(π·k/t_max))/2`` (torch
    ``CosineAnnealingLR``). Like torch it is periodic past ``t_max`` (it rises again); use
    WarmupCosine for a schedule that stays at its floor. ``eta_min`` is an absolute step size."""

    def __init__(self, lr: float, t_max: int, eta_min: float = 0.0) -> None:
        super().__init__(lr)
        self.t_max = _check_int(self, "t_max", t_max, 1)
        self.eta_min = _check_float(
            self, "eta_min", eta_min, _is_real(eta_min) and eta_min >= 0, "a number >= 0"
        )

    def _lr(self, k: int) -> float:
        return (
            self.eta_min + (self.lr - self.eta_min) * (1 + math.cos(math.pi * k / self.t_max)) / 2
        )


class CosineAnnealingWarmRestarts(StepSizeScheduler):
    """SGDR (torch ``CosineAnnealingWarmRestarts``): cycles of length ``t_0·t_mult^i``; at
    position ``T_cur`` of a cycle of length ``T_i``:
    ``lr = eta_min + (b − eta_min)·(1 + cos(π·T_cur/T_i))/2`` (restart at ``T_cur = T_i``)."""

    def __init__(self, lr: float, t_0: int, t_mult: int = 1, eta_min: float = 0.0) -> None:
        super().__init__(lr)
        self.t_0 = _check_int(self, "t_0", t_0, 1)
        self.t_mult = _check_int(self, "t_mult", t_mult, 1)
        self.eta_min = _check_float(
            self, "eta_min", eta_min, _is_real(eta_min) and eta_min >= 0, "a number >= 0"
        )
        self._start = 0  # cache of the cycle found last: derived, not state
        self._len = self.t_0

    def _position(self, k: int) -> tuple[int, int]:
        if self.t_mult == 1:
            return k % self.t_0, self.t_0
        start, length = self._start, self._len
        if k < start:
            start, length = 0, self.t_0
        while k - start >= length:
            start += length
            length *= self.t_mult
        self._start, self._len = start, length
        return k - start, length

    def _lr(self, k: int) -> float:
        t_cur, t_i = self._position(k)
        return self.eta_min + (self.lr - self.eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2


class LambdaLR(StepSizeScheduler):
    """``lr_at(k) = b · fn(k)`` (torch ``LambdaLR``; Python API only, ``fn`` is not saved)."""

    def __init__(self, lr: float, fn: Callable[[int], float]) -> None:
        super().__init__(lr)
        if not callable(fn):
            raise ParamError("LambdaLR", "fn", fn, "a callable k -> factor")
        self.fn = fn

    def _lr(self, k: int) -> float:
        return _finite(self, k, self.lr * float(self.fn(k)))


class MultiplicativeLR(StepSizeScheduler):
    """``lr_at(0) = b``, ``lr_at(k) = lr_at(k−1) · fn(k)`` (torch ``MultiplicativeLR``; Python API
    only). Computed as the same running product as torch, cached for sequential access."""

    def __init__(self, lr: float, fn: Callable[[int], float]) -> None:
        super().__init__(lr)
        if not callable(fn):
            raise ParamError("MultiplicativeLR", "fn", fn, "a callable k -> factor")
        self.fn = fn
        self._ck, self._cv = 0, self.lr  # running-product cache (derived, not state)

    def _lr(self, k: int) -> float:
        if k < self._ck:
            self._ck, self._cv = 0, self.lr
        ck, cv = self._ck, self._cv
        while ck < k:
            ck += 1
            cv = _finite(self, ck, cv * float(self.fn(ck)))
        self._ck, self._cv = ck, cv
        return cv
