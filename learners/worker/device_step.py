"""The parts of a worker's step that stay on its device until a log interval asks for them:
the chunk's loss (:class:`LossSum`, read once per ``run_steps`` chunk, which never crosses a
multiple of ``angel.log.every.steps``) and the ids of a batch deduplicated where the rows are
(:func:`unique_slots`: ``torch.unique`` on the device, for tables the workers hold), built on a
side stream while the current batch computes (:class:`SideStream`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import is_dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["LossSum", "SideStream", "dedup_on_device", "host_copy", "unique_slots", "unscaled"]


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
    leave the device, but for a device tier's: :func:`host_copy`; shards and the exchanges
    between several workers route host ids), and under ``auto`` only on CUDA (numpy's dedup is
    faster on the CPU)."""
    if mode == "host" or num_workers != 1 or not sparse or not sparse <= held:
        return False
    return mode == "device" or device.type == "cuda"


def host_copy(t: Tensor) -> np.ndarray:
    """A host copy of ``t`` (a batch's unique ids, for a device tier, whose index is on the
    host), made on the stream that built it: on a GPU through pinned memory, waiting for that
    stream alone (the side stream of :class:`SideStream`: the batch's upload and dedup), not
    for the step computing beside it."""
    if not t.is_cuda:
        return t.numpy()
    h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    h.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return h.numpy()


class SideStream:
    """Where the next batch is read, deduplicated and copied up while the current one
    computes: on CUDA a side stream (its pinned, asynchronous copies and ``torch.unique`` run
    beside the compute stream's kernels; ``torch.unique``'s read of its size waits for this
    stream only); on the CPU nothing (the fused pull already overlaps that work there).

    A batch built under :meth:`scope` is :meth:`hand_over`-ed before its first use: the
    compute stream waits for the side stream's work, and its tensors are marked as used by
    the compute stream (so the caching allocator does not hand their memory to the side
    stream again while the compute stream still reads them)."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def scope(self) -> AbstractContextManager[object]:
        """The context in which the next batch is built."""
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def hand_over(self, *parts: object) -> None:
        """Make ``parts`` (a batch's input, labels, ids: tensors, dataclasses, mappings)
        safe to use on the compute stream."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream(self.stream.device)
        current.wait_stream(self.stream)
        for t in _tensors(parts):
            if t.is_cuda:
                t.record_stream(current)


def _tensors(parts: Iterable[object]) -> Iterator[Tensor]:
    for p in parts:
        if isinstance(p, Tensor):
            yield p
        elif isinstance(p, Mapping):
            yield from _tensors(p.values())
        elif is_dataclass(p) and not isinstance(p, type):
            yield from _tensors(vars(p).values())


def unscaled(g: Tensor, loss_scale: float) -> Tensor:
    """A row gradient in float32 on the worker's device, the loss scale divided out."""
    g = g.detach().float()
    return g / loss_scale if loss_scale != 1.0 else g
