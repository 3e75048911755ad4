"""Moving a step's arrays between the host and a worker's device.

On a CUDA worker the rows of a batch go up through page-locked (pinned) host memory with
``non_blocking=True``, so the copy runs on the GPU's copy engine while the host goes on
building the step, and a step's row gradients come down into pinned buffers with one
synchronisation for all of them (not one per table). On the CPU each is one plain copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from angelps.malloc import available_bytes

__all__ = [
    "NUMPY_ROWS_ON_CPU",
    "RowBlock",
    "as_rows",
    "free_bytes",
    "to_device",
    "to_host",
    "torch_dtype",
]


def to_device(a: np.ndarray, device: torch.device) -> Tensor:
    """A copy of ``a`` on ``device`` that shares no memory with it (a pulled block may be
    read-only, from Ray's object store, or reused by the cache); on CUDA an asynchronous copy
    through a pinned staging block."""
    if device.type != "cuda":
        return torch.from_numpy(np.array(a, copy=True))
    h = torch.empty(np.shape(a), dtype=_TORCH_DTYPE[np.dtype(a.dtype)], pin_memory=True)
    h.numpy()[...] = a
    # torch's caching host allocator records the stream that reads the block, so it is not
    # handed out again while this copy is in flight.
    return h.to(device, non_blocking=True)


def torch_dtype(dtype: str | np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (a table's ``spec.dtype``)."""
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype


def as_rows(a: np.ndarray) -> np.ndarray:
    """A contiguous 2-D array as a 1-D array of opaque rows (one element a row)."""
    return a.view(np.dtype((np.void, a.shape[1] * a.dtype.itemsize))).reshape(-1)


#: Whole rows of a CPU tensor move as numpy's opaque rows (:class:`RowBlock`). Tests set this
#: False to run a GPU's code path (torch's index_select/index_copy_, the asynchronous copies'
#: bookkeeping) on the CPU.
NUMPY_ROWS_ON_CPU = True


class RowBlock:
    """Whole rows of a ``[n, width]`` tensor on a device, taken and put by slot (host int64
    arrays, or the same slots already on the device: ``on``). On the CPU as numpy's opaque
    rows (take/put: 5-10x faster than torch's index_select/index_copy_ there, and no copy of
    the slots), on a GPU with torch."""

    def __init__(self, data: Tensor) -> None:
        self.data = data
        self.device = data.device
        host = data.device.type == "cpu" and NUMPY_ROWS_ON_CPU
        self._host = as_rows(data.numpy()) if host else None
        self._np = np.dtype(str(data.dtype).removeprefix("torch."))
        self._width = int(data.shape[1])

    def slots(self, slots: np.ndarray) -> Tensor | None:
        """``slots`` on the device, for several takes and puts of the same slots (None where
        rows move by host slots)."""
        return None if self._host is not None else to_device(slots, self.device)

    def take(self, slots: np.ndarray, on: Tensor | None = None) -> Tensor:
        """A new ``[len(slots), width]`` tensor of the rows at ``slots`` (on the device)."""
        if self._host is not None:
            rows = self._host.take(slots).view(self._np)
            return torch.from_numpy(rows.reshape(len(slots), self._width))
        return self.data.index_select(0, on if on is not None else to_device(slots, self.device))

    def take_host(self, slots: np.ndarray) -> np.ndarray:
        """The rows at ``slots`` as a new host array."""
        if self._host is not None:
            return self._host.take(slots).view(self._np).reshape(len(slots), self._width)
        return self.take(slots).cpu().numpy()

    def take_host_async(
        self, slots: np.ndarray, on: Tensor | None = None
    ) -> tuple[np.ndarray, torch.cuda.Event | None]:
        """:meth:`take_host` without waiting for a GPU: the host array (pinned; its rows land
        later) and the CUDA event to wait for before reading it (None: ready now). The copy is
        queued after every update queued before it, so it takes the rows as updated."""
        if self.device.type != "cuda":
            return self.take_host(slots), None
        rows = self.take(slots, on)
        h = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        h.copy_(rows, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        # The array keeps its tensor, and so its pinned block, alive.
        return h.numpy(), done

    @property
    def on_host(self) -> bool:
        """Rows move as numpy's opaque rows (a CPU worker): nothing is sent up."""
        return self._host is not None

    def assemble(
        self,
        slots: np.ndarray,
        miss: np.ndarray,
        rows: np.ndarray | Tensor,
        on: tuple[Tensor | None, Tensor | None] = (None, None),
    ) -> Tensor:
        """A new ``[len(slots), width]`` tensor (on the device): the rows at ``slots``, but
        at the positions ``miss`` (ascending) the rows ``rows`` (whole rows, in order: on the
        host, or on the device already); ``on``: ``slots`` and ``miss`` on the device already
        (:meth:`slots` of each)."""
        out = self.take(slots, on[0])
        if not len(miss):
            return out
        if self._host is not None:
            r = np.asarray(rows.numpy() if isinstance(rows, Tensor) else rows)
            np.put(as_rows(out.numpy()), miss, as_rows(np.ascontiguousarray(r, dtype=self._np)))
        else:
            up = rows if isinstance(rows, Tensor) else to_device(rows, self.device)
            got = up.to(self.data.dtype)
            at = on[1] if on[1] is not None else to_device(miss, self.device)
            out.index_copy_(0, at, got)
        return out

    def put(self, slots: np.ndarray, block: np.ndarray | Tensor, on: Tensor | None = None) -> None:
        """Write whole rows ``block`` (host or device) at ``slots``."""
        if self._host is not None:
            b = block.numpy() if isinstance(block, Tensor) else block
            np.put(self._host, slots, as_rows(np.ascontiguousarray(b, dtype=self._np)))
            return
        rows = block if isinstance(block, Tensor) else to_device(block, self.device)
        idx = on if on is not None else to_device(slots, self.device)
        self.data.index_copy_(0, idx, rows.to(self.device, self.data.dtype))


_TORCH_DTYPE = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
}


def to_host(ts: Sequence[Tensor]) -> list[np.ndarray]:
    """Float32 numpy copies of ``ts``, owned by the caller; CUDA tensors come down through
    pinned buffers and the stream is synchronised once, after the last copy is queued."""
    if not any(t.is_cuda for t in ts):
        return [t.detach().float().numpy().copy() for t in ts]
    held: list[Tensor] = []
    for t in ts:
        t = t.detach().float()
        if not t.is_cuda:
            held.append(t.clone())
            continue
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        h.copy_(t, non_blocking=True)
        held.append(h)
    torch.cuda.current_stream().synchronize()
    # Each array keeps its tensor, and so its pinned block, alive.
    return [h.numpy() for h in held]


def free_bytes(device: torch.device) -> int:
    """Free memory of ``device``: a GPU's (``cudaMemGetInfo``), or the host's available
    memory (:func:`angelps.malloc.available_bytes`)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_bytes()
