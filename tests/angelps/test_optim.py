"""Server-side optimizers against torch.optim (or a float64 scalar reference where torch has none),
on identical gradients and a varying step size."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from angelconf.config import ConfigError
from angelps.optim import DenseOptimizer, apply, slot_widths
from angelps.table import OptimizerSpec

STEPS = 6
LRS = [0.1, 0.05, 0.2, 0.01, 0.3, 0.07]


def _data(dtype=np.float32, rows=5, cols=3, seed=0):
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal((rows, cols)).astype(dtype)
    grads = [rng.standard_normal((rows, cols)).astype(dtype) for _ in range(STEPS)]
    return w0, grads


def _run_ours(spec: OptimizerSpec, w0, grads, lrs=LRS):
    w = w0.copy()
    state = {
        k: np.zeros((w.shape[0], n), dtype=w.dtype)
        for k, n in slot_widths(spec, w.shape[1]).items()
    }
    for g, lr in zip(grads, lrs, strict=True):
        apply(spec, w, state, g, lr)
    return w, state


def _run_torch(make, w0, grads, lrs=LRS):
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = make([p])
    for g, lr in zip(grads, lrs, strict=True):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    return p.detach().numpy()


TORCH_CASES = [
    (OptimizerSpec("sgd"), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    (
        OptimizerSpec("momentum", momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    ),
    (
        OptimizerSpec("Momentum", momentum=0.5, l2=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, weight_decay=0.01),
    ),
    (
        OptimizerSpec("adam", beta1=0.9, beta2=0.99, eps=1e-8),
        lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.9, 0.99), eps=1e-8),
    ),
    (
        OptimizerSpec("ADAM", beta1=0.8, beta2=0.95, eps=1e-3, l2=0.1),
        lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.1),
    ),
    (
        OptimizerSpec("adagrad", eps=1e-10),
        lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-10),
    ),
    (
        OptimizerSpec("adagrad", eps=1e-6, l2=0.05),
        lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-6, weight_decay=0.05),
    ),
    (
        OptimizerSpec("rmsprop", rho=0.9, eps=1e-8),
        lambda ps: torch.optim.RMSprop(ps, lr=0.1, alpha=0.9, eps=1e-8),
    ),
    (
        OptimizerSpec("RMSProp", rho=0.7, eps=1e-4, l2=0.02),
        lambda ps: torch.optim.RMSprop(ps, lr=0.1, alpha=0.7, eps=1e-4, weight_decay=0.02),
    ),
]


@pytest.mark.parametrize(("spec", "make"), TORCH_CASES, ids=lambda c: getattr(c, "name", ""))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_torch(spec, make, dtype):
    w0, grads = _data(dtype)
    ours, _ = _run_ours(spec, w0, grads)
    ref = _run_torch(make, w0, grads)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol)
    assert not np.allclose(ours, w0)  # the optimizer moved the weights


def test_adam_bias_correction_is_per_row():
    # Row 1 is first updated at the second push: its first update must equal a fresh Adam step
    # (|Δ| = lr for a nonzero gradient), whatever the other rows did before.
    spec = OptimizerSpec("adam", beta1=0.9, beta2=0.99, eps=1e-12)
    w = np.zeros((2, 1), dtype=np.float64)
    state = {k: np.zeros((2, n)) for k, n in slot_widths(spec, 1).items()}
    sub = {k: v[[0]] for k, v in state.items()}
    w0 = w[[0]]
    apply(spec, w0, sub, np.array([[1.0]]), 0.1)
    w[[0]] = w0
    for k in state:
        state[k][[0]] = sub[k]
    apply(spec, w, state, np.array([[0.5], [-2.0]]), 0.1)
    assert state["t"][:, 0].tolist() == [2.0, 1.0]
    assert w[1, 0] == pytest.approx(0.1, rel=1e-9)


def _prox_sgd_reference(w, g, lr, l1, l2):
    # Angel's PGDUpdateFunc with sign (not sin) in the soft threshold, scalar float64.
    eta = lr / (1.0 + l2 * lr)
    w = w * (1.0 - eta * l2) - eta * g
    thr = eta * l1
    return math.copysign(max(0.0, abs(w) - thr), w) if abs(w) > thr else 0.0


@pytest.mark.parametrize(("l1", "l2"), [(0.0, 0.1), (0.5, 0.0), (0.3, 0.2)])
def test_sgd_proximal_matches_float64_reference(l1, l2):
    spec = OptimizerSpec("sgd", l1=l1, l2=l2)
    w0, grads = _data(np.float64)
    ours, _ = _run_ours(spec, w0, grads)
    ref = w0.copy()
    for g, lr in zip(grads, LRS, strict=True):
        for i in np.ndindex(ref.shape):
            ref[i] = _prox_sgd_reference(ref[i], g[i], lr, l1, l2)
    np.testing.assert_allclose(ours, ref, rtol=1e-13, atol=1e-15)
    if l1:
        assert (ours == 0).any()  # the L1 step produces exact zeros


def test_sgd_l1_uses_sign_not_sin():
    # Angel's bug: sin(w)·max(0, |w|-thr). With w = 3 after the gradient step, sign gives 2.9.
    spec = OptimizerSpec("sgd", l1=1.0)
    w = np.array([[3.1]])
    apply(spec, w, {}, np.array([[1.0]]), 0.1)
    assert w[0, 0] == pytest.approx(2.9)


def _ftrl_reference(w, z, n, g, alpha, beta, l1, l2):
    sigma = (math.sqrt(n + g * g) - math.sqrt(n)) / alpha
    z = z + g - sigma * w
    n = n + g * g
    if abs(z) <= l1:
        w = 0.0
    else:
        w = -(z - math.copysign(l1, z)) / (l2 + (beta + math.sqrt(n)) / alpha)
    return w, z, n


@pytest.mark.parametrize(("l1", "l2"), [(0.0, 0.0), (0.5, 0.1), (2.0, 1.0)])
def test_ftrl_matches_float64_reference(l1, l2):
    spec = OptimizerSpec("ftrl", ftrl_alpha=0.1, ftrl_beta=1.0, l1=l1, l2=l2)
    w0, grads = _data(np.float64)
    ours, state = _run_ours(spec, w0, grads)
    ref_w, ref_z, ref_n = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for g in grads:
        for i in np.ndindex(w0.shape):
            ref_w[i], ref_z[i], ref_n[i] = _ftrl_reference(
                ref_w[i], ref_z[i], ref_n[i], g[i], 0.1, 1.0, l1, l2
            )
    np.testing.assert_allclose(ours, ref_w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(state["z"], ref_z, rtol=1e-12)
    np.testing.assert_allclose(state["n"], ref_n, rtol=1e-12)


def test_ftrl_ignores_pushed_lr():
    spec = OptimizerSpec("ftrl")
    w0, grads = _data(np.float64)
    a, _ = _run_ours(spec, w0, grads, LRS)
    b, _ = _run_ours(spec, w0, grads, [1.0] * STEPS)
    np.testing.assert_array_equal(a, b)


def test_slot_widths():
    assert slot_widths(OptimizerSpec("sgd"), 4) == {}
    assert slot_widths(OptimizerSpec("adam"), 4) == {"m": 4, "v": 4, "t": 1}
    assert slot_widths(OptimizerSpec("ftrl"), 2) == {"z": 2, "n": 2}


def test_adagrad_zero_gradient_gives_no_nan():
    # Angel's AdaGrad has no epsilon: 0/0 where n = 0. Ours keeps w unchanged.
    for name in ("adagrad", "rmsprop", "adam"):
        spec = OptimizerSpec(name)
        w = np.ones((2, 2), dtype=np.float32)
        state = {k: np.zeros((2, n), dtype=np.float32) for k, n in slot_widths(spec, 2).items()}
        apply(spec, w, state, np.zeros((2, 2), dtype=np.float32), 0.1)
        np.testing.assert_array_equal(w, np.ones((2, 2), dtype=np.float32))


# --- the workers' dense layers -------------------------------------------------------------------

_TORCH_DENSE = {
    "sgd": lambda ps, s: torch.optim.SGD(ps, lr=0.0, weight_decay=s.l2),
    "momentum": lambda ps, s: torch.optim.SGD(ps, lr=0.0, momentum=s.momentum, weight_decay=s.l2),
    "adam": lambda ps, s: torch.optim.Adam(
        ps, lr=0.0, betas=(s.beta1, s.beta2), eps=s.eps, weight_decay=s.l2
    ),
    "adagrad": lambda ps, s: torch.optim.Adagrad(ps, lr=0.0, eps=s.eps, weight_decay=s.l2),
    "rmsprop": lambda ps, s: torch.optim.RMSprop(
        ps, lr=0.0, alpha=s.rho, eps=s.eps, weight_decay=s.l2
    ),
}


@pytest.mark.parametrize("name", sorted(_TORCH_DENSE))
@pytest.mark.parametrize("l2", [0.0, 1e-2])
def test_dense_optimizer_matches_torch_optim(name, l2):
    """Dense layers keep torch.optim's semantics (weight decay, no L1), to float rounding."""
    spec = OptimizerSpec(name, l1=0.05, l2=l2)
    torch.manual_seed(0)
    shapes = [(4, 3), (4,), (2, 2, 3)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt, ref_opt = DenseOptimizer(ours, spec), _TORCH_DENSE[name](ref, spec)
    for lr in LRS:
        grads = [torch.randn(s) for s in shapes]
        for p, q, g in zip(ours, ref, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        for group in ref_opt.param_groups:
            group["lr"] = lr
        opt.step(lr)
        ref_opt.step()
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_dense_optimizer_state_round_trips_and_refuses_ftrl():
    p = torch.nn.Parameter(torch.ones(3))
    opt = DenseOptimizer([p], OptimizerSpec("adam"))
    p.grad = torch.ones(3)
    opt.step(0.1)
    opt.zero_grad(set_to_none=True)
    assert p.grad is None
    q = torch.nn.Parameter(torch.ones(3))
    other = DenseOptimizer([q], OptimizerSpec("adam"))
    other.load_state_dict(opt.state_dict())
    assert other.param_groups == [{"lr": 0.1}]
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(other.state[0][k], v)
    with pytest.raises(ConfigError, match=r"ml\.fclayer\.optimizer=ftrl cannot run on the workers"):
        DenseOptimizer([p], OptimizerSpec("ftrl"))


@pytest.mark.parametrize("name", ["momentum", "adam", "adagrad", "rmsprop"])
def test_dense_optimizer_resumes_from_torch_optim_state(name):
    """Worker checkpoints written with torch.optim (its slot names) resume with the same
    numbers."""
    spec = OptimizerSpec(name, l2=1e-2)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, 3))
    q = torch.nn.Parameter(p.detach().clone())
    ref_opt = _TORCH_DENSE[name]([p], spec)
    grads = [torch.randn(4, 3) for _ in LRS]
    for lr, g in zip(LRS[:3], grads[:3], strict=True):
        p.grad = g.clone()
        ref_opt.param_groups[0]["lr"] = lr
        ref_opt.step()
    q.data.copy_(p.detach())
    opt = DenseOptimizer([q], spec)
    sd = ref_opt.state_dict()
    opt.load_state_dict({"state": sd["state"], "param_groups": [{"lr": LRS[2]}]})
    for lr, g in zip(LRS[3:], grads[3:], strict=True):
        p.grad, q.grad = g.clone(), g.clone()
        ref_opt.param_groups[0]["lr"] = lr
        ref_opt.step()
        opt.step(lr)
    torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
