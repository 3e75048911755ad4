"""The six built-in optimizers (formulas: :mod:`angelps.optim`), each one class.

Notation: ``η`` the pushed step size, ``λ1``/``λ2`` = ``ml.reg.l1``/``ml.reg.l2``,
``g' = g + λ2·w``. Momentum and Adam apply no L1 (as Angel).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

from angelps.optimizers.base import Array, Ops, Optimizer, soft_threshold
from angelps.table import OptimizerSpec

__all__ = ["BUILTIN", "FTRL", "SGD", "AdaGrad", "Adam", "Momentum", "RMSProp"]


def _with_l2(xp: Ops, spec: OptimizerSpec, w: Array, g: Array) -> Array:
    s = xp.scalar(w)
    return g + s(spec.l2) * w if spec.l2 else g


class SGD(Optimizer):
    """Angel's proximal PGD (``PGDUpdateFunc``) with sign, not Angel's sin, in the L1 step:
    ``η' = η/(1+λ2η)``; ``w ← w(1−η'λ2) − η'g``; ``w ← sign(w)·max(0, |w|−η'λ1)``."""

    name, display = "sgd", "SGD"
    reads: ClassVar[tuple[str, ...] | None] = ("l1", "l2")

    def update(
        self,
        xp: Ops,
        spec: OptimizerSpec,
        w: Array,
        state: Mapping[str, Array],
        g: Array,
        lr: float,
        momentum: float | None = None,
    ) -> None:
        s = xp.scalar(w)
        eta = s(lr / (1.0 + spec.l2 * lr))
        if spec.l2:
            w *= s(1.0) - eta * s(spec.l2)
        w -= eta * g
        if spec.l1:
            soft_threshold(xp, w, eta * s(spec.l1))

    def dense_spec(self, spec: OptimizerSpec) -> OptimizerSpec:
        # torch.optim.SGD on the workers: momentum with factor 0 (λ2 as weight decay).
        return replace(spec, name="momentum", momentum=0.0)


class Momentum(Optimizer):
    """torch.optim.SGD(momentum=m, weight_decay=λ2): ``v ← m·v + g'``; ``w ← w − η·v``."""

    name, display = "momentum", "Momentum"
    reads: ClassVar[tuple[str, ...] | None] = ("momentum", "l2")
    slots: ClassVar[Mapping[str, int | None]] = {"v": None}
    torch_slots: ClassVar[Mapping[str, str]] = {"momentum_buffer": "v"}
    has_momentum = True

    def update(
        self,
        xp: Ops,
        spec: OptimizerSpec,
        w: Array,
        state: Mapping[str, Array],
        g: Array,
        lr: float,
        momentum: float | None = None,
    ) -> None:
        s = xp.scalar(w)
        v = state["v"]
        v *= s(spec.momentum if momentum is None else momentum)
        v += _with_l2(xp, spec, w, g)
        w -= s(lr) * v


class Adam(Optimizer):
    """torch.optim.Adam(betas=(β1, β2), eps, weight_decay=λ2), bias-corrected with the row's own
    update count ``t`` (lazy Adam; equals Adam when every row is updated each step):
    ``m ← β1m+(1−β1)g'``; ``v ← β2v+(1−β2)g'²``; ``w ← w − η·(m/(1−β1^t)) / (√(v/(1−β2^t)) + ε)``.
    """

    name, display = "adam", "Adam"
    reads: ClassVar[tuple[str, ...] | None] = ("beta1", "beta2", "eps", "l2")
    slots: ClassVar[Mapping[str, int | None]] = {"m": None, "v": None, "t": 1}
    torch_slots: ClassVar[Mapping[str, str]] = {"exp_avg": "m", "exp_avg_sq": "v", "step": "t"}
    has_momentum = True

    def update(
        self,
        xp: Ops,
        spec: OptimizerSpec,
        w: Array,
        state: Mapping[str, Array],
        g: Array,
        lr: float,
        momentum: float | None = None,
    ) -> None:
        s = xp.scalar(w)
        gp = _with_l2(xp, spec, w, g)
        beta1 = spec.beta1 if momentum is None else momentum
        m, v, t = state["m"], state["v"], state["t"]
        b1, b2 = s(beta1), s(spec.beta2)
        # 1 - β in float64, then in the rows' dtype: float32's 1 - 0.999 is off by 1.3e-5 (the
        # numpy path then drifted from the torch path, and from torch.optim, by that much).
        m *= b1
        m += s(1.0 - beta1) * gp
        v *= b2
        v += s(1.0 - spec.beta2) * gp * gp
        t += s(1.0)
        # Bias corrections in float64: 1 - b^t loses digits in float32 for large t.
        # The same order of operations as torch.optim.Adam:
        # denom = sqrt(v)/sqrt(bc2) + eps; w -= (lr/bc1) * m/denom.
        tt = xp.f64(t)
        step_size = xp.like(lr / (1.0 - beta1**tt), w)
        bc2_sqrt = xp.like(xp.sqrt(1.0 - spec.beta2**tt), w)
        denom = xp.sqrt(v) / bc2_sqrt + s(spec.eps)
        w -= step_size * (m / denom)


class _Scaled(Optimizer):
    """``w ← w − η·g'/(√n+ε)`` after the subclass's update of ``n``; then the L1 threshold
    ``η·λ1/(√n+ε)``."""

    slots: ClassVar[Mapping[str, int | None]] = {"n": None}

    @abstractmethod
    def accumulate(self, xp: Ops, spec: OptimizerSpec, n: Array, gp: Array) -> None:
        """Update the squared-gradient state ``n`` in place from ``g'``."""

    def update(
        self,
        xp: Ops,
        spec: OptimizerSpec,
        w: Array,
        state: Mapping[str, Array],
        g: Array,
        lr: float,
        momentum: float | None = None,
    ) -> None:
        s = xp.scalar(w)
        gp = _with_l2(xp, spec, w, g)
        n = state["n"]
        self.accumulate(xp, spec, n, gp)
        denom = xp.sqrt(n) + s(spec.eps)
        w -= s(lr) * gp / denom
        if spec.l1:
            soft_threshold(xp, w, s(lr) * s(spec.l1) / denom)


class AdaGrad(_Scaled):
    """torch.optim.Adagrad(eps, weight_decay=λ2): ``n ← n + g'²``; ``w ← w − η·g'/(√n+ε)``;
    then the L1 threshold ``η·λ1/(√n+ε)``."""

    name, display = "adagrad", "AdaGrad"
    reads: ClassVar[tuple[str, ...] | None] = ("eps", "l1", "l2")
    torch_slots: ClassVar[Mapping[str, str]] = {"sum": "n"}

    def accumulate(self, xp: Ops, spec: OptimizerSpec, n: Array, gp: Array) -> None:
        n += gp * gp


class RMSProp(_Scaled):
    """What Angel calls AdaGrad; torch.optim.RMSprop(alpha=ρ, eps, weight_decay=λ2):
    ``n ← ρn + (1−ρ)g'²``; ``w ← w − η·g'/(√n+ε)``; then the L1 threshold ``η·λ1/(√n+ε)``.
    (Angel adds λ2w after the n update and has no ε, giving 0/0 where n = 0.)"""

    name, display = "rmsprop", "RMSProp"
    reads: ClassVar[tuple[str, ...] | None] = ("rho", "eps", "l1", "l2")
    torch_slots: ClassVar[Mapping[str, str]] = {"square_avg": "n"}

    def accumulate(self, xp: Ops, spec: OptimizerSpec, n: Array, gp: Array) -> None:
        s = xp.scalar(n)
        n *= s(spec.rho)
        n += s(1.0 - spec.rho) * gp * gp  # 1 - ρ in float64 first, as Adam's 1 - β


class FTRL(Optimizer):
    """FTRL-Proximal (McMahan et al. 2013; Angel's ``FTRLUpdateFunc``), per coordinate:
    ``σ = (√(n+g²)−√n)/α``; ``z ← z + g − σw``; ``n ← n + g²``;
    ``w = 0`` if ``|z| ≤ λ1`` else ``−(z − sign(z)λ1) / (λ2 + (β+√n)/α)``.
    As in Angel, α (``ml.opt.ftrl.alpha``) is the rate and the pushed η is not used."""

    name, display = "ftrl", "FTRL"
    reads: ClassVar[tuple[str, ...] | None] = ("ftrl_alpha", "ftrl_beta", "l1", "l2")
    slots: ClassVar[Mapping[str, int | None]] = {"z": None, "n": None}
    not_for_dense = "FTRL ignores the step size"

    def update(
        self,
        xp: Ops,
        spec: OptimizerSpec,
        w: Array,
        state: Mapping[str, Array],
        g: Array,
        lr: float,
        momentum: float | None = None,
    ) -> None:
        s = xp.scalar(w)
        l1, l2 = s(spec.l1), s(spec.l2)
        alpha, beta = s(spec.ftrl_alpha), s(spec.ftrl_beta)
        z, n = state["z"], state["n"]
        n_new = n + g * g
        sigma = (xp.sqrt(n_new) - xp.sqrt(n)) / alpha
        z += g - sigma * w
        n[...] = n_new
        denom = l2 + (beta + xp.sqrt(n)) / alpha
        w[...] = xp.where(abs(z) <= l1, s(0.0), -(z - xp.sign(z) * l1) / denom)


#: The built-in optimizers, registered by :mod:`angelps.optimizers.registry`.
BUILTIN: tuple[Optimizer, ...] = (SGD(), Momentum(), Adam(), AdaGrad(), RMSProp(), FTRL())
