"""Page-locked (pinned) staging buffers for a CUDA worker's uploads, kept and reused.

Each upload of a step (a batch's ids, its labels, the rows a device tier read from the
shards) goes from a numpy array into pinned host memory, then up with ``non_blocking=True``.
Taking a new pinned block from torch's caching host allocator for each was the largest line
of a GPU worker's host time in a profile (py-spy on an H200: about 0.5 ms a step of the
tables held on the GPU, most of it in the allocation). Here each thread keeps a few buffers
of each power-of-two size and reuses one once the CUDA event recorded after its copy has
completed, so a step's uploads allocate nothing once the rings are warm.

A buffer is never written while a copy from it may still be in flight: its event is queried
(or, with every buffer of its size busy, waited for) first. Arrays larger than
:data:`POOL_MAX_BYTES` (a restore, a flush) take torch's allocator as before.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["POOL_MAX_BYTES", "RING", "PinnedStage", "pinned_upload"]

#: The largest array staged through the rings (bytes); larger ones allocate their own block.
POOL_MAX_BYTES = 64 << 20
#: Buffers kept per size and thread: the uploads of one size a worker has in flight at once
#: (about one a step, the GPU a few steps behind at most) with room to spare.
RING = 8
_MIN_BYTES = 4096


class PinnedStage(threading.local):
    """One thread's pinned buffers, by size (a power of two of bytes)."""

    def __init__(self) -> None:
        self.rings: dict[int, collections.deque[tuple[Tensor, torch.cuda.Event]]] = {}
        self.allocated = 0  # (buffers this thread allocated: a warm ring allocates none)

    def buffer(self, nbytes: int) -> tuple[Tensor, torch.cuda.Event, collections.deque[Any]]:
        """A pinned uint8 buffer of at least ``nbytes`` that no copy reads any more, the event
        to record after the next copy from it, and the ring to give both back to."""
        size = max(_MIN_BYTES, 1 << (nbytes - 1).bit_length())
        ring = self.rings.setdefault(size, collections.deque())
        if ring and (len(ring) >= RING or ring[0][1].query()):
            buf, done = ring.popleft()
            done.synchronize()  # (done already unless all RING buffers are in flight)
            return buf, done, ring
        self.allocated += 1
        buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return buf, torch.cuda.Event(), ring


_STAGE = PinnedStage()


def pinned_upload(a: np.ndarray, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A copy of ``a`` on the CUDA ``device`` (``dtype``: ``a``'s), through a reused pinned
    buffer, queued on the current stream; the buffer is handed out again only after the copy."""
    a = np.asarray(a)
    nbytes = a.nbytes
    if nbytes == 0 or nbytes > POOL_MAX_BYTES:
        h = torch.empty(a.shape, dtype=dtype, pin_memory=True)
        h.numpy()[...] = a
        return h.to(device, non_blocking=True)
    buf, done, ring = _STAGE.buffer(nbytes)
    host = buf[:nbytes].view(dtype).view(a.shape)
    host.numpy()[...] = a
    out = host.to(device, non_blocking=True)
    done.record()  # (on the current stream: the copy's)
    ring.append((buf, done))
    return out
