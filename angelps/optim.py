"""Optimizer updates, written once: ``apply(spec, w, state, g, lr)`` on rows or parameters.

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

Each formula exists once, in its optimizer's class (:mod:`angelps.optimizers.builtin`; the
interface: :mod:`angelps.optimizers.base`; more can be registered:
:mod:`angelps.optimizers.registry`), written over a small array namespace, and runs on
numpy arrays (the shards' host rows), on torch tensors of any device (GPU shards) and, through
:class:`DenseOptimizer`, on the workers' dense layers. The numpy path computes its scalars in the
rows' dtype and the torch path in float64 (as torch does with Python scalars); the two agree to
float rounding. torch is imported only when a torch path runs: a CPU shard never loads it,
which saves its process 1-3 s of start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from angelconf.config import ConfigError
from angelps.optimizer_keys import OPTIMIZERS
from angelps.optimizers.base import Array, ops_for
from angelps.optimizers.registry import optimizer_for
from angelps.table import OptimizerSpec

if TYPE_CHECKING:
    import torch

__all__ = ["DenseOptimizer", "apply", "slot_columns", "slot_widths"]


def slot_widths(spec: OptimizerSpec, cols: int) -> dict[str, int]:
    """Optimizer state slots of one row: name -> width. Slots start at zero."""
    return {k: (cols if w is None else w) for k, w in optimizer_for(spec).slots.items()}


def slot_columns(spec: OptimizerSpec, cols: int) -> tuple[dict[str, tuple[int, int]], int]:
    """Where a whole row keeps its optimizer slots: name -> (first, end) column, after the
    ``cols`` weights, and the row's width (the layout of shards, held tables and device
    tiers alike)."""
    out: dict[str, tuple[int, int]] = {}
    c = cols
    for k, width in slot_widths(spec, cols).items():
        out[k] = (c, c + width)
        c += width
    return out, c


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
    optimizer_for(spec).update(ops_for(w), spec, w, state, g, lr, momentum)


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

        opt = optimizer_for(spec)
        if opt.not_for_dense:
            valid = ", ".join(
                d for n, d in OPTIMIZERS.items() if not optimizer_for(n).not_for_dense
            )
            raise ConfigError(
                f"ml.fclayer.optimizer={spec.name} cannot run on the workers ({opt.not_for_dense}; "
                f"valid for worker-side dense layers: {valid})"
            )
        # A schedule's momentum applies to an optimizer that has one (plain SGD has none).
        self.cycles = opt.has_momentum
        spec = opt.dense_spec(replace(spec, l1=0.0))
        self.spec = spec
        self._torch_slots = dict(optimizer_for(spec).torch_slots)
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
                name = k if k in slots else self._torch_slots.get(k)
                if name in slots and v is not None:
                    slots[name].copy_(torch.as_tensor(v).reshape(1, -1))
        self.param_groups = [dict(g) for g in sd["param_groups"]]
