"""learners/worker/dense.py ``finish_grads``: the verdict on finiteness and the clip coefficient
from the gradients of the tables a worker holds (tensors) beside the pushed ones (numpy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from learners.worker.dense import finish_grads


def _grads(held: torch.Tensor, pushed: np.ndarray | None = None) -> dict:
    out = {"held": (np.arange(len(held)), held)}
    if pushed is not None:
        out["pushed"] = (np.arange(len(pushed)), pushed)
    return out


def test_a_held_gradient_s_norm_sets_the_clip_coefficient_as_numpy_computes_it() -> None:
    rng = np.random.default_rng(0)
    held = rng.standard_normal((1000, 8)).astype(np.float32) * 3
    pushed = rng.standard_normal((50, 4)).astype(np.float32)
    model = nn.Linear(2, 1)
    model.weight.grad = torch.zeros_like(model.weight)
    model.bias.grad = torch.zeros_like(model.bias)
    ok, coef = finish_grads(model, _grads(torch.from_numpy(held), pushed), 1.0, 1, 0.5)
    norm = np.sqrt(
        np.square(held, dtype=np.float64).sum() + np.square(pushed, dtype=np.float64).sum()
    )
    assert ok
    assert coef == pytest.approx(0.5 / (norm + 1e-6), rel=1e-12)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_held_gradient_fails_the_update(bad: float) -> None:
    held = torch.ones(100, 8)
    held[37, 3] = bad
    ok, _ = finish_grads(nn.Linear(2, 1), _grads(held), 1.0, 1, 0.0)
    assert not ok


def test_a_large_finite_held_gradient_is_finite() -> None:
    """Squares above float32's range (3e38) are still summed: the norm is taken in float64."""
    held = torch.full((10, 8), 1e20)
    ok, coef = finish_grads(nn.Linear(2, 1), _grads(held), 1.0, 1, 1.0)
    assert ok and coef == pytest.approx(1.0 / (np.sqrt(80) * 1e20), rel=1e-9)
