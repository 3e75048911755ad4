"""Warmup, SequentialLR and ChainedScheduler: boundaries at ±1 and torch as the oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import decay
from tests.decay.conftest import assert_close, ours, torch_lrs

S = torch.optim.lr_scheduler
FAST = settings(max_examples=25, deadline=None, derandomize=True)

# (ours, torch) child factories whose torch recursive form equals the closed form.
CHILDREN = {
    "StepLR": (lambda b: decay.StepLR(b, 3, 0.5), lambda o: S.StepLR(o, 3, 0.5)),
    "MultiStepLR": (
        lambda b: decay.MultiStepLR(b, [2, 7], 0.3),
        lambda o: S.MultiStepLR(o, [2, 7], 0.3),
    ),
    "ConstantLR": (lambda b: decay.ConstantLR(b, 0.25, 4), lambda o: S.ConstantLR(o, 0.25, 4)),
    "LinearLR": (lambda b: decay.LinearLR(b, 0.1, 1.0, 5), lambda o: S.LinearLR(o, 0.1, 1.0, 5)),
    "ExponentialLR": (lambda b: decay.ExponentialLR(b, 0.9), lambda o: S.ExponentialLR(o, 0.9)),
    "PolynomialLR": (lambda b: decay.PolynomialLR(b, 8, 2.0), lambda o: S.PolynomialLR(o, 8, 2.0)),
    "CosineAnnealingLR": (
        lambda b: decay.CosineAnnealingLR(b, 6),
        lambda o: S.CosineAnnealingLR(o, 6),
    ),
}
names = st.sampled_from(sorted(CHILDREN))


@FAST
@given(
    kinds=st.lists(names, min_size=1, max_size=4),
    gaps=st.lists(st.integers(1, 12), min_size=3, max_size=3),
    lr=st.floats(1e-3, 2.0),
)
def test_sequential_matches_torch(kinds: list[str], gaps: list[int], lr: float) -> None:
    milestones = []
    m = 0
    for g in gaps[: len(kinds) - 1]:
        m += g
        milestones.append(m)
    n = m + 25

    def make(o: torch.optim.Optimizer) -> object:
        return S.SequentialLR(o, [CHILDREN[k][1](o) for k in kinds], milestones)

    want, _ = torch_lrs(make, n, lr)
    s = decay.SequentialLR([CHILDREN[k][0](lr) for k in kinds], milestones)
    assert_close(ours(s, n), want, lr)


@FAST
@given(
    kinds=st.lists(
        st.sampled_from(
            ["StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR"]
        ),
        min_size=1,
        max_size=3,
    ),
    lr=st.floats(1e-3, 2.0),
)
def test_chained_matches_torch(kinds: list[str], lr: float) -> None:
    n = 40

    def make(o: torch.optim.Optimizer) -> object:
        return S.ChainedScheduler([CHILDREN[k][1](o) for k in kinds])

    want, _ = torch_lrs(make, n, lr)
    s = decay.ChainedScheduler([CHILDREN[k][0](lr) for k in kinds])
    assert_close(ours(s, n), want, lr)


def test_torch_reference_tables() -> None:
    seq = decay.SequentialLR([decay.ExponentialLR(0.05, 0.8), decay.StepLR(0.05, 4, 0.1)], [3])
    assert_close(ours(seq, 11), [0.05, 0.04, 0.032] + [0.05] * 4 + [0.005] * 4, 0.05)
    seq = decay.SequentialLR([decay.ConstantLR(0.05, 0.1, 3), decay.ExponentialLR(0.05, 0.9)], [3])
    assert_close(ours(seq, 8), [0.005] * 3 + [0.05 * 0.9**x for x in range(5)], 0.05)
    chain = decay.ChainedScheduler(
        [decay.ConstantLR(0.05, 0.1, 20), decay.ExponentialLR(0.05, 0.9)]
    )
    assert [round(chain.lr_at(k), 6) for k in range(18, 23)] == [
        0.00075,
        0.000675,
        0.006079,
        0.005471,
        0.004924,
    ]
    lin_cos = decay.SequentialLR(
        [decay.LinearLR(1.0, 0.1, 1.0, 3), decay.CosineAnnealingLR(1.0, 4)], [3]
    )
    want = [0.1, 0.4, 0.7, 1.0, 0.853553, 0.5, 0.146447, 0.0, 0.146447, 0.5]
    assert [round(lin_cos.lr_at(k), 6) for k in range(10)] == want


def test_sequential_boundaries_plus_minus_one() -> None:
    a = decay.ConstantLearningRate(1.0)
    b = decay.ExponentialLR(1.0, 0.5)
    c = decay.StepLR(1.0, 1, 0.1)
    s = decay.SequentialLR([a, b, c], [4, 7])
    assert [s.lr_at(k) for k in (3, 4, 5)] == [1.0, 1.0, 0.5]  # b starts at its own 0
    assert [s.lr_at(k) for k in (6, 7, 8)] == [0.25, 1.0, pytest.approx(0.1)]


def test_warmup_wrapper_boundaries_plus_minus_one() -> None:
    inner = decay.StepLR(1.0, 2, 0.5)
    w = decay.Warmup(inner, 4)
    assert [w.lr_at(k) for k in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert [w.lr_at(k) for k in (3, 4, 5, 6, 7)] == [0.75, 1.0, 1.0, 0.5, 0.5]
    assert decay.Warmup(inner, 0).lr_at(0) == 1.0  # W = 0: the inner schedule itself
    # momentum of the inner schedule holds its first value during the warmup
    cyc = decay.CyclicLR(0.1, 1.0, step_size_up=2)
    wc = decay.Warmup(cyc, 3)
    assert wc.momentum_at(0) == cyc.momentum_at(0) == 0.9
    assert wc.momentum_at(4) == cyc.momentum_at(1)


def test_warmup_boundary_signal_follows_inner() -> None:
    w = decay.Warmup(decay.ConstantLearningRate(1.0, intervals=2), 3)
    assert [w._boundary(c) for c in range(8)] == [
        False,
        False,
        False,
        True,
        False,
        True,
        False,
        True,
    ]


def test_composition_errors() -> None:
    with pytest.raises(
        ValueError,
        match=r"SequentialLR: milestones=\[5, 5\] is not valid: expected a strictly increasing list of integers >= 1",
    ):
        decay.SequentialLR([decay.NoDecay(1.0)] * 3, [5, 5])
    with pytest.raises(ValueError, match=r"SequentialLR: milestones=\[0\] is not valid"):
        decay.SequentialLR([decay.NoDecay(1.0)] * 2, [0])
    with pytest.raises(
        ValueError,
        match=r"SequentialLR: milestones=\[3, 4\] is not valid: expected 1 integer\(s\), one fewer than the 2 schedules",
    ):
        decay.SequentialLR([decay.NoDecay(1.0)] * 2, [3, 4])
    with pytest.raises(ValueError, match=r"ChainedScheduler: schedulers is required"):
        decay.ChainedScheduler([])
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau cannot be composed"):
        decay.ChainedScheduler([decay.NoDecay(1.0), decay.ReduceLROnPlateau(1.0)])
    with pytest.raises(
        ValueError, match=r"Warmup: warmup_steps=-2 is not valid: expected an integer >= 0"
    ):
        decay.Warmup(decay.NoDecay(1.0), -2)
