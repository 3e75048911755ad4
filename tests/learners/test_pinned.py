"""learners/worker/pinned.py: a CUDA worker's uploads through reused pinned buffers. CUDA only
(``-m gpu``); the CPU path of ``to_device`` is tests/learners/test_device.py's."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from learners.worker import pinned
from learners.worker.device import to_device

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.skipif(not CUDA, reason="needs CUDA"), pytest.mark.gpu]


def test_uploads_equal_their_arrays_whatever_the_size_and_dtype() -> None:
    rng = np.random.default_rng(0)
    dev = torch.device("cuda")
    for shape in [(0,), (1,), (3, 5), (8192,), (70_000, 12), (1 << 16,)]:
        for dtype in (np.float32, np.float64, np.int64, np.int32):
            a = (rng.standard_normal(shape) * 1000).astype(dtype)
            t = to_device(a, dev)
            assert t.is_cuda and tuple(t.shape) == shape and t.dtype == torch.from_numpy(a).dtype
            np.testing.assert_array_equal(t.cpu().numpy(), a)
    # a slice (not contiguous) and a 0-d array
    a = np.arange(40, dtype=np.int64).reshape(8, 5)[:, 1:3]
    np.testing.assert_array_equal(to_device(a, dev).cpu().numpy(), a)
    np.testing.assert_array_equal(to_device(np.float32(2.5), dev).cpu().numpy(), 2.5)


def test_a_buffer_is_not_rewritten_while_its_copy_may_be_in_flight() -> None:
    """More uploads of one size than a ring holds, queued behind a long kernel so that none
    of their copies has run when the next is staged: each device copy still holds its own
    array (a buffer reused too early would hold a later one's)."""
    dev = torch.device("cuda")
    big = torch.randn(4096, 4096, device=dev)
    for _ in range(3):
        big = big @ big  # (keeps the stream busy while the uploads are staged)
        big /= big.norm()
    arrays = [np.full(300_000, i, dtype=np.int64) for i in range(pinned.RING * 3)]
    outs = [to_device(a, dev) for a in arrays]
    torch.cuda.synchronize()
    for i, t in enumerate(outs):
        assert int(t.min()) == i == int(t.max())


def test_a_warm_ring_allocates_nothing() -> None:
    dev = torch.device("cuda")
    a = np.arange(250_000, dtype=np.int64)
    for _ in range(4):
        to_device(a, dev)
    torch.cuda.synchronize()
    before = pinned._STAGE.allocated
    for _ in range(50):
        to_device(a, dev)
        torch.cuda.synchronize()  # (each copy done before the next: one buffer serves)
    assert pinned._STAGE.allocated == before


def test_each_thread_has_its_own_buffers() -> None:
    dev = torch.device("cuda")
    results: dict[int, list[torch.Tensor]] = {}

    def work(k: int) -> None:
        results[k] = [to_device(np.full(100_000, k * 1000 + i, np.int64), dev) for i in range(20)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    for k, outs in results.items():
        assert [int(t[0]) for t in outs] == [k * 1000 + i for i in range(20)]
        assert all(int(t.min()) == int(t.max()) for t in outs)
