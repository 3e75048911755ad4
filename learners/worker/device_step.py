"""The parts of a worker's step that stay on its device until a log interval asks for them:
the chunk's loss (:class:`LossSum`, read once per ``run_steps`` chunk, which never crosses a
multiple of ``angel.log.every.steps``) and the ids of a batch deduplicated where the rows are
(:func:`unique_slots`: ``torch.unique`` on the device, for tables the workers hold)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LossSum", "dedup_on_device", "unique_slots"]


class LossSum:
    """Σ loss × samples of a chunk's micro-batches, in float64 on the losses' device: one host
    read per chunk (:meth:`take`) instead of one per micro-batch. The same sum, in the same
    order, as adding ``float(loss) * n`` on the host."""

    def __init__(self) -> None:
        self._sum: Tensor | None = None

    def add(self, loss: Tensor, n: int) -> None:
        """One micro-batch's mean loss (a scalar) over its ``n`` samples."""
        term = loss.detach().double() * n
        self._sum = term if self._sum is None else self._sum + term

    def take(self) -> float:
        """The sum so far (one host read), and start over."""
        total, self._sum = self._sum, None
        return 0.0 if total is None else float(total)


def unique_slots(ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(unique ids ascending, slot of each id)`` on the ids' device; the same arrays as
    :class:`angelps.dedup.Dedup` (sorted unique, ``unique[slot] == ids``)."""
    uniq, inv = torch.unique(ids, sorted=True, return_inverse=True)
    return uniq, inv.reshape(-1)


def dedup_on_device(
    mode: str, device: torch.device, num_workers: int, sparse: set[str], held: frozenset[str]
) -> bool:
    """Whether a batch's ids are deduplicated on the worker's ``device`` (``angel.worker.dedup``
    = ``mode``): only when this one worker holds every ``sparse`` table (the ids then never
    leave the device; shards and the exchanges between several workers route host ids), and
    under ``auto`` only on CUDA (numpy's dedup is faster on the CPU)."""
    if mode == "host" or num_workers != 1 or not sparse or not sparse <= held:
        return False
    return mode == "device" or device.type == "cuda"
