"""The optimizer interface: an optimizer's state slots and its update, over numpy or torch.

An :class:`Optimizer` updates rows ``w`` (``[k, cols]``) in place with their summed gradient
``g`` and their state slots (``name -> [k, width]``), with the step size ``lr`` of that update.
Its :meth:`Optimizer.update` is written once over :class:`Ops`, the few functions numpy and
torch spell differently, so the same formula runs on the shards' host rows (numpy), on rows
on a torch device and on the workers' dense layers. The numpy path computes its scalars in the
rows' dtype, the torch path in float64 (as torch does with Python scalars).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from angelps.table import OptimizerSpec

__all__ = ["NUMPY", "Array", "Ops", "Optimizer", "ops_for", "soft_threshold", "torch_ops"]

Array = Any  # np.ndarray or torch.Tensor: the formulas use what both support


class Ops:
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


NUMPY = Ops(
    scalar=lambda w: w.dtype.type,
    sqrt=np.sqrt,
    sign=np.sign,
    where=np.where,
    clamp0=lambda x: np.maximum(x, 0.0),
    f64=lambda x: x.astype(np.float64),
    like=lambda x, w: x.astype(w.dtype),
)


@lru_cache(maxsize=1)
def torch_ops() -> Ops:
    """The torch spelling (torch imported here, on first use: a CPU shard never loads it)."""
    import torch

    return Ops(
        scalar=lambda w: float,
        sqrt=torch.sqrt,
        sign=torch.sign,
        where=torch.where,
        clamp0=lambda x: torch.clamp(x, min=0.0),
        f64=lambda x: x.double(),
        like=lambda x, w: x.to(w.dtype),
    )


def ops_for(w: Array) -> Ops:
    """numpy's functions for a numpy array, torch's for a tensor."""
    return NUMPY if isinstance(w, np.ndarray) else torch_ops()


def soft_threshold(xp: Ops, w: Array, thr: Any) -> None:
    """``w ← sign(w)·max(0, |w| − thr)`` in place (the proximal L1 step)."""
    w[...] = xp.sign(w) * xp.clamp0(abs(w) - thr)


class Optimizer(ABC):
    """One optimizer: its name, its state slots, its update.

    Subclasses set :attr:`name` (lower case, what ``OptimizerSpec.name`` holds), :attr:`display`
    (the spelling of the ``ml.*.optimizer`` keys), :attr:`slots` and write :meth:`update`.
    """

    #: Canonical (lower-case) name.
    name: ClassVar[str] = ""
    #: The spelling in Angel-style job files (``ml.embedding.optimizer=Momentum``).
    display: ClassVar[str] = ""
    #: State slot name -> width (None: the table's cols). Slots start at zero.
    slots: ClassVar[Mapping[str, int | None]] = {}
    #: torch.optim's names of the same slots (worker checkpoints written with torch.optim).
    torch_slots: ClassVar[Mapping[str, str]] = {}
    #: Whether the momentum (β1) of a cycling schedule applies to it.
    has_momentum: ClassVar[bool] = False
    #: Why the workers' dense layers cannot use it (None: they can).
    not_for_dense: ClassVar[str | None] = None
    #: The :class:`OptimizerSpec` fields its update reads on a PS table (the workers' dense
    #: layers read these less ``l1``): a key of another field, set, is not used. None (an
    #: optimizer registered outside angelps that does not say): not checked.
    reads: ClassVar[tuple[str, ...] | None] = None

    @abstractmethod
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
        """Update ``w`` and ``state`` in place (``momentum``: this update's m or β1, when a
        schedule cycles it; None: the spec's)."""

    def dense_spec(self, spec: OptimizerSpec) -> OptimizerSpec:
        """The spec the workers' dense layers run with (torch.optim's semantics)."""
        return spec
