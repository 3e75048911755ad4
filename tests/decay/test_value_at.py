"""StepSizeScheduler.value_at: a schedule read at a real position (a fractional epoch)."""

from __future__ import annotations

import math

import pytest

import decay


def test_value_at_reads_the_formula_between_updates():
    step = decay.StepLR(1.0, step_size=2, gamma=0.5)
    assert step.value_at(1.99) == (1.0, None) and step.value_at(2.0) == (0.5, None)
    cos = decay.CosineAnnealingLR(1.0, t_max=4)
    assert cos.value_at(1.5)[0] == pytest.approx((1 + math.cos(math.pi * 1.5 / 4)) / 2)
    for k in range(6):  # at whole positions it is lr_at and momentum_at
        one = decay.OneCycleLR(0.1, total_steps=6)
        assert one.value_at(k) == (one.lr_at(k), one.momentum_at(k))
        cyc = decay.CyclicLR(0.1, max_lr=1.0, step_size_up=2, mode="triangular2")
        assert cyc.value_at(k) == (cyc.lr_at(k), cyc.momentum_at(k))
    lin = decay.OneCycleLR(0.1, total_steps=6, anneal_strategy="linear", cycle_momentum=False)
    assert lin.value_at(3) == (lin.lr_at(3), None)


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf])
def test_value_at_refuses_a_position_outside_the_schedule(bad):
    with pytest.raises(
        ValueError, match=r"^position x=.* is not valid: expected a finite number >= 0$"
    ):
        decay.StepLR(1.0, step_size=2).value_at(bad)
