"""The CSR backward over more than 65,536 rows (two radix passes) equals index_add's; the
sample of each non-zero made on the device equals the host's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learners.models.sparse_input import SparseInput, _order, sample_index


def test_two_pass_radix_order_is_a_stable_sort():
    rng = np.random.default_rng(0)
    slots = rng.integers(0, 200_000, 50_000)
    np.testing.assert_array_equal(_order(slots, 200_000), np.argsort(slots, kind="stable"))
    small = rng.integers(0, 300, 1000)
    np.testing.assert_array_equal(_order(small, 300), np.argsort(small, kind="stable"))


def test_csr_backward_over_many_rows_matches_index_add():
    rng = np.random.default_rng(1)
    u, b, f = 70_000, 6000, 26  # 156k non-zeros over 70k rows: the CSR path, two passes
    slots = rng.integers(0, u, b * f)
    slots[:u] = np.arange(u)  # every row hit
    indptr = np.arange(0, b * f + 1, f)
    values = rng.random(b * f).astype(np.float32)
    x = SparseInput.from_csr(indptr, slots, values, {}, f)
    assert x.rows_t is not None
    rows = torch.randn(u, 4, requires_grad=True)
    x.rows["v"] = rows
    g = torch.randn(b * f, 4)
    (x.weighted_rows("v") * g).sum().backward()
    want = torch.zeros(u, 4).index_add_(
        0, torch.from_numpy(slots), g * torch.from_numpy(values)[:, None]
    )
    torch.testing.assert_close(rows.grad, want, rtol=1e-5, atol=1e-5)


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, _CUDA])])
@pytest.mark.parametrize(
    "counts",
    [
        [26] * 5,  # the field models: every sample alike, nothing sent up
        [3, 0, 5, 1, 1],  # ragged (a sample with no non-zero among them)
        [2, 3, 3, 3],  # as many non-zeros as b x the first, not all alike
        [0, 0, 0],
        [],
    ],
)
def test_the_sample_of_each_non_zero_made_on_the_device_is_numpy_s_repeat(counts, device):
    """A GPU batch's row index (SparseInput.sample), made where its rows are, equals the host's
    np.repeat that the CPU path keeps."""
    c = np.asarray(counts, dtype=np.int64)
    got = sample_index(c, int(c.sum()), torch.device(device))
    assert got.dtype == torch.int64 and got.device.type == device
    np.testing.assert_array_equal(got.cpu().numpy(), np.repeat(np.arange(len(c)), c))


@pytest.mark.gpu
@_CUDA
def test_a_cuda_batch_s_sample_index_is_the_host_s():
    indptr = np.array([0, 2, 2, 5, 6])
    slots, values = np.array([0, 1, 2, 0, 3, 1]), np.ones(6, dtype=np.float32)
    host = SparseInput.from_csr(indptr, slots, values, {})
    cuda = SparseInput.from_csr(indptr, slots, values, {}, device="cuda")
    assert cuda.sample.is_cuda
    np.testing.assert_array_equal(cuda.sample.cpu().numpy(), host.sample.numpy())
