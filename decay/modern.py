"""LLM-style schedules with KempnerForge's semantics: a shared linear warmup from 0, a decay to
``min_lr_ratio·lr``, flat after the end.

Source: KempnerInstitute/KempnerForge, kempnerforge/training/scheduler.py (every schedule there
is a ``LambdaLR`` multiplier of the initial lr). With W = warmup_steps, the warmup factor is
``k/W`` for k < W (0 at k = 0: the first update has step size 0, as in KempnerForge, torch's
``SequentialLR(LinearLR, ...)`` and Hugging Face). The decay length is ``D = decay_steps``, or
``total_steps − W`` (``− stable_steps`` for WSD) when decay_steps is not set; the learner fills
``total_steps`` from epochs × updates per epoch. Progress in the decay is ``p = min(1, (k − W)/D)``.
"""

from __future__ import annotations

import math

from decay.base import (
    ParamError,
    StepSizeScheduler,
    _check_choice,
    _check_float,
    _check_int,
    _is_real,
)

__all__ = [
    "InverseSqrt",
    "NoDecay",
    "Rex",
    "WarmupConstant",
    "WarmupCosine",
    "WarmupLinear",
    "WarmupStableDecay",
]


class _Warmed(StepSizeScheduler):
    """Warmup factor ``k/W`` for k < W, then ``_decay(k − W)``."""

    def __init__(self, lr: float, warmup_steps: int) -> None:
        super().__init__(lr)
        self.warmup_steps = _check_int(self, "warmup_steps", warmup_steps, 0)

    def _lr(self, k: int) -> float:
        w = self.warmup_steps
        if k < w:
            return self.lr * (k / w)
        return self.lr * self._decay(k - w)

    def _decay(self, s: int) -> float:
        raise NotImplementedError

    def phases(self) -> list[tuple[int, str]]:
        w = self.warmup_steps
        return [(w, "the end of its warmup")] if w > 0 else []


def _ratio(owner: StepSizeScheduler, value: float) -> float:
    return _check_float(
        owner, "min_lr_ratio", value, _is_real(value) and 0 <= value <= 1, "a number in [0, 1]"
    )


def _decay_length(
    owner: StepSizeScheduler,
    decay_steps: int | None,
    total_steps: int | None,
    before: int,
    before_what: str,
) -> int:
    """D = decay_steps, else total_steps − (warmup [+ stable]); must be >= 1."""
    if decay_steps is not None:
        return _check_int(owner, "decay_steps", decay_steps, 1)
    if total_steps is None:
        raise ParamError(
            type(owner).__name__,
            "decay_steps",
            None,
            "set decay_steps, or total_steps (the learner fills total_steps from "
            "epochs × updates per epoch)",
        )
    total = _check_int(owner, "total_steps", total_steps, 1)
    if total - before < 1:
        raise ParamError(
            type(owner).__name__,
            "total_steps",
            total,
            f"an integer > {before_what} = {before}, so that the decay has at least one step "
            "(or set decay_steps)",
        )
    return total - before


class _WarmupDecay(_Warmed):
    """Warmup over W, then a decay over D = decay_steps (else total_steps − W) to the floor
    ``r = min_lr_ratio``; the subclass gives the decay's shape as ``_decay(s)``."""

    def __init__(
        self,
        lr: float,
        total_steps: int | None = None,
        warmup_steps: int = 2000,
        decay_steps: int | None = None,
        min_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__(lr, warmup_steps)
        self.min_lr_ratio = _ratio(self, min_lr_ratio)
        self.total_steps = total_steps
        self.decay_steps = decay_steps
        self._d = _decay_length(self, decay_steps, total_steps, self.warmup_steps, "warmup_steps")


class WarmupCosine(_WarmupDecay):
    """Linear warmup, then cosine to the floor:
    ``r + ½(1 − r)(1 + cos(π·p))``, r = min_lr_ratio; flat at ``r·lr`` after the decay."""

    def _decay(self, s: int) -> float:
        p = min(1.0, s / self._d)
        r = self.min_lr_ratio
        return r + 0.5 * (1 - r) * (1 + math.cos(math.pi * p))


class WarmupLinear(_WarmupDecay):
    """Linear warmup, then linear decay ``1 − (1 − r)·p`` to ``r·lr``; flat afterwards."""

    def _decay(self, s: int) -> float:
        return 1 - (1 - self.min_lr_ratio) * min(1.0, s / self._d)


class WarmupConstant(_Warmed):
    """Linear warmup, then constant ``lr``."""

    def __init__(self, lr: float, warmup_steps: int = 2000) -> None:
        super().__init__(lr, warmup_steps)

    def _decay(self, s: int) -> float:
        return 1.0


class WarmupStableDecay(_Warmed):
    """Warmup-Stable-Decay (WSD): linear warmup over W, factor 1 for ``stable_steps`` S, then a
    cooldown over D to ``r = min_lr_ratio``: cosine ``r + ½(1−r)(1 + cos πp)``, linear
    ``1 − (1−r)p`` or sqrt ``r + (1−r)·√(1−p)`` (KempnerForge's sqrt; Hugging Face's ``1-sqrt``
    is ``1 − √p``, another shape). D = decay_steps, else total_steps − W − S; S = stable_steps,
    else total_steps − W − D."""

    def __init__(
        self,
        lr: float,
        total_steps: int | None = None,
        warmup_steps: int = 2000,
        stable_steps: int | None = None,
        decay_steps: int | None = None,
        min_lr_ratio: float = 0.1,
        decay_type: str = "cosine",
    ) -> None:
        super().__init__(lr, warmup_steps)
        self.min_lr_ratio = _ratio(self, min_lr_ratio)
        self.decay_type = _check_choice(
            self, "decay_type", decay_type, ("cosine", "linear", "sqrt")
        )
        self.total_steps = total_steps
        self.stable_steps = stable_steps
        self.decay_steps = decay_steps
        w = self.warmup_steps
        if stable_steps is not None:
            self._s = _check_int(self, "stable_steps", stable_steps, 0)
            self._d = _decay_length(
                self, decay_steps, total_steps, w + self._s, "warmup_steps + stable_steps"
            )
        elif decay_steps is not None and total_steps is not None:
            self._d = _check_int(self, "decay_steps", decay_steps, 1)
            total = _check_int(self, "total_steps", total_steps, 1)
            if total - w - self._d < 0:
                raise ParamError(
                    "WarmupStableDecay",
                    "total_steps",
                    total,
                    f"an integer >= warmup_steps + decay_steps = {w + self._d} "
                    "(or set stable_steps)",
                )
            self._s = total - w - self._d
        else:
            raise ParamError(
                "WarmupStableDecay",
                "stable_steps",
                None,
                "set stable_steps (with decay_steps or total_steps), or decay_steps and "
                "total_steps",
            )

    def phases(self) -> list[tuple[int, str]]:
        return [*super().phases(), (self.warmup_steps + self._s, "the start of its cooldown")]

    def _decay(self, s: int) -> float:
        if s < self._s:
            return 1.0
        p = min(1.0, (s - self._s) / self._d)
        r = self.min_lr_ratio
        if self.decay_type == "cosine":
            return r + 0.5 * (1 - r) * (1 + math.cos(math.pi * p))
        if self.decay_type == "linear":
            return 1 - (1 - r) * p
        return r + (1 - r) * math.sqrt(1 - p)


class Rex(_WarmupDecay):
    """Linear warmup, then polynomial decay clamped at the floor:
    ``max(r, (1 − p)^rex_alpha)`` (KempnerForge's ``rex``; a clamp, not an affine floor)."""

    def __init__(
        self,
        lr: float,
        total_steps: int | None = None,
        warmup_steps: int = 2000,
        decay_steps: int | None = None,
        min_lr_ratio: float = 0.1,
        rex_alpha: float = 1.0,
    ) -> None:
        super().__init__(lr, total_steps, warmup_steps, decay_steps, min_lr_ratio)
        self.rex_alpha = _check_float(
            self, "rex_alpha", rex_alpha, _is_real(rex_alpha) and rex_alpha > 0, "a number > 0"
        )

    def _decay(self, s: int) -> float:
        p = min(1.0, s / self._d)
        return max(self.min_lr_ratio, (1 - p) ** self.rex_alpha)


class InverseSqrt(_Warmed):
    """Linear warmup, then ``max(r, 1/√((k − W + timescale)/timescale))`` (Hugging Face's
    ``inverse_sqrt``; timescale defaults to W, or 10000 when W = 0). With W = 0 it is Angel's
    StandardDecay with α = 1/timescale shifted by one update. r = min_lr_ratio (default 0)."""

    def __init__(
        self,
        lr: float,
        warmup_steps: int = 2000,
        timescale: float | None = None,
        min_lr_ratio: float = 0.0,
    ) -> None:
        super().__init__(lr, warmup_steps)
        if timescale is None:
            timescale = self.warmup_steps or 10_000
        self.timescale = _check_float(
            self, "timescale", timescale, _is_real(timescale) and timescale > 0, "a number > 0"
        )
        self.min_lr_ratio = _ratio(self, min_lr_ratio)

    def _decay(self, s: int) -> float:
        return max(self.min_lr_ratio, 1.0 / math.sqrt((s + self.timescale) / self.timescale))


class NoDecay(StepSizeScheduler):
    """Constant ``lr``, no warmup (KempnerForge's ``none``, for schedule-free optimizers)."""

    def __init__(self, lr: float) -> None:
        super().__init__(lr)

    def _lr(self, k: int) -> float:
        return self.lr
