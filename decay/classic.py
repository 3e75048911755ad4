"""Schedules that reproduce ``torch.optim.lr_scheduler`` (one parameter group, nothing else
touching the lr): ``lr_at(k)`` is torch's lr after ``k`` calls of ``scheduler.step()``.

Source: pytorch/pytorch, torch/optim/lr_scheduler.py. Each value is computed in closed form from
k, with torch's own closed-form expression and operation order where torch has one, so it matches
torch's recursive (chainable) updates to within rounding and a resumed schedule is exact. ``b`` is
the initial step size ``lr`` (``ml.learn.rate``) below.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from decay.base import (
    ParamError,
    StepSizeScheduler,
    _check_bool,
    _check_choice,
    _check_float,
    _check_int,
    _finite,
    _is_real,
    _pow,
)

__all__ = [
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PolynomialLR",
    "ReduceLROnPlateau",
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

    def _block(self, k0: int, n: int) -> list[float]:
        if self.gamma > 1:  # may overflow: one value at a time, with its error
            return super()._block(k0, n)
        lr, g, s = self.lr, self.gamma, self.step_size
        return [lr * g ** (k // s) for k in range(k0, k0 + n)]


def _milestones(owner: Any, param: str, value: Any, low: int) -> list[int]:
    valid = f"a strictly increasing list of integers >= {low}"
    if not isinstance(value, (list, tuple)) or not value:
        raise ParamError(type(owner).__name__, param, value if value else None, valid)
    for m in value:
        if isinstance(m, bool) or not isinstance(m, int) or m < low:
            raise ParamError(type(owner).__name__, param, list(value), valid)
    if any(b <= a for a, b in itertools.pairwise(value)):
        raise ParamError(type(owner).__name__, param, list(value), valid)
    return list(value)


class MultiStepLR(StepSizeScheduler):
    """Decay at milestones: ``lr_at(k) = b · gamma^(number of milestones <= k)`` (torch
    ``MultiStepLR``). Milestones must be strictly increasing (torch silently stacks duplicates)."""

    def __init__(self, lr: float, milestones: Sequence[int], gamma: float = 0.1) -> None:
        super().__init__(lr)
        self.milestones = _milestones(self, "milestones", milestones, 0)
        self.gamma = _check_float(
            self, "gamma", gamma, _is_real(gamma) and gamma > 0, "a number > 0"
        )

    def _lr(self, k: int) -> float:
        return self.lr * _pow(self, k, self.gamma, bisect_right(self.milestones, k))

    def _block(self, k0: int, n: int) -> list[float]:
        if self.gamma > 1:
            return super()._block(k0, n)
        lr, g, m = self.lr, self.gamma, self.milestones
        return [lr * g ** bisect_right(m, k) for k in range(k0, k0 + n)]


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

    def _block(self, k0: int, n: int) -> list[float]:
        lr, f, t = self.lr, self.factor, self.total_iters
        return [lr * (f + (k >= t) * (1 - f)) for k in range(k0, k0 + n)]


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

    def _block(self, k0: int, n: int) -> list[float]:
        lr, s, e, t, end = self.lr, self.start_factor, self.end_factor, self.total_iters, k0 + n
        mid = min(end, max(k0, t))
        return [lr * (s + (e - s) * k / t) for k in range(k0, mid)] + [
            lr * (s + (e - s) * t / t)
        ] * (end - mid)


class ExponentialLR(StepSizeScheduler):
    """``lr_at(k) = b · gamma^k`` (torch ``ExponentialLR``; gamma is required)."""

    def __init__(self, lr: float, gamma: float) -> None:
        super().__init__(lr)
        self.gamma = _check_float(
            self, "gamma", gamma, _is_real(gamma) and gamma > 0, "a number > 0"
        )

    def _lr(self, k: int) -> float:
        return self.lr * _pow(self, k, self.gamma, k)

    def _block(self, k0: int, n: int) -> list[float]:
        if self.gamma > 1:
            return super()._block(k0, n)
        lr, g = self.lr, self.gamma
        return [lr * g**k for k in range(k0, k0 + n)]


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

    def _block(self, k0: int, n: int) -> list[float]:
        lr, t, p, end = self.lr, self.total_iters, self.power, k0 + n
        mid = min(end, max(k0, t))  # min(t, k) is k before t, t from there on
        return [lr * (1.0 - k / t) ** p for k in range(k0, mid)] + [lr * (1.0 - t / t) ** p] * (
            end - mid
        )


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

    def _block(self, k0: int, n: int) -> list[float]:
        lo, lr, t, cos, pi = self.eta_min, self.lr, self.t_max, math.cos, math.pi
        span = lr - lo  # hoisted: the same value every time
        if lo == 0.0:  # 0.0 + x is x for the x >= 0 here
            return [span * (1 + cos(pi * k / t)) / 2 for k in range(k0, k0 + n)]
        return [lo + span * (1 + cos(pi * k / t)) / 2 for k in range(k0, k0 + n)]


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
        # Whole cycles of values by cycle length (derived, not state): a cycle's values depend
        # only on its length, so blocks slice them instead of recomputing the cosine.
        self._cycles: dict[int, list[float]] = {}

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

    def _block(self, k0: int, n: int) -> list[float]:
        out: list[float] = []
        lo, lr, cos, pi = self.eta_min, self.lr, math.cos, math.pi
        k, end = k0, k0 + n
        while k < end:
            t_cur, t_i = self._position(k)
            stop = min(end, k + t_i - t_cur)
            c0 = t_cur
            span = lr - lo
            if t_i <= _CYCLE_CACHE_MAX:
                cycle = self._cycles.get(t_i)
                if cycle is None:
                    cycle = self._cycles[t_i] = self._cycle(t_i)
                out += cycle[c0 : c0 + stop - k]
                k = stop
                continue
            if lo == 0.0:  # 0.0 + x is x for the x >= 0 here
                out += [span * (1 + cos(pi * c / t_i)) / 2 for c in range(c0, c0 + stop - k)]
            else:
                out += [lo + span * (1 + cos(pi * c / t_i)) / 2 for c in range(c0, c0 + stop - k)]
            k = stop
        return out

    def _cycle(self, t_i: int) -> list[float]:
        """All values of a cycle of length ``t_i``, by the same expressions as ``_lr``."""
        lo, lr, cos, pi = self.eta_min, self.lr, math.cos, math.pi
        span = lr - lo
        if lo == 0.0:
            return [span * (1 + cos(pi * c / t_i)) / 2 for c in range(t_i)]
        return [lo + span * (1 + cos(pi * c / t_i)) / 2 for c in range(t_i)]


_CYCLE_CACHE_MAX = 4096  # longer cycles are computed block by block


class CyclicLR(StepSizeScheduler):
    """Cyclical learning rate (torch ``CyclicLR``, Smith 2017), with its momentum cycle.

    With ``S = up + down``, ``cycle = ⌊1 + k/S⌋``, ``x = 1 + k/S − cycle``, ``r = up/S``:
    ``sf = x/r`` if ``x ≤ r`` else ``(x − 1)/(r − 1)``;
    ``lr = base_lr + (max_lr − base_lr)·sf·scale`` and
    ``momentum = max_momentum − (max_momentum − base_momentum)·sf·scale``, where scale is 1
    (triangular), ``1/2^(cycle−1)`` (triangular2) or ``gamma^k`` (exp_range). ``base_lr``
    defaults to ``lr`` (``ml.learn.rate``). ``scale_fn`` (Python API only) replaces the mode's
    scale, evaluated on ``cycle`` or ``k`` per ``scale_mode``.
    """

    def __init__(
        self,
        lr: float,
        max_lr: float,
        base_lr: float | None = None,
        step_size_up: int = 2000,
        step_size_down: int | None = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_mode: str | None = None,
        cycle_momentum: bool = True,
        base_momentum: float = 0.8,
        max_momentum: float = 0.9,
        scale_fn: Callable[[float], float] | None = None,
    ) -> None:
        if base_lr is not None:
            _check_float(
                self, "base_lr", base_lr, _is_real(base_lr) and base_lr >= 0, "a number >= 0"
            )
            lr = base_lr
        super().__init__(lr)
        self.base_lr = self.lr
        self.max_lr = _check_float(
            self, "max_lr", max_lr, _is_real(max_lr) and max_lr >= 0, "a number >= 0"
        )
        self.step_size_up = _check_int(self, "step_size_up", step_size_up, 1)
        if step_size_down is None:
            step_size_down = self.step_size_up
        self.step_size_down = _check_int(self, "step_size_down", step_size_down, 1)
        self.mode = _check_choice(self, "mode", mode, ("triangular", "triangular2", "exp_range"))
        self.gamma = _check_float(
            self, "gamma", gamma, _is_real(gamma) and gamma > 0, "a number > 0"
        )
        forced = "iterations" if self.mode == "exp_range" else "cycle"
        if scale_fn is None:
            # torch ignores scale_mode unless a custom scale_fn is given; refuse a contradiction.
            if scale_mode is not None:
                sm = _check_choice(self, "scale_mode", scale_mode, ("cycle", "iterations"))
                if sm != forced:
                    raise ParamError(
                        "CyclicLR",
                        "scale_mode",
                        scale_mode,
                        f"{forced!r} for mode={self.mode} (another scale mode needs a custom "
                        "scale_fn, Python API only)",
                    )
            self.scale_mode = forced
        else:
            if not callable(scale_fn):
                raise ParamError("CyclicLR", "scale_fn", scale_fn, "a callable")
            self.scale_mode = _check_choice(
                self, "scale_mode", scale_mode or "cycle", ("cycle", "iterations")
            )
        self.scale_fn = scale_fn
        self.cycle_momentum = _check_bool(self, "cycle_momentum", cycle_momentum)
        self.base_momentum = _check_float(
            self, "base_momentum", base_momentum, _is_real(base_momentum), "a finite number"
        )
        self.max_momentum = _check_float(
            self, "max_momentum", max_momentum, _is_real(max_momentum), "a finite number"
        )
        # As torch computes them (floats), for identical rounding.
        self._total = float(self.step_size_up) + float(self.step_size_down)
        self._ratio = float(self.step_size_up) / self._total

    def _scale(self, cycle: int, k: int) -> float:
        x = cycle if self.scale_mode == "cycle" else k
        if self.scale_fn is not None:
            return self.scale_fn(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / 2.0 ** (x - 1)
        return self.gamma**x

    def _factor(self, k: int) -> tuple[float, float]:
        cycle = math.floor(1 + k / self._total)
        x = 1.0 + k / self._total - cycle
        if x <= self._ratio:
            sf = x / self._ratio
        else:
            sf = (x - 1) / (self._ratio - 1)
        return sf, self._scale(cycle, k)

    def _lr(self, k: int) -> float:
        sf, scale = self._factor(k)
        return _finite(self, k, self.base_lr + (self.max_lr - self.base_lr) * sf * scale)

    def _block(self, k0: int, n: int) -> list[float]:
        if self.scale_fn is not None or (self.mode == "exp_range" and self.gamma > 1):
            return super()._block(k0, n)
        # _lr inlined (same expressions): no method calls per value.
        total, ratio, base, top = self._total, self._ratio, self.base_lr, self.max_lr
        mode, gamma, floor = self.mode, self.gamma, math.floor
        out = []
        for k in range(k0, k0 + n):
            cycle = floor(1 + k / total)
            x = 1.0 + k / total - cycle
            sf = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
            if mode == "triangular":
                scale = 1.0
            elif mode == "triangular2":
                scale = 1 / 2.0 ** (cycle - 1)
            else:
                scale = gamma**k
            out.append(base + (top - base) * sf * scale)
        return out

    def _momentum(self, k: int) -> float | None:
        if not self.cycle_momentum:
            return None
        sf, scale = self._factor(k)
        return self.max_momentum - (self.max_momentum - self.base_momentum) * sf * scale


class OneCycleLR(StepSizeScheduler):
    """The 1cycle policy (torch ``OneCycleLR``, Smith & Topin 2018), with its momentum cycle.

    ``initial = max_lr/div_factor``, ``min = initial/final_div_factor``; the lr anneals
    initial → max_lr over the first ``pct_start·total_steps − 1`` updates, then max_lr → min
    (three_phase: max_lr → initial, then initial → min), with cosine
    ``end + (start − end)/2·(1 + cos(π·pct))`` or linear annealing; momentum moves inversely
    between max_momentum and base_momentum. ``max_lr`` defaults to ``lr`` (``ml.learn.rate``).

    Difference from torch: torch raises ValueError once stepped past ``total_steps`` (and its
    last allowed step extrapolates beyond the final phase, negative for linear annealing); here
    every ``k ≥ total_steps − 1`` holds the final value ``min``.
    """

    def __init__(
        self,
        lr: float,
        total_steps: int,
        max_lr: float | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
    ) -> None:
        super().__init__(lr)
        if max_lr is None:
            max_lr = self.lr
        self.max_lr = _check_float(
            self, "max_lr", max_lr, _is_real(max_lr) and max_lr >= 0, "a number >= 0"
        )
        self.total_steps = _check_int(self, "total_steps", total_steps, 1)
        self.pct_start = _check_float(
            self,
            "pct_start",
            pct_start,
            _is_real(pct_start) and 0 < pct_start < 1,
            "a number in (0, 1)",
        )
        self.anneal_strategy = _check_choice(
            self, "anneal_strategy", anneal_strategy, ("cos", "linear")
        )
        self.div_factor = _check_float(
            self, "div_factor", div_factor, _is_real(div_factor) and div_factor > 0, "a number > 0"
        )
        self.final_div_factor = _check_float(
            self,
            "final_div_factor",
            final_div_factor,
            _is_real(final_div_factor) and final_div_factor > 0,
            "a number > 0",
        )
        self.three_phase = _check_bool(self, "three_phase", three_phase)
        self.cycle_momentum = _check_bool(self, "cycle_momentum", cycle_momentum)
        self.base_momentum = _check_float(
            self, "base_momentum", base_momentum, _is_real(base_momentum), "a finite number"
        )
        self.max_momentum = _check_float(
            self, "max_momentum", max_momentum, _is_real(max_momentum), "a finite number"
        )
        initial = self.max_lr / self.div_factor
        low = initial / self.final_div_factor
        t, p = self.total_steps, self.pct_start
        hi_m, lo_m = self.max_momentum, self.base_momentum
        # (end_step, start_lr, end_lr, start_momentum, end_momentum), as torch builds them.
        if self.three_phase:
            phases = [
                (float(p * t) - 1, initial, self.max_lr, hi_m, lo_m),
                (float(2 * p * t) - 2, self.max_lr, initial, lo_m, hi_m),
                (t - 1, initial, low, hi_m, hi_m),
            ]
        else:
            phases = [
                (float(p * t) - 1, initial, self.max_lr, hi_m, lo_m),
                (t - 1, self.max_lr, low, lo_m, hi_m),
            ]
        self._phases = phases
        # torch divides by each phase's length; only a first phase of length exactly 0 is ever
        # entered (at k = 0), where torch raises ZeroDivisionError.
        if phases[0][0] == 0.0:
            raise ParamError(
                "OneCycleLR",
                "pct_start",
                self.pct_start,
                f"a value with pct_start·total_steps != 1 (total_steps={t}: the warm-up phase "
                "would have length 0)",
            )

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, k: int) -> tuple[float, int]:
        step = min(k, self.total_steps - 1)
        start = 0.0
        last = len(self._phases) - 1
        for i, ph in enumerate(self._phases):
            if step <= ph[0] or i == last:
                return (step - start) / (ph[0] - start), i
            start = ph[0]
        raise AssertionError("unreachable")

    def _lr(self, k: int) -> float:
        pct, i = self._phase(k)
        ph = self._phases[i]
        return self._anneal(ph[1], ph[2], pct)

    def _block(self, k0: int, n: int) -> list[float]:
        # _lr inlined phase by phase (same expressions): no method calls per value.
        last_step = self.total_steps - 1
        end = k0 + n
        mid = min(end, max(k0, last_step))  # steps are clamped to total_steps - 1
        out: list[float] = []
        cos, pi = math.cos, math.pi
        cosine = self.anneal_strategy == "cos"
        k = k0
        while k < mid:
            _, i = self._phase(k)
            ph = self._phases[i]
            start = 0.0 if i == 0 else self._phases[i - 1][0]
            stop = mid if i == len(self._phases) - 1 else min(mid, math.floor(ph[0]) + 1)
            e, a, b = ph[0], ph[1], ph[2]
            if cosine:
                out += [
                    b + (a - b) / 2.0 * (cos(pi * ((s - start) / (e - start))) + 1)
                    for s in range(k, stop)
                ]
            else:
                out += [(b - a) * ((s - start) / (e - start)) + a for s in range(k, stop)]
            k = stop
        if end > mid:
            out += [self._lr(last_step)] * (end - mid)
        return out

    def _momentum(self, k: int) -> float | None:
        if not self.cycle_momentum:
            return None
        pct, i = self._phase(k)
        ph = self._phases[i]
        return self._anneal(ph[3], ph[4], pct)


class LambdaLR(StepSizeScheduler):
    """``lr_at(k) = b · fn(k)`` (torch ``LambdaLR``; Python API only, ``fn`` is not saved)."""

    _block_size = 1  # call the user's function lazily, once per update

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

    _block_size = 1

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


class ReduceLROnPlateau(StepSizeScheduler):
    """Reduce the step size when a metric stops improving (torch ``ReduceLROnPlateau``).

    Driven by ``step(metric)`` (e.g. the validation loss after each epoch): a metric is an
    improvement when ``a < best·(1 − threshold)`` (min, rel), ``a < best − threshold`` (min, abs),
    ``a > best·(1 + threshold)`` (max, rel) or ``a > best + threshold`` (max, abs). After more than
    ``patience`` metrics without improvement, ``lr ← max(lr·factor, min_lr)`` (if that changes it
    by more than ``eps``), then ``cooldown`` metrics are ignored. ``lr_at(k)`` is the step size in
    effect at update k given the metrics seen so far: each reduction takes effect from the update
    count at which its metric was reported. The state holds the plateau counters and the list of
    reductions (JSON-safe). In a distributed job, reduce the metric across workers first and call
    ``step`` once (one decision, broadcast with the lr).
    """

    composable = False

    def __init__(
        self,
        lr: float,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float = 0.0,
        eps: float = 1e-8,
    ) -> None:
        super().__init__(lr)
        self.mode = _check_choice(self, "mode", mode, ("min", "max"))
        self.factor = _check_float(
            self, "factor", factor, _is_real(factor) and 0 < factor < 1, "a number in (0, 1)"
        )
        self.patience = _check_int(self, "patience", patience, 0)
        self.threshold = _check_float(
            self, "threshold", threshold, _is_real(threshold) and threshold >= 0, "a number >= 0"
        )
        self.threshold_mode = _check_choice(self, "threshold_mode", threshold_mode, ("rel", "abs"))
        self.cooldown = _check_int(self, "cooldown", cooldown, 0)
        self.min_lr = _check_float(
            self, "min_lr", min_lr, _is_real(min_lr) and min_lr >= 0, "a number >= 0"
        )
        self.eps = _check_float(self, "eps", eps, _is_real(eps) and eps >= 0, "a number >= 0")
        self._reset()

    def _reset(self) -> None:
        self.best: float | None = None  # None = no metric yet (torch: ±inf)
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self.last_epoch = 0
        self._at: list[int] = [0]  # update counts where the lr changed
        self._lrs: list[float] = [self.lr]

    @property
    def current_lr(self) -> float:
        """The step size after the metrics seen so far."""
        return self._lrs[-1]

    def _is_better(self, a: float) -> bool:
        best = self.best
        if best is None:
            return True
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def step(self, metric: float) -> float:
        """Report one metric value; returns the step size in effect from now on."""
        try:
            current = float(metric)
        except (TypeError, ValueError):
            raise ValueError(f"ReduceLROnPlateau.step: metric={metric!r} is not a number") from None
        if not math.isfinite(current):
            raise ValueError(
                f"ReduceLROnPlateau.step: metric={current!r} is invalid: expected a finite number"
            )
        self.last_epoch += 1
        if self._is_better(current):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            old = self._lrs[-1]
            new = max(old * self.factor, self.min_lr)
            if old - new > self.eps:
                count = self._count
                if self._at[-1] == count:
                    self._lrs[-1] = new
                else:
                    self._at.append(count)
                    self._lrs.append(new)
                self._restart(count)  # drop the values next() computed ahead with the old lr
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        return self._lrs[-1]

    def _lr(self, k: int) -> float:
        if k >= self._at[-1]:
            return self._lrs[-1]
        return self._lrs[bisect_right(self._at, k) - 1]

    def _block(self, k0: int, n: int) -> list[float]:
        if k0 >= self._at[-1]:
            return [self._lrs[-1]] * n  # until the next reduction, which restarts next()
        return super()._block(k0, n)

    def state_dict(self) -> dict[str, Any]:
        """The count, the plateau counters and the reductions ([update, lr] pairs)."""
        return {
            "count": self._count,
            "best": self.best,
            "num_bad_epochs": self.num_bad_epochs,
            "cooldown_counter": self.cooldown_counter,
            "last_epoch": self.last_epoch,
            "changes": [[a, v] for a, v in zip(self._at, self._lrs, strict=False)],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            best = state["best"]
            changes = [(int(a), float(v)) for a, v in state["changes"]]
            self.best = None if best is None else float(best)
            self.num_bad_epochs = int(state["num_bad_epochs"])
            self.cooldown_counter = int(state["cooldown_counter"])
            self.last_epoch = int(state["last_epoch"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"ReduceLROnPlateau.load_state_dict: malformed state ({e}); expected the mapping "
                "written by state_dict()"
            ) from None
        if not changes or changes[0][0] != 0:
            raise ValueError("ReduceLROnPlateau.load_state_dict: 'changes' must start with [0, lr]")
        self._at = [a for a, _ in changes]
        self._lrs = [v for _, v in changes]
