"""The optimizer math, written once: ``apply(spec, w, state, g, lr)`` on rows or parameters.

``w`` is ``[k, cols]`` (the rows being updated), ``g`` the summed gradient of those rows (the
global-batch mean when workers pre-scale by 1/W), ``state`` the optimizer slots of the same rows
(see :func:`slot_widths`), all updated in place; no Python loop over keys. Notation: ``η`` the
pushed step size, ``λ1``/``λ2`` = ``ml.reg.l1``/``ml.reg.l2``, ``g' = g + λ2·w``.

=========  ==================================================================================
sgd        Angel's proximal PGD (``PGDUpdateFunc``) with sign, not Angel's sin, in the L1 step:
           ``η' = η/(1+λ2η)``; ``w ← w(1−η'λ2) − η'g``; ``w ← sign(w)·max(0, |w|−η'λ1)``.
momentum   torch.optim.SGD(momentum=m, weight_decay=λ2): ``v ← m·v + g'``; ``w ← w − η·v``.
adam       torch.optim.Adam(betas=(β1, β2), eps, weight_decay=λ2), bias-corrected with the
           row's own update count ``t`` (lazy Adam; equals Adam when every row is updated each
           step): ``m ← β1m+(1−β1)g'``; ``v ← β2v+(1−β2)g'²``;
           ``w ← w − η·(m/(1−β1^t)) / (√(v/(1−β2^t)) + ε)``.
adagrad    torch.optim.Adagrad(eps, weight_decay=λ2): ``n ← n + g'²``; ``w ← w − η·g'/(√n+ε)``;
           then L1 threshold ``η·λ1/(√n+ε)``.
rmsprop    What Angel calls AdaGrad; torch.optim.RMSprop(alpha=ρ, eps, weight_decay=λ2):
           ``n ← ρn + (1−ρ)g'²``; ``w ← w − η·g'/(√n+ε)``; then L1 threshold ``η·λ1/(√n+ε)``.
           (Angel adds λ2w after the n update and has no ε, giving 0/0 where n = 0.)
ftrl       FTRL-Proximal (McMahan et al. 2013; Angel's ``FTRLUpdateFunc``), per coordinate:
           ``σ = (√(n+g²)−√n)/α``; ``z ← z + g − σw``; ``n ← n + g²``;
           ``w = 0`` if ``|z| ≤ λ1`` else ``−(z − sign(z)λ1) / (λ2 + (β+√n)/α)``.
           As in Angel, α (``ml.opt.ftrl.alpha``) is the rate and the pushed η is not used.
=========  ==================================================================================

Momentum and Adam apply no L1 (as Angel). ``momentum`` (an argument of :func:`apply`, from a
schedule that cycles it: torch's CyclicLR and OneCycleLR) replaces ``m`` of momentum and ``β1`` of
adam for that update, as those schedulers write ``momentum``/``betas[0]`` into torch's
optimizer before each step (Adam's bias correction then uses the new ``β1``: ``1−β1^t``).

Each formula exists once (:func:`_update`), written over a small array namespace, and runs on
numpy arrays (the shards' host rows), on torch tensors of any device (GPU shards) and, through
:class:`DenseOptimizer`, on the workers' dense layers. The numpy path computes its scalars in the
rows' dtype and the torch path in float64 (as torch does with Python scalars); the two agree to
float rounding. torch is imported only when a torch path runs: a CPU shard never loads it,
which saves its process 1-3 s of start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from angelconf.config import ConfigError
from angelps.table import OptimizerSpec

if TYPE_CHECKING:
    import torch

__all__ = ["DenseOptimizer", "apply", "slot_widths"]

# Slot name -> width (None = the table's cols).
_SLOTS: dict[str, dict[str, int | None]] = {
    "sgd": {},
    "momentum": {"v": None},
    "adam": {"m": None, "v": None, "t": 1},
    "adagrad": {"n": None},
    "rmsprop": {"n": None},
    "ftrl": {"z": None, "n": None},
}

Array = Any  # np.ndarray or torch.Tensor: the formulas below use what both support


def slot_widths(spec: OptimizerSpec, cols: int) -> dict[str, int]:
    """Optimizer state slots of one row: name -> width. Slots start at zero."""
    return {k: (cols if w is None else w) for k, w in _SLOTS[spec.name].items()}


class _Ops:
    """The few functions the formulas need that numpy and torch spell differently."""

    def __init__(
        self,
        scalar: Callable[[Array], Callable[[float], Any]],
        sqrt: Callable[[Array], Array],
        sign: Callable[[Array], Array],
        where: Callable[[Array, Any, Array], Array],
        clamp0: Callable[[Array], Array],
        f64: Callable[[Array], Array],
        like: Callable[[Array, Array], Array],
    ) -> None:
        self.scalar = scalar  # the type a formula's scalars are computed in
        self.sqrt = sqrt
        self.sign = sign
        self.where = where
        self.clamp0 = clamp0  # max(x, 0)
        self.f64 = f64
        self.like = like  # cast to the dtype of the second argument


_NUMPY = _Ops(
    scalar=lambda w: w.dtype.type,
    sqrt=np.sqrt,
    sign=np.sign,
    where=np.where,
    clamp0=lambda x: np.maximum(x, 0.0),
    f64=lambda x: x.astype(np.float64),
    like=lambda x, w: x.astype(w.dtype),
)


@lru_cache(maxsize=1)
def _torch_ops() -> _Ops:
    import torch

    return _Ops(
        scalar=lambda w: float,
        sqrt=torch.sqrt,
        sign=torch.sign,
        where=torch.where,
        clamp0=lambda x: torch.clamp(x, min=0.0),
        f64=lambda x: x.double(),
        like=lambda x, w: x.to(w.dtype),
    )


def apply(
    spec: OptimizerSpec,
    w: Array,
    state: Mapping[str, Array],
    g: Array,
    lr: float,
    momentum: float | None = None,
) -> None:
    """One optimizer update of the rows ``w`` (in place, with their ``state`` slots) with
    gradient ``g`` and step size ``lr``. numpy arrays, or torch tensors on any one device.
    ``momentum``: this update's momentum (β1 of adam) in place of the spec's; None keeps it."""
    xp = _NUMPY if isinstance(w, np.ndarray) else _torch_ops()
    _update(xp, spec, w, state, g, lr, momentum)


def _soft_threshold(xp: _Ops, w: Array, thr: Any) -> None:
    w[...] = xp.sign(w) * xp.clamp0(abs(w) - thr)


def _update(
    xp: _Ops,
    spec: OptimizerSpec,
    w: Array,
    state: Mapping[str, Array],
    g: Array,
    lr: float,
    momentum: float | None = None,
) -> None:
    """The formulas of the module docstring."""
    name = spec.name
    s = xp.scalar(w)
    lr_ = s(lr)
    l1, l2 = s(spec.l1), s(spec.l2)
    if name == "sgd":
        eta = s(lr / (1.0 + spec.l2 * lr))
        if spec.l2:
            w *= s(1.0) - eta * l2
        w -= eta * g
        if spec.l1:
            _soft_threshold(xp, w, eta * l1)
        return
    if name == "ftrl":
        alpha, beta = s(spec.ftrl_alpha), s(spec.ftrl_beta)
        z, n = state["z"], state["n"]
        n_new = n + g * g
        sigma = (xp.sqrt(n_new) - xp.sqrt(n)) / alpha
        z += g - sigma * w
        n[...] = n_new
        denom = l2 + (beta + xp.sqrt(n)) / alpha
        w[...] = xp.where(abs(z) <= l1, s(0.0), -(z - xp.sign(z) * l1) / denom)
        return
    gp = g + l2 * w if spec.l2 else g
    if name == "momentum":
        v = state["v"]
        v *= s(spec.momentum if momentum is None else momentum)
        v += gp
        w -= lr_ * v
        return
    if name == "adam":
        _adam(xp, spec, w, state, gp, lr, spec.beta1 if momentum is None else momentum)
        return
    n = state["n"]
    if name == "adagrad":
        n += gp * gp
    elif name == "rmsprop":
        rho = s(spec.rho)
        n *= rho
        n += (s(1.0) - rho) * gp * gp
    else:  # pragma: no cover - OptimizerSpec validates names
        raise ValueError(f"unknown optimizer {name!r}")
    denom = xp.sqrt(n) + s(spec.eps)
    w -= lr_ * gp / denom
    if spec.l1:
        _soft_threshold(xp, w, lr_ * l1 / denom)


def _adam(
    xp: _Ops,
    spec: OptimizerSpec,
    w: Array,
    state: Mapping[str, Array],
    gp: Array,
    lr: float,
    beta1: float,
) -> None:
    s = xp.scalar(w)
    m, v, t = state["m"], state["v"], state["t"]
    b1, b2 = s(beta1), s(spec.beta2)
    m *= b1
    m += (s(1.0) - b1) * gp
    v *= b2
    v += (s(1.0) - b2) * gp * gp
    t += s(1.0)
    # Bias corrections in float64: 1 - b^t loses digits in float32 for large t.
    # The same order of operations as torch.optim.Adam:
    # denom = sqrt(v)/sqrt(bc2) + eps; w -= (lr/bc1) * m/denom.
    tt = xp.f64(t)
    step_size = xp.like(lr / (1.0 - beta1**tt), w)
    bc2_sqrt = xp.like(xp.sqrt(1.0 - spec.beta2**tt), w)
    denom = xp.sqrt(v) / bc2_sqrt + s(spec.eps)
    w -= step_size * (m / denom)


class DenseOptimizer:
    """The workers' optimizer of dense layers: :func:`apply` on each parameter (one row of
    ``numel`` columns, so Adam's step count is per parameter as in torch.optim).

    Dense layers follow torch.optim's semantics, as they always have: ``ml.reg.l2`` is weight
    decay and ``ml.reg.l1`` is not applied, so ``sgd`` runs as momentum with factor 0
    (torch.optim.SGD); FTRL, which ignores the step size, is refused. ``state_dict`` /
    ``load_state_dict`` mirror torch.optim's shape (``state``: parameter index -> slot ->
    tensor; ``param_groups``: one group with the last ``lr``) for the worker's checkpoints.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], spec: OptimizerSpec) -> None:
        import torch

        if spec.name == "ftrl":
            raise ConfigError(
                f"ml.fclayer.optimizer={spec.name} cannot run on the workers (valid for "
                "worker-side dense layers: SGD, Momentum, Adam, AdaGrad, RMSProp)"
            )
        spec = replace(spec, l1=0.0)
        # A schedule's momentum applies to momentum and adam only (plain SGD has none to cycle).
        self.cycles = spec.name in ("momentum", "adam")
        if spec.name == "sgd":
            spec = replace(spec, name="momentum", momentum=0.0)
        self.spec = spec
        self.params = list(params)
        self.param_groups: list[dict[str, Any]] = [{"lr": 0.0}]
        self.state: list[dict[str, torch.Tensor]] = [
            {
                k: torch.zeros((1, width), dtype=p.dtype, device=p.device)
                for k, width in slot_widths(spec, p.numel()).items()
            }
            for p in self.params
        ]

    def step(self, lr: float, momentum: float | None = None) -> None:
        """Update every parameter that has a gradient with step size ``lr`` (and ``momentum``,
        β1 of adam, when a schedule drives it; None: the configured one)."""
        import torch

        self.param_groups[0]["lr"] = lr
        with torch.no_grad():
            for p, st in zip(self.params, self.state, strict=True):
                if p.grad is not None:
                    g = p.grad.view(1, -1)
                    apply(self.spec, p.view(1, -1), st, g, lr, momentum if self.cycles else None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {
            "state": {i: dict(st) for i, st in enumerate(self.state)},
            "param_groups": [dict(g) for g in self.param_groups],
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (slots missing from ``sd`` stay at zero). Worker
        checkpoints written with torch.optim name the slots as torch does; those load too."""
        import torch

        for i, st in sd["state"].items():
            slots = self.state[int(i)]
            for k, v in st.items():
                name = k if k in slots else _TORCH_SLOTS.get(k)
                if name in slots and v is not None:
                    slots[name].copy_(torch.as_tensor(v).reshape(1, -1))
        self.param_groups = [dict(g) for g in sd["param_groups"]]


# torch.optim's state names of the same slots (SGD, Adam, Adagrad, RMSprop).
_TORCH_SLOTS = {
    "momentum_buffer": "v",
    "exp_avg": "m",
    "exp_avg_sq": "v",
    "step": "t",
    "sum": "n",
    "square_avg": "n",
}
