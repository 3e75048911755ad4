"""The cyclical schedules of ``torch.optim.lr_scheduler``: ``CyclicLR`` and ``OneCycleLR``, the
two that also drive the momentum (or Adam's beta1) inversely to the step size.

Source: pytorch/pytorch, torch/optim/lr_scheduler.py. ``lr_at(k)`` is torch's lr after ``k``
calls of ``scheduler.step()``, computed in closed form from k with torch's own expressions and
operation order, so a resumed schedule is exact; ``momentum_at(k)`` likewise.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from decay.base import (
    ParamError,
    StepSizeScheduler,
    _check_bool,
    _check_choice,
    _check_float,
    _check_int,
    _finite,
    _is_real,
)

__all__ = ["CyclicLR", "OneCycleLR"]


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
        self.scale_mode = self._scale_mode(scale_mode, scale_fn)
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

    def _scale_mode(self, scale_mode: str | None, scale_fn: Callable[[float], float] | None) -> str:
        """The scale mode: fixed by the mode, unless a custom ``scale_fn`` is given."""
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
            return forced
        if not callable(scale_fn):
            raise ParamError("CyclicLR", "scale_fn", scale_fn, "a callable")
        return _check_choice(self, "scale_mode", scale_mode or "cycle", ("cycle", "iterations"))

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

    def _momentum(self, k: int) -> float | None:
        if not self.cycle_momentum:
            return None
        sf, scale = self._factor(k)
        return self.max_momentum - (self.max_momentum - self.base_momentum) * sf * scale

    def _rates(self, k: int) -> tuple[float, float | None]:
        sf, scale = self._factor(k)  # once for both
        lr = _finite(self, k, self.base_lr + (self.max_lr - self.base_lr) * sf * scale)
        if not self.cycle_momentum:
            return lr, None
        return lr, self.max_momentum - (self.max_momentum - self.base_momentum) * sf * scale


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
        self._phases = self._build_phases()
        # torch divides by each phase's length; only a first phase of length exactly 0 is ever
        # entered (at k = 0), where torch raises ZeroDivisionError.
        if self._phases[0][0] == 0.0:
            raise ParamError(
                "OneCycleLR",
                "pct_start",
                self.pct_start,
                f"a value with pct_start·total_steps != 1 (total_steps={self.total_steps}: the "
                "warm-up phase would have length 0)",
            )

    def _build_phases(self) -> list[tuple[float, float, float, float, float]]:
        """(end_step, start_lr, end_lr, start_momentum, end_momentum) per phase, as torch builds
        them (same floats, same operation order)."""
        initial = self.max_lr / self.div_factor
        low = initial / self.final_div_factor
        t, p = self.total_steps, self.pct_start
        hi_m, lo_m = self.max_momentum, self.base_momentum
        if self.three_phase:
            return [
                (float(p * t) - 1, initial, self.max_lr, hi_m, lo_m),
                (float(2 * p * t) - 2, self.max_lr, initial, lo_m, hi_m),
                (t - 1, initial, low, hi_m, hi_m),
            ]
        return [
            (float(p * t) - 1, initial, self.max_lr, hi_m, lo_m),
            (t - 1, self.max_lr, low, lo_m, hi_m),
        ]

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

    def _momentum(self, k: int) -> float | None:
        if not self.cycle_momentum:
            return None
        pct, i = self._phase(k)
        ph = self._phases[i]
        return self._anneal(ph[3], ph[4], pct)

    def _rates(self, k: int) -> tuple[float, float | None]:
        pct, i = self._phase(k)  # once for both, and the cosine once (the same operations)
        ph = self._phases[i]
        if self.anneal_strategy == "cos":
            c = math.cos(math.pi * pct) + 1
            lr = ph[2] + (ph[1] - ph[2]) / 2.0 * c
            m = ph[4] + (ph[3] - ph[4]) / 2.0 * c if self.cycle_momentum else None
            return lr, m
        lr = self._anneal(ph[1], ph[2], pct)
        return lr, self._anneal(ph[3], ph[4], pct) if self.cycle_momentum else None
