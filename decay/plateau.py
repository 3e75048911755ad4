"""``ReduceLROnPlateau`` (torch's): the one schedule driven by a metric instead of the count.

Its step sizes are still a function of the update count, given the reductions so far: each
reduction is recorded with the count at which its metric was reported, so ``lr_at(k)`` and a
resumed schedule are exact. Its state (``state_dict``) is the count, the plateau counters and the
list of reductions, JSON-safe. It cannot be a child of a sequence or a chain (it is
``metric_driven``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from typing import Any

from decay.base import StepSizeScheduler, _check_choice, _check_float, _check_int, _is_real

__all__ = ["ReduceLROnPlateau"]


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

    metric_driven = True

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
            raise ValueError(
                f"ReduceLROnPlateau.step: metric={metric!r} is not valid: expected a number"
            ) from None
        if not math.isfinite(current):
            raise ValueError(
                f"ReduceLROnPlateau.step: metric={current!r} is not valid: expected a finite number"
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
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        return self._lrs[-1]

    def _lr(self, k: int) -> float:
        if k >= self._at[-1]:
            return self._lrs[-1]
        return self._lrs[bisect_right(self._at, k) - 1]

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
