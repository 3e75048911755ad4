"""Vectorized server-side optimizers: ``apply(spec, w, state, g, lr)`` on gathered rows.

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

Momentum and Adam apply no L1 (as Angel).
"""

from __future__ import annotations

import numpy as np
import torch

from angelps.table import OptimizerSpec

__all__ = ["apply", "apply_torch", "slot_widths"]

# Slot name -> width (None = the table's cols).
_SLOTS: dict[str, dict[str, int | None]] = {
    "sgd": {},
    "momentum": {"v": None},
    "adam": {"m": None, "v": None, "t": 1},
    "adagrad": {"n": None},
    "rmsprop": {"n": None},
    "ftrl": {"z": None, "n": None},
}


def slot_widths(spec: OptimizerSpec, cols: int) -> dict[str, int]:
    """Optimizer state slots of one row: name -> width. Slots start at zero."""
    return {k: (cols if w is None else w) for k, w in _SLOTS[spec.name].items()}


def _soft_threshold(w: np.ndarray, thr: np.ndarray | float) -> None:
    np.copyto(w, np.sign(w) * np.maximum(np.abs(w) - thr, 0.0).astype(w.dtype, copy=False))


def apply(
    spec: OptimizerSpec,
    w: np.ndarray,
    state: dict[str, np.ndarray],
    g: np.ndarray,
    lr: float,
) -> None:
    """One optimizer update of the rows ``w`` (in place) with gradient ``g`` and step size ``lr``."""
    name = spec.name
    dt = w.dtype.type
    lr_ = dt(lr)
    l1, l2 = dt(spec.l1), dt(spec.l2)
    if name == "sgd":
        eta = dt(lr / (1.0 + spec.l2 * lr))
        if spec.l2:
            w *= dt(1.0) - eta * l2
        w -= eta * g
        if spec.l1:
            _soft_threshold(w, eta * l1)
        return
    if name == "ftrl":
        alpha, beta = dt(spec.ftrl_alpha), dt(spec.ftrl_beta)
        z, n = state["z"], state["n"]
        n_new = n + g * g
        sigma = (np.sqrt(n_new) - np.sqrt(n)) / alpha
        z += g - sigma * w
        np.copyto(n, n_new)
        denom = l2 + (beta + np.sqrt(n)) / alpha
        w[...] = np.where(np.abs(z) <= l1, dt(0.0), -(z - np.sign(z) * l1) / denom)
        return
    gp = g + l2 * w if spec.l2 else g
    if name == "momentum":
        v = state["v"]
        v *= dt(spec.momentum)
        v += gp
        w -= lr_ * v
        return
    if name == "adam":
        m, v, t = state["m"], state["v"], state["t"]
        b1, b2 = dt(spec.beta1), dt(spec.beta2)
        m *= b1
        m += (dt(1.0) - b1) * gp
        v *= b2
        v += (dt(1.0) - b2) * gp * gp
        t += dt(1.0)
        # Bias corrections in float64: 1 - b^t loses digits in float32 for large t.
        # The same order of operations as torch.optim.Adam:
        # denom = sqrt(v)/sqrt(bc2) + eps; w -= (lr/bc1) * m/denom.
        tt = t.astype(np.float64)
        step_size = (lr / (1.0 - spec.beta1**tt)).astype(w.dtype)
        bc2_sqrt = np.sqrt(1.0 - spec.beta2**tt).astype(w.dtype)
        denom = np.sqrt(v) / bc2_sqrt + dt(spec.eps)
        w -= step_size * (m / denom)
        return
    n = state["n"]
    if name == "adagrad":
        n += gp * gp
    elif name == "rmsprop":
        rho = dt(spec.rho)
        n *= rho
        n += (dt(1.0) - rho) * gp * gp
    else:  # pragma: no cover - OptimizerSpec validates names
        raise ValueError(f"unknown optimizer {name!r}")
    denom = np.sqrt(n) + dt(spec.eps)
    w -= lr_ * gp / denom
    if spec.l1:
        _soft_threshold(w, lr_ * l1 / denom)


def apply_torch(
    spec: OptimizerSpec,
    w: torch.Tensor,
    state: dict[str, torch.Tensor],
    g: torch.Tensor,
    lr: float,
) -> None:
    """:func:`apply` on torch tensors (any device: shards with ``angel.ps.gpus > 0`` keep their
    rows on CUDA). Same formulas, same order of operations."""
    name = spec.name
    l1, l2 = spec.l1, spec.l2
    if name == "sgd":
        eta = lr / (1.0 + l2 * lr)
        if l2:
            w.mul_(1.0 - eta * l2)
        w.sub_(eta * g)
        if l1:
            w.copy_(torch.sign(w) * torch.clamp(w.abs() - eta * l1, min=0.0))
        return
    if name == "ftrl":
        alpha, beta = spec.ftrl_alpha, spec.ftrl_beta
        z, n = state["z"], state["n"]
        n_new = n + g * g
        sigma = (torch.sqrt(n_new) - torch.sqrt(n)) / alpha
        z.add_(g - sigma * w)
        n.copy_(n_new)
        denom = l2 + (beta + torch.sqrt(n)) / alpha
        w.copy_(torch.where(z.abs() <= l1, torch.zeros_like(w), -(z - torch.sign(z) * l1) / denom))
        return
    gp = g + l2 * w if l2 else g
    if name == "momentum":
        v = state["v"]
        v.mul_(spec.momentum).add_(gp)
        w.sub_(lr * v)
        return
    if name == "adam":
        m, v, t = state["m"], state["v"], state["t"]
        m.mul_(spec.beta1).add_((1.0 - spec.beta1) * gp)
        v.mul_(spec.beta2).add_((1.0 - spec.beta2) * gp * gp)
        t.add_(1.0)
        tt = t.double()
        step_size = (lr / (1.0 - torch.pow(spec.beta1, tt))).to(w.dtype)
        bc2_sqrt = torch.sqrt(1.0 - torch.pow(spec.beta2, tt)).to(w.dtype)
        denom = torch.sqrt(v) / bc2_sqrt + spec.eps
        w.sub_(step_size * (m / denom))
        return
    n = state["n"]
    if name == "adagrad":
        n.add_(gp * gp)
    elif name == "rmsprop":
        n.mul_(spec.rho).add_((1.0 - spec.rho) * gp * gp)
    else:  # pragma: no cover - OptimizerSpec validates names
        raise ValueError(f"unknown optimizer {name!r}")
    denom = torch.sqrt(n) + spec.eps
    w.sub_(lr * gp / denom)
    if l1:
        thr = lr * l1 / denom
        w.copy_(torch.sign(w) * torch.clamp(w.abs() - thr, min=0.0))
