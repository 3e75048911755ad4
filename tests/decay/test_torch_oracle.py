"""torch.optim.lr_scheduler is the oracle: lr_at(k) == torch's lr after k scheduler.step() calls,
within 1e-9 relative, for parameters drawn by hypothesis, long horizons, and the torch test
suite's own tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import decay
from tests.decay.conftest import assert_close, ours, torch_lrs

S = torch.optim.lr_scheduler
FAST = settings(
    max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

lrs = st.floats(min_value=1e-4, max_value=10.0)
gammas = st.floats(min_value=0.05, max_value=1.0)
factors = st.floats(min_value=0.01, max_value=1.0)
horizon = st.integers(min_value=1, max_value=400)


def _check(ours_sched: decay.StepSizeScheduler, make, n: int, lr: float) -> None:
    want, _ = torch_lrs(make, n, lr)
    assert_close(ours(ours_sched, n), want, lr)


@FAST
@given(lr=lrs, step=st.integers(1, 50), gamma=gammas, n=horizon)
def test_step_lr(lr: float, step: int, gamma: float, n: int) -> None:
    _check(decay.StepLR(lr, step, gamma), lambda o: S.StepLR(o, step, gamma), n, lr)


@FAST
@given(
    lr=lrs,
    ms=st.lists(st.integers(0, 300), min_size=1, max_size=6, unique=True).map(sorted),
    gamma=gammas,
    n=horizon,
)
def test_multistep_lr(lr: float, ms: list[int], gamma: float, n: int) -> None:
    _check(decay.MultiStepLR(lr, ms, gamma), lambda o: S.MultiStepLR(o, ms, gamma), n, lr)


@FAST
@given(lr=lrs, f=factors, t=st.integers(1, 100), n=horizon)
def test_constant_lr(lr: float, f: float, t: int, n: int) -> None:
    _check(decay.ConstantLR(lr, f, t), lambda o: S.ConstantLR(o, f, t), n, lr)


@FAST
@given(lr=lrs, s=factors, e=st.floats(0.0, 1.0), t=st.integers(1, 200), n=horizon)
def test_linear_lr(lr: float, s: float, e: float, t: int, n: int) -> None:
    _check(decay.LinearLR(lr, s, e, t), lambda o: S.LinearLR(o, s, e, t), n, lr)


@FAST
@given(lr=lrs, gamma=st.floats(0.9, 1.0), n=horizon)
def test_exponential_lr(lr: float, gamma: float, n: int) -> None:
    _check(decay.ExponentialLR(lr, gamma), lambda o: S.ExponentialLR(o, gamma), n, lr)


@FAST
@given(lr=lrs, t=st.integers(1, 200), p=st.floats(0.1, 4.0), n=horizon)
def test_polynomial_lr(lr: float, t: int, p: float, n: int) -> None:
    _check(decay.PolynomialLR(lr, t, p), lambda o: S.PolynomialLR(o, t, p), n, lr)


@FAST
@given(lr=lrs, t=st.integers(1, 150), eta=st.floats(0.0, 1e-3), n=st.integers(1, 700))
def test_cosine_annealing_lr_periodic(lr: float, t: int, eta: float, n: int) -> None:
    _check(decay.CosineAnnealingLR(lr, t, eta), lambda o: S.CosineAnnealingLR(o, t, eta), n, lr)


@FAST
@given(lr=lrs, t0=st.integers(1, 60), mult=st.integers(1, 3), eta=st.floats(0.0, 1e-3), n=horizon)
def test_cosine_annealing_warm_restarts(lr: float, t0: int, mult: int, eta: float, n: int) -> None:
    _check(
        decay.CosineAnnealingWarmRestarts(lr, t0, mult, eta),
        lambda o: S.CosineAnnealingWarmRestarts(o, t0, mult, eta),
        n,
        lr,
    )


@FAST
@given(
    base=st.floats(1e-4, 1.0),
    span=st.floats(0.0, 5.0),
    up=st.integers(1, 40),
    down=st.one_of(st.none(), st.integers(1, 40)),
    mode=st.sampled_from(["triangular", "triangular2", "exp_range"]),
    gamma=st.floats(0.98, 1.0),
    n=horizon,
    adam=st.booleans(),
)
def test_cyclic_lr_and_momentum(
    base: float, span: float, up: int, down: int | None, mode: str, gamma: float, n: int, adam: bool
) -> None:
    top = base + span
    want, want_m = torch_lrs(
        lambda o: S.CyclicLR(
            o, base, top, up, down, mode, gamma, base_momentum=0.8, max_momentum=0.9
        ),
        n,
        base,
        optimizer="adam" if adam else "sgd",
        momentum=True,
    )
    s = decay.CyclicLR(
        0.123, top, base_lr=base, step_size_up=up, step_size_down=down, mode=mode, gamma=gamma
    )
    assert_close(ours(s, n), want, top)
    assert want_m is not None
    assert_close(np.array([s.momentum_at(k) for k in range(n)]), want_m, 1.0)


@FAST
@given(
    top=lrs,
    total=st.integers(2, 300),
    pct=st.floats(0.05, 0.95),
    strategy=st.sampled_from(["cos", "linear"]),
    three=st.booleans(),
    div=st.floats(1.0, 100.0),
    fdiv=st.floats(1.0, 1e5),
)
def test_one_cycle_lr_and_momentum(
    top: float, total: int, pct: float, strategy: str, three: bool, div: float, fdiv: float
) -> None:
    try:
        s = decay.OneCycleLR(
            0.5,
            total,
            max_lr=top,
            pct_start=pct,
            anneal_strategy=strategy,
            div_factor=div,
            final_div_factor=fdiv,
            three_phase=three,
        )
    except decay.ParamError:
        assert float(pct * total) - 1 == 0.0  # the only rejected case: a zero-length phase
        return
    want, want_m = torch_lrs(
        lambda o: S.OneCycleLR(
            o,
            top,
            total_steps=total,
            pct_start=pct,
            anneal_strategy=strategy,
            div_factor=div,
            final_div_factor=fdiv,
            three_phase=three,
        ),
        total,
        top,
        momentum=True,
    )
    assert_close(ours(s, total), want, top)
    assert want_m is not None
    assert_close(np.array([s.momentum_at(k) for k in range(total)]), want_m, 1.0)
    # Past the end torch raises; we hold the final value.
    assert s.lr_at(total) == s.lr_at(total - 1) == s.lr_at(10 * total)


@FAST
@given(
    lr=lrs,
    mode=st.sampled_from(["min", "max"]),
    tmode=st.sampled_from(["rel", "abs"]),
    factor=st.floats(0.1, 0.9),
    patience=st.integers(0, 4),
    cooldown=st.integers(0, 3),
    min_lr=st.floats(0.0, 1e-3),
    metrics=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=60),
)
def test_reduce_on_plateau(
    lr: float,
    mode: str,
    tmode: str,
    factor: float,
    patience: int,
    cooldown: int,
    min_lr: float,
    metrics: list[float],
) -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    ts = S.ReduceLROnPlateau(
        opt,
        mode=mode,
        factor=factor,
        patience=patience,
        threshold_mode=tmode,
        cooldown=cooldown,
        min_lr=min_lr,
    )
    s = decay.ReduceLROnPlateau(
        lr,
        mode=mode,
        factor=factor,
        patience=patience,
        threshold_mode=tmode,
        cooldown=cooldown,
        min_lr=min_lr,
    )
    seen = []
    for i, m in enumerate(metrics):
        s.next()  # one update per metric (per-epoch stepping)
        ts.step(m)
        got = s.step(m)
        assert got == opt.param_groups[0]["lr"]
        seen.append(got)
        if i == len(metrics) // 2:  # resume mid-way from JSON
            state = json.loads(json.dumps(s.state_dict()))
            s = decay.ReduceLROnPlateau(
                lr,
                mode=mode,
                factor=factor,
                patience=patience,
                threshold_mode=tmode,
                cooldown=cooldown,
                min_lr=min_lr,
            )
            s.load_state_dict(state)
    # lr_at(k) replays the history: update k used the lr in effect after k metrics.
    assert [s.lr_at(k + 1) for k in range(len(metrics))] == seen
    assert s.lr_at(0) == lr


# --- the torch test suite's tables (test/optim/test_lrscheduler.py) ------------------------------


def test_torch_suite_tables() -> None:
    n = 12
    assert_close(
        ours(decay.StepLR(0.05, 3, 0.1), n),
        [0.05] * 3 + [0.005] * 3 + [0.0005] * 3 + [0.00005] * 3,
        0.05,
    )
    assert_close(
        ours(decay.MultiStepLR(0.05, [2, 5, 9], 0.1), n),
        [0.05] * 2 + [0.005] * 3 + [0.0005] * 4 + [0.00005] * 3,
        0.05,
    )
    assert_close(ours(decay.ConstantLR(0.05, 0.5, 5), 10), [0.025] * 5 + [0.05] * 5, 0.05)
    assert_close(
        ours(decay.PolynomialLR(0.05, 5, 0.9), 8),
        [(1 - x / 5) ** 0.9 * 0.05 for x in range(5)] + [0.0] * 3,
        0.05,
    )
    cyc = decay.CyclicLR(1, 5, step_size_up=4, base_momentum=1, max_momentum=5)
    assert ours(cyc, 11).tolist() == [1, 2, 3, 4, 5, 4, 3, 2, 1, 2, 3]
    assert [cyc.momentum_at(k) for k in range(11)] == [5, 4, 3, 2, 1, 2, 3, 4, 5, 4, 3]
    one = decay.OneCycleLR(
        0.5,
        10,
        max_lr=25,
        final_div_factor=2,
        anneal_strategy="linear",
        base_momentum=1,
        max_momentum=22,
    )
    assert_close(ours(one, 10), [1, 13, 25, 21.5, 18, 14.5, 11, 7.5, 4, 0.5], 25)
    assert_close(
        np.array([one.momentum_at(k) for k in range(10)]),
        [22, 11.5, 1, 4, 7, 10, 13, 16, 19, 22],
        22,
    )
    three = decay.OneCycleLR(
        0.5,
        10,
        max_lr=25,
        pct_start=0.4,
        final_div_factor=4,
        anneal_strategy="linear",
        three_phase=True,
    )
    assert_close(ours(three, 10), [1, 9, 17, 25, 17, 9, 1, 0.75, 0.5, 0.25], 25)


# --- long horizons -------------------------------------------------------------------------------

LONG = [
    ("StepLR", lambda b: decay.StepLR(b, 7, 0.999), lambda o: S.StepLR(o, 7, 0.999)),
    (
        "ExponentialLR",
        lambda b: decay.ExponentialLR(b, 0.99999),
        lambda o: S.ExponentialLR(o, 0.99999),
    ),
    (
        "CosineAnnealingLR",
        lambda b: decay.CosineAnnealingLR(b, 997, 1e-4),
        lambda o: S.CosineAnnealingLR(o, 997, 1e-4),
    ),
    (
        "CosineAnnealingWarmRestarts",
        lambda b: decay.CosineAnnealingWarmRestarts(b, 10, 2, 1e-5),
        lambda o: S.CosineAnnealingWarmRestarts(o, 10, 2, 1e-5),
    ),
    (
        "CyclicLR",
        lambda b: decay.CyclicLR(
            b, 3 * b, step_size_up=333, step_size_down=111, mode="triangular2"
        ),
        lambda o: S.CyclicLR(o, 0.1, 0.3, 333, 111, "triangular2"),
    ),
    (
        "LinearLR",
        lambda b: decay.LinearLR(b, 0.25, 0.5, 50_000),
        lambda o: S.LinearLR(o, 0.25, 0.5, 50_000),
    ),
    (
        "PolynomialLR",
        lambda b: decay.PolynomialLR(b, 60_000, 2.0),
        lambda o: S.PolynomialLR(o, 60_000, 2.0),
    ),
]


@pytest.mark.parametrize("name,mk,mk_torch", LONG, ids=[c[0] for c in LONG])
def test_long_horizon_100k(name: str, mk, mk_torch) -> None:
    n = 100_000
    want, _ = torch_lrs(mk_torch, n, 0.1)
    got = ours(mk(0.1), n)
    assert_close(got, want, 0.1)


def test_constant_lr_factor_zero_is_rejected_where_torch_divides_by_zero() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    t = S.ConstantLR(opt, factor=0.0, total_iters=2)
    opt.step()
    t.step()
    opt.step()
    with pytest.raises(ZeroDivisionError):
        t.step()
    with pytest.raises(
        decay.ParamError, match=r"factor=0.0 is not valid: expected a number in \(0, 1\]"
    ):
        decay.ConstantLR(1.0, factor=0.0, total_iters=2)


def test_cosine_past_t_max_is_periodic_like_torch() -> None:
    s = decay.CosineAnnealingLR(1.0, 5)
    want = [
        1.0,
        0.904508,
        0.654508,
        0.345492,
        0.095492,
        0.0,
        0.095492,
        0.345492,
        0.654508,
        0.904508,
        1.0,
        0.904508,
    ]
    assert [round(v, 6) for v in ours(s, 12)] == want
    assert math.isclose(s.lr_at(15), 0.0, abs_tol=1e-15)
