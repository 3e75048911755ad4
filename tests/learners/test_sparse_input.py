"""The CSR backward over more than 65,536 rows (two radix passes) equals index_add's."""

from __future__ import annotations

import numpy as np
import torch

from learners.models.sparse_input import SparseInput, _order


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
