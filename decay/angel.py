"""Angel's four step-size schedulers, with Angel's counter semantics and its bugs fixed.

Source: Angel-ML/angel, angel-ps/mllib/src/main/scala/com/tencent/angel/ml/core/optimizer/decayer/
{ConstantLearningRate,StandardDecay,CorrectionDecay,WarmRestarts}.scala. In Angel, ``next()`` is
called once per update (or per epoch) and returns the step size to use; here
``lr_at(k)`` equals the value of Angel's ``(k+1)``-th ``next()`` call (n = k + 1 below).
"""

from __future__ import annotations

import math
from bisect import bisect_right

from decay.base import StepSizeScheduler, _check_float, _check_int, _is_real

__all__ = ["ConstantLearningRate", "CorrectionDecay", "StandardDecay", "WarmRestarts"]


class _Angel(StepSizeScheduler):
    """Shared by the four: ``intervals`` (``ml.opt.decay.intervals``) drives the boundary signal."""

    def __init__(self, lr: float, intervals: int = 100) -> None:
        super().__init__(lr)
        self.intervals = _check_int(self, "intervals", intervals, 1)

    def _boundary(self, count: int) -> bool:
        # Angel: `current % interval == 0`, where current counts next() calls (true at start).
        return count % self.intervals == 0


class ConstantLearningRate(_Angel):
    """Constant step size: ``lr_at(k) = lr``.

    ``is_interval_boundary()`` is true every ``intervals`` updates (Angel's validation signal).
    """

    def __init__(self, lr: float, intervals: int = 100) -> None:
        super().__init__(lr, intervals)

    def _lr(self, k: int) -> float:
        return self.lr


class StandardDecay(_Angel):
    """Inverse square-root decay: ``lr_at(k) = lr / sqrt(1 + alpha·(k+1))``.

    Angel computes ``eta/√(1+α·n)`` with a pre-incremented call number n = 1, 2, ..., so the
    first update already uses ``lr/√(1+α)`` (``lr`` itself is never returned).

    Fixed Angel bug: Angel's factory reads the deprecated ``ml.learn.decay`` (pre-filled with 0.5
    by Angel's SharedConf) instead of ``ml.opt.decay.alpha``, so α was always 0.5 and the
    documented key had no effect. Here α is ``ml.opt.decay.alpha`` (default 0.001);
    ``ml.learn.decay`` is still accepted when set explicitly, with a deprecation warning, and
    ``ml.opt.decay.alpha`` wins when both are set. To reproduce Angel's effective default, set
    ``ml.opt.decay.alpha=0.5``.
    """

    def __init__(self, lr: float, alpha: float = 0.001, intervals: int = 100) -> None:
        super().__init__(lr, intervals)
        self.alpha = _check_float(
            self, "alpha", alpha, _is_real(alpha) and alpha >= 0, "a number >= 0"
        )

    def _lr(self, k: int) -> float:
        return self.lr / math.sqrt(1.0 + self.alpha * (k + 1))


class CorrectionDecay(_Angel):
    """StandardDecay with a momentum bias correction:
    ``lr_at(k) = lr / sqrt(1 + alpha·t) · (1 − beta) / (1 − beta^t)`` with ``t = k + 1``.

    Meant for momentum SGD with ``velocity = beta·velocity + gradient`` and per-batch decay
    (``beta`` = the momentum); ``(1−β)/(1−β^t)`` is the inverse of the sum of the momentum
    weights after t updates.

    Fixed Angel bug: Angel post-increments its counter, so its first call uses t = 0 and returns
    ``(1−β)/0 = +Infinity``; with per-epoch decay the whole first epoch trained at lr = ∞. Here
    the first update uses t = 1 (Angel's sequence without its leading ∞), so ``lr_at(0)`` is
    ``lr/√(1+α)``. β must lie in [0, 1).
    """

    def __init__(
        self, lr: float, alpha: float = 0.001, beta: float = 0.001, intervals: int = 100
    ) -> None:
        super().__init__(lr, intervals)
        self.alpha = _check_float(
            self, "alpha", alpha, _is_real(alpha) and alpha >= 0, "a number >= 0"
        )
        self.beta = _check_float(
            self, "beta", beta, _is_real(beta) and 0 <= beta < 1, "a number in [0, 1)"
        )

    def _lr(self, k: int) -> float:
        t = k + 1
        return self.lr / math.sqrt(1.0 + self.alpha * t) * (1.0 - self.beta) / (1.0 - self.beta**t)


class WarmRestarts(_Angel):
    """Cosine annealing with warm restarts, as Angel's code computes it (SGDR).

    Within cycle j (j = 0, 1, ...) of length ``T_j = intervals·2^j``, at position
    c = 1 .. T_j (pre-incremented, so the cycle's first update is just below its peak and its
    last one is exactly ``eta_min``)::

        lr = eta_min + 0.5·(eta_max_j − eta_min)·(1 + cos(c/T_j·π))
        eta_max_0 = lr,  eta_max_j = eta_max_{j−1} / sqrt(1 + j·alpha)

    so each restart doubles the period and divides the peak by ``√(1 + restarts·α)``;
    ``eta_min`` never decays. ``is_interval_boundary()`` is true right after a restart (and at
    the start), as in Angel.

    Fixed Angel doc bug: Angel's documentation puts ``(1 + cos(πt/I))`` in the denominator
    (which diverges at t = I); its code, followed here, multiplies. ``eta_min`` is Angel's
    hard-coded ``lr/10`` unless ``ml.opt.decay.eta.min`` is set.
    """

    def __init__(
        self,
        lr: float,
        alpha: float = 0.001,
        intervals: int = 100,
        eta_min: float | None = None,
    ) -> None:
        super().__init__(lr, intervals)
        self.alpha = _check_float(
            self, "alpha", alpha, _is_real(alpha) and alpha >= 0, "a number >= 0"
        )
        if eta_min is None:
            self.eta_min = self.lr / 10
        else:
            self.eta_min = _check_float(
                self, "eta_min", eta_min, _is_real(eta_min) and eta_min >= 0, "a number >= 0"
            )
        # Cycles (start, length, eta_max), extended on demand; derived data, not state.
        self._starts: list[int] = [0]
        self._cycles: list[tuple[int, int, float]] = [(0, self.intervals, self.lr)]
        self._last = 0

    def _cycle(self, k: int) -> tuple[int, int, float]:
        cyc = self._cycles[self._last]
        if cyc[0] <= k < cyc[0] + cyc[1]:
            return cyc
        while self._cycles[-1][0] + self._cycles[-1][1] <= k:
            start, length, eta_max = self._cycles[-1]
            j = len(self._cycles)  # restarts so far, Angel's numRestart after this restart
            # Angel divides the running etaMax, so replay the same floating-point sequence.
            nxt = (start + length, length * 2, eta_max / math.sqrt(1.0 + j * self.alpha))
            self._cycles.append(nxt)
            self._starts.append(nxt[0])
        self._last = bisect_right(self._starts, k) - 1
        return self._cycles[self._last]

    def _lr(self, k: int) -> float:
        start, length, eta_max = self._cycle(k)
        c = k - start + 1
        return self.eta_min + 0.5 * (eta_max - self.eta_min) * (1 + math.cos(c / length * math.pi))

    def _boundary(self, count: int) -> bool:
        # Angel resets its position to 0 after the last update of a cycle: count = I·(2^j − 1).
        if count % self.intervals:
            return False
        m = count // self.intervals + 1
        return m & (m - 1) == 0
