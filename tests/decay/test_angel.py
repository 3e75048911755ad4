"""Angel's four: reference values from Angel's code semantics, and a literal replay of Angel's
Scala ``next()`` loops as the oracle (lr_at(k) == Angel's (k+1)-th call, bugs fixed)."""

from __future__ import annotations

import math
import warnings

import pytest

import decay


def angel_warm_restarts(eta: float, alpha: float, interval: int, n: int) -> list[float]:
    """WarmRestarts.scala, transcribed: returns the values of calls 1..n."""
    eta_max, eta_min = eta, eta / 10
    current, num_restart = 0.0, 0
    out = []
    for _ in range(n):
        current += 1
        value = eta_min + 0.5 * (eta_max - eta_min) * (1 + math.cos(current / interval * math.pi))
        if current == interval:
            current = 0
            interval *= 2
            num_restart += 1
            eta_max = eta_max / math.sqrt(1.0 + num_restart * alpha)
        out.append(value)
    return out


def angel_boundaries_warm_restarts(interval: int, n: int) -> list[bool]:
    """isIntervalBoundary after 0..n calls (current == 0)."""
    current, out = 0, [True]
    for _ in range(n):
        current += 1
        if current == interval:
            current = 0
            interval *= 2
        out.append(current == 0)
    return out


def r(values: list[float], nd: int) -> list[float]:
    return [round(v, nd) for v in values]


def test_standard_decay_reference_values() -> None:
    s = decay.StandardDecay(1.0, alpha=0.001)
    assert r([s.lr_at(k) for k in range(3)], 5) == [0.9995, 0.999, 0.9985]
    s = decay.StandardDecay(1.0, alpha=0.5)
    assert r([s.lr_at(k) for k in range(6)], 4) == [0.8165, 0.7071, 0.6325, 0.5774, 0.5345, 0.5]
    # Angel's effective default (alpha = 0.5 through ml.learn.decay), lr 0.5
    s = decay.StandardDecay(0.5, alpha=0.5)
    assert r([s.next() for _ in range(5)], 6) == [0.408248, 0.353553, 0.316228, 0.288675, 0.267261]
    assert s.lr_at(29) == 0.125  # call 30: 0.5/sqrt(16)


def test_standard_decay_formula_exact() -> None:
    s = decay.StandardDecay(0.3, alpha=0.01)
    for k in (0, 1, 10, 999, 123_456):
        assert s.lr_at(k) == 0.3 / math.sqrt(1.0 + 0.01 * (k + 1))


def test_correction_decay_fixed_first_call() -> None:
    # Angel: inf, 0.49975, 0.499002 (first call divides by zero); fixed: the same without the inf.
    s = decay.CorrectionDecay(0.5)
    assert r([s.lr_at(k) for k in range(2)], 6) == [0.49975, 0.499002]
    s = decay.CorrectionDecay(1.0, alpha=0.001, beta=0.9)
    assert r([s.lr_at(k) for k in range(3)], 5) == [0.9995, 0.52579, 0.36845]
    for k in (0, 5, 1000):
        t = k + 1
        assert s.lr_at(k) == 1.0 / math.sqrt(1 + 0.001 * t) * (1 - 0.9) / (1 - 0.9**t)
    assert all(math.isfinite(s.lr_at(k)) for k in range(2000))
    # beta = 0: no correction
    assert decay.CorrectionDecay(1.0, alpha=0.0, beta=0.0).lr_at(7) == 1.0


def test_warm_restarts_reference_values() -> None:
    w = decay.WarmRestarts(0.5)
    assert r([w.lr_at(k) for k in range(3)], 6) == [0.499889, 0.499556, 0.499001]
    assert round(w.lr_at(29), 6) == 0.407252
    w = decay.WarmRestarts(1.0, alpha=0.001)
    calls = (1, 99, 100, 101, 300, 301)
    assert r([w.lr_at(c - 1) for c in calls], 5) == [0.99978, 0.10022, 0.1, 0.99944, 0.1, 0.99849]


@pytest.mark.parametrize(
    "eta,alpha,interval", [(1.0, 0.001, 100), (0.5, 0.3, 3), (2.0, 0.0, 1), (0.1, 1.0, 7)]
)
def test_warm_restarts_replays_angel_code_exactly(eta: float, alpha: float, interval: int) -> None:
    n = 5000
    want = angel_warm_restarts(eta, alpha, interval, n)
    w = decay.WarmRestarts(eta, alpha=alpha, intervals=interval)
    assert [w.next() for _ in range(n)] == want  # bit-identical, sequential
    # random access (cold cache, backwards) gives the same numbers
    w2 = decay.WarmRestarts(eta, alpha=alpha, intervals=interval)
    for k in (4999, 0, 2500, 1, interval - 1, interval, 3 * interval - 1, 3 * interval):
        if k < n:
            assert w2.lr_at(k) == want[k]
    bounds = angel_boundaries_warm_restarts(interval, n)
    w3 = decay.WarmRestarts(eta, alpha=alpha, intervals=interval)
    got = [w3.is_interval_boundary()]
    for _ in range(n):
        w3.next()
        got.append(w3.is_interval_boundary())
    assert got == bounds


def test_warm_restarts_eta_min_override() -> None:
    w = decay.WarmRestarts(1.0, intervals=4, eta_min=0.0)
    assert w.lr_at(3) == 0.0  # the last call of a cycle is exactly eta_min
    assert decay.WarmRestarts(1.0, intervals=4).lr_at(3) == pytest.approx(0.1, abs=1e-15)


@pytest.mark.parametrize(
    "cls", [decay.ConstantLearningRate, decay.StandardDecay, decay.CorrectionDecay]
)
def test_interval_boundary_every_I_calls(cls: type) -> None:
    s = cls(1.0, intervals=3)
    flags = [s.is_interval_boundary()]
    for _ in range(9):
        s.next()
        flags.append(s.is_interval_boundary())
    assert flags == [True, False, False, True, False, False, True, False, False, True]


def test_constant_learning_rate() -> None:
    s = decay.ConstantLearningRate(0.25)
    assert {s.next() for _ in range(100)} == {0.25}


def test_angel_parameter_errors() -> None:
    with pytest.raises(
        ValueError, match=r"CorrectionDecay: beta=1.0 is not valid: expected a number in \[0, 1\)"
    ):
        decay.CorrectionDecay(1.0, beta=1.0)
    with pytest.raises(ValueError, match=r"CorrectionDecay: beta=-0.1 is not valid"):
        decay.CorrectionDecay(1.0, beta=-0.1)
    with pytest.raises(
        ValueError, match=r"StandardDecay: alpha=-1.0 is not valid: expected a number >= 0"
    ):
        decay.StandardDecay(1.0, alpha=-1.0)
    with pytest.raises(
        ValueError, match=r"WarmRestarts: intervals=0 is not valid: expected an integer >= 1"
    ):
        decay.WarmRestarts(1.0, intervals=0)
    with pytest.raises(
        ValueError,
        match=r"ConstantLearningRate: lr=nan is not valid: expected a finite number >= 0",
    ):
        decay.ConstantLearningRate(float("nan"))


def test_from_conf_standard_decay_reads_opt_decay_alpha() -> None:
    s = decay.from_conf({"ml.opt.decay.alpha": "0.5", "ml.learn.rate": "0.5"})
    assert isinstance(s, decay.StandardDecay)
    assert s.lr_at(29) == 0.125
    # default alpha is ml.opt.decay.alpha's 0.001 (Angel silently used 0.5)
    assert decay.from_conf({}).lr_at(0) == 0.5 / math.sqrt(1.001)


def test_deprecated_learn_decay_warns_and_is_used() -> None:
    with pytest.warns(decay.DecayDeprecationWarning, match=r"ml.learn.decay=0.5 is deprecated"):
        s = decay.from_conf({"ml.learn.decay": "0.5", "ml.learn.rate": "0.5"})
    assert s.lr_at(29) == 0.125


def test_deprecated_learn_decay_loses_to_opt_decay_alpha() -> None:
    with pytest.warns(
        decay.DecayDeprecationWarning, match=r"ignored because ml.opt.decay.alpha is set"
    ):
        s = decay.from_conf({"ml.learn.decay": "0.5", "ml.opt.decay.alpha": "0.0"})
    assert s.lr_at(100) == 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decay.from_conf({"ml.opt.decay.alpha": "0.0"})  # no warning without ml.learn.decay
