"""The momentum cycle of CyclicLR and OneCycleLR applied by the shards' and the workers'
optimizers, against torch.optim driven by torch's own schedulers on the same gradients.

torch.optim.SGD(momentum) keeps ``buf = m·buf + g`` (dampening 0; the first step ``buf = g``,
which is ``m·0 + g``): angelps' Momentum is the same formula, so with the schedule's momentum
each step the weights agree to float rounding. Adam's bias correction uses the step's beta1
(``1 − β1^t``), as torch's does.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import decay
from angelps.client import wire
from angelps.optim import DenseOptimizer, apply, slot_widths
from angelps.rates import StepRates
from angelps.server.shard import ParameterShard
from angelps.step_call import StepCall
from angelps.table import OptimizerSpec, TableSpec

N = 40  # updates: through OneCycleLR's whole cycle (warm-up, anneal, the end)


def _grads(rows: int = 4, cols: int = 3, n: int = N, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rows, cols)) for _ in range(n)]


def _torch_run(make_opt, make_sched, w0: np.ndarray, grads: list[np.ndarray]):
    """torch's weights after each step, and the (lr, momentum) each step used."""
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = make_opt([p])
    sched = make_sched(opt)
    used = []
    for g in grads:
        group = opt.param_groups[0]
        mom = group["betas"][0] if "betas" in group else group["momentum"]
        used.append((group["lr"], mom))
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        sched.step()
    return p.detach().numpy(), used


def _ours(spec: OptimizerSpec, sched: decay.StepSizeScheduler, w0, grads, dtype=np.float64):
    w = w0.astype(dtype)
    state = {k: np.zeros((w.shape[0], n), dtype) for k, n in slot_widths(spec, w.shape[1]).items()}
    for k, g in enumerate(grads):
        apply(spec, w, state, g.astype(dtype), sched.lr_at(k), sched.momentum_at(k))
    return w


CASES = [
    (
        "sgd-onecycle",
        OptimizerSpec("momentum", momentum=0.5),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=N),
        lambda: decay.OneCycleLR(0.2, total_steps=N),
    ),
    (
        "adam-onecycle",
        OptimizerSpec("adam", beta1=0.9, beta2=0.99, eps=1e-8),
        lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.9, 0.99), eps=1e-8),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=0.05, total_steps=N, pct_start=0.25, three_phase=True
        ),
        lambda: decay.OneCycleLR(0.05, total_steps=N, pct_start=0.25, three_phase=True),
    ),
    (
        "sgd-cyclic",
        OptimizerSpec("momentum", momentum=0.9, l2=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda o: torch.optim.lr_scheduler.CyclicLR(
            o, base_lr=0.01, max_lr=0.1, step_size_up=7, step_size_down=5, mode="triangular2"
        ),
        lambda: decay.CyclicLR(
            0.01, max_lr=0.1, step_size_up=7, step_size_down=5, mode="triangular2"
        ),
    ),
    (
        "adam-cyclic",
        OptimizerSpec("adam", beta1=0.9, beta2=0.999, eps=1e-6),
        lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.9, 0.999), eps=1e-6),
        lambda o: torch.optim.lr_scheduler.CyclicLR(
            o, base_lr=0.001, max_lr=0.01, step_size_up=6, base_momentum=0.7, max_momentum=0.95
        ),
        lambda: decay.CyclicLR(
            0.001, max_lr=0.01, step_size_up=6, base_momentum=0.7, max_momentum=0.95
        ),
    ),
]


@pytest.mark.parametrize(("case", "spec", "make_opt", "make_torch", "make_ours"), CASES)
def test_shard_optimizer_follows_the_momentum_cycle_as_torch(
    case, spec, make_opt, make_torch, make_ours
):
    w0 = np.random.default_rng(1).standard_normal((4, 3))
    grads = _grads()
    want, used = _torch_run(make_opt, make_torch, w0, grads)
    ours = make_ours()
    # the schedule gives what torch's scheduler wrote into the optimizer before each step
    for k, (lr, m) in enumerate(used):
        assert ours.lr_at(k) == pytest.approx(lr, rel=1e-12, abs=1e-15)
        assert ours.momentum_at(k) == pytest.approx(m, rel=1e-12)
    assert len({m for _, m in used}) > 5  # the momentum really moves
    np.testing.assert_allclose(_ours(spec, ours, w0, grads), want, rtol=1e-6, atol=1e-9)
    # the torch path of apply (GPU shards) and float32 rows agree too
    w32 = _ours(spec, ours, w0, grads, np.float32)
    np.testing.assert_allclose(w32, want, rtol=1e-4, atol=1e-5)
    wt = torch.from_numpy(w0.copy())
    state = {k: torch.zeros((4, n), dtype=torch.float64) for k, n in slot_widths(spec, 3).items()}
    for k, g in enumerate(grads):
        apply(spec, wt, state, torch.from_numpy(g), ours.lr_at(k), ours.momentum_at(k))
    np.testing.assert_allclose(wt.numpy(), want, rtol=1e-6, atol=1e-9)


def test_the_momentum_cycle_is_needed_to_match_torch():
    """Without the schedule's momentum the weights differ: the test above can fail."""
    _, spec, make_opt, make_torch, make_ours = CASES[0]
    w0 = np.random.default_rng(1).standard_normal((4, 3))
    grads = _grads()
    want, _ = _torch_run(make_opt, make_torch, w0, grads)
    sched = make_ours()
    w = w0.copy()
    state = {k: np.zeros((4, n)) for k, n in slot_widths(spec, 3).items()}
    for k, g in enumerate(grads):
        apply(spec, w, state, g, sched.lr_at(k))  # no momentum: the configured 0.5
    assert np.abs(w - want).max() > 1e-3


@pytest.mark.parametrize(("case", "spec", "make_opt", "make_torch", "make_ours"), CASES)
def test_dense_optimizer_follows_the_momentum_cycle_as_torch(
    case, spec, make_opt, make_torch, make_ours
):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2).double()
    twin = torch.nn.Linear(3, 2).double()
    twin.load_state_dict(layer.state_dict())
    ref = make_opt(list(twin.parameters()))
    ref_sched = make_torch(ref)
    ours = DenseOptimizer(list(layer.parameters()), spec)
    sched = make_ours()
    x = torch.randn(N, 5, 3, dtype=torch.float64)
    for k in range(N):
        for mod in (layer, twin):
            mod(x[k]).pow(2).sum().backward()
        ref.step()
        ref_sched.step()
        ref.zero_grad()
        ours.step(sched.lr_at(k), sched.momentum_at(k))
        ours.zero_grad()
    for a, b in zip(layer.parameters(), twin.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-9)


def test_dense_sgd_ignores_a_momentum():
    """Plain SGD has no momentum to cycle (the learner refuses that configuration)."""
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt = DenseOptimizer([p], OptimizerSpec("sgd"))
    for _ in range(2):
        p.grad = torch.ones(2, dtype=torch.float64)
        opt.step(0.1, momentum=0.9)
    np.testing.assert_allclose(p.detach().numpy(), [0.8, 0.8])


def test_shard_applies_step_rates_per_table_and_under_bsp():
    """A push carrying StepRates: each table its (lr, momentum); BSP applies the sum of the
    workers' pushes with the rates of that clock."""
    mom = OptimizerSpec("momentum", momentum=0.0)
    a = TableSpec("a", rows=4, cols=2, init="zeros", optimizer=mom)
    b = TableSpec("b", rows=4, cols=2, init="zeros", optimizer=mom)
    shard = ParameterShard(0, 1, [a, b], num_workers=2)
    keys, g = np.arange(4), np.ones((4, 2), np.float32)
    w = {"a": np.zeros((4, 2)), "b": np.zeros((4, 2))}
    v = {"a": np.zeros((4, 2)), "b": np.zeros((4, 2))}
    steps = [StepRates(0.1, 0.9, {"b": (0.2, 0.5)}), StepRates(0.05, 0.8, {"b": (0.3, 0.0)})]
    for clock, rates in enumerate(steps):
        for worker in (0, 1):
            shard.push(worker, clock, {"a": (keys, g), "b": (keys, g)}, rates)
        for name in ("a", "b"):
            lr, m = rates.of(name)
            v[name] = m * v[name] + 2 * g
            w[name] -= lr * v[name]
    got = shard.pull({"a": keys, "b": keys})
    for name in ("a", "b"):
        np.testing.assert_allclose(got[name], w[name], rtol=1e-6)


def test_step_rates_cross_the_wire_and_bad_ones_are_refused():
    rates = StepRates(0.125, 0.9, {"emb": (0.5, None)})
    got = wire.decode_request(*_frame(wire.encode_request(StepCall(1, 3, {}, rates)))).step
    assert got == rates and isinstance(got, StepRates) and got.of("emb") == (0.5, None)
    assert got.of("other") == (0.125, 0.9)
    head = {"w": 0, "c": 0, "r": False, "push": None, "pull": None}
    for bad in ([0.1, 1.5, {}], [0.1, None], [-1.0, None, {}], [0.1, None, {"t": [0.1]}]):
        with pytest.raises(ValueError, match="malformed request header: lr"):
            wire.decode_request(json.dumps(dict(head, lr=bad)).encode(), b"")
    with pytest.raises(ValueError, match=r"momentum 1.0 must be a number in \[0, 1\)"):
        StepRates(0.1, 1.0)


def _frame(frames):
    raw = b"".join(bytes(f) for f in frames)
    hlen, blen = wire.PREFIX.unpack_from(raw)
    off = wire.PREFIX.size
    return raw[off : off + hlen], raw[off + hlen : off + hlen + blen]
