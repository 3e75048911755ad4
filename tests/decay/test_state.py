"""Exact resume (state_dict -> JSON -> load_state_dict at random k), the count contract
(next/peek/advance, skipped updates) and updates per epoch under gradient accumulation."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import decay

FAST = settings(max_examples=15, deadline=None, derandomize=True)

# One configuration per properties-selectable schedule.
CONFS: dict[str, dict[str, str]] = {
    "ConstantLearningRate": {},
    "StandardDecay": {"ml.opt.decay.alpha": "0.1"},
    "CorrectionDecay": {"ml.opt.decay.beta": "0.9"},
    "WarmRestarts": {"ml.opt.decay.intervals": "3", "ml.opt.decay.alpha": "0.2"},
    "StepLR": {"ml.opt.decay.step.size": "4"},
    "MultiStepLR": {"ml.opt.decay.milestones": "3,9,20"},
    "ConstantLR": {},
    "LinearLR": {"ml.opt.decay.total.iters": "30"},
    "ExponentialLR": {"ml.opt.decay.gamma": "0.97"},
    "PolynomialLR": {"ml.opt.decay.total.iters": "40", "ml.opt.decay.power": "2"},
    "CosineAnnealingLR": {"ml.opt.decay.t.max": "17"},
    "CosineAnnealingWarmRestarts": {"ml.opt.decay.t.0": "5", "ml.opt.decay.t.mult": "2"},
    "CyclicLR": {
        "ml.opt.decay.max.lr": "2",
        "ml.opt.decay.step.size.up": "6",
        "ml.opt.decay.mode": "exp_range",
        "ml.opt.decay.gamma": "0.99",
    },
    "OneCycleLR": {"ml.opt.decay.total.steps": "60", "ml.opt.decay.three.phase": "true"},
    "WarmupCosine": {"ml.opt.decay.warmup.steps": "5"},
    "WarmupLinear": {"ml.opt.decay.warmup.steps": "5"},
    "WarmupConstant": {"ml.opt.decay.warmup.steps": "5"},
    "WarmupStableDecay": {
        "ml.opt.decay.warmup.steps": "5",
        "ml.opt.decay.stable.steps": "10",
        "ml.opt.decay.decay.type": "sqrt",
    },
    "Rex": {"ml.opt.decay.warmup.steps": "5", "ml.opt.decay.rex.alpha": "2"},
    "InverseSqrt": {"ml.opt.decay.warmup.steps": "5"},
    "NoDecay": {},
    "SequentialLR": {
        "ml.opt.decay.schedulers": "LinearLR,WarmRestarts",
        "ml.opt.decay.milestones": "5",
        "ml.opt.decay.1.intervals": "4",
    },
    "ChainedScheduler": {
        "ml.opt.decay.schedulers": "StepLR,CyclicLR",
        "ml.opt.decay.0.step.size": "7",
        "ml.opt.decay.1.max.lr": "1",
        "ml.opt.decay.1.step.size.up": "3",
    },
    "ReduceLROnPlateau": {},
}


def build(name: str) -> decay.StepSizeScheduler:
    return decay.from_conf({"ml.opt.decay.class.name": name, **CONFS[name]}, total_steps=100)


def test_every_schedule_has_a_resume_case() -> None:
    assert set(CONFS) == set(decay.names())


@pytest.mark.parametrize("name", sorted(n for n in CONFS if n != "ReduceLROnPlateau"))
@FAST
@given(k=st.integers(0, 150))
def test_resume_at_random_k_is_exact(name: str, k: int) -> None:
    ref = build(name)
    seq = [ref.next() for _ in range(k + 40)]
    a = build(name)
    for _ in range(k):
        a.next()
    state = json.loads(json.dumps(a.state_dict()))
    assert state == {"count": k}
    b = build(name)
    b.load_state_dict(state)
    assert b.count == k
    assert [b.next() for _ in range(40)] == seq[k:]
    assert b.is_interval_boundary() == ref.is_interval_boundary()


def test_plateau_with_warmup_resumes_exactly() -> None:
    def make() -> decay.StepSizeScheduler:
        return decay.from_conf(
            {
                "ml.opt.decay.class.name": "ReduceLROnPlateau",
                "ml.opt.decay.warmup.steps": "3",
                "ml.opt.decay.patience": "1",
                "ml.learn.rate": "1.0",
            }
        )

    metrics = [5, 4, 4, 4, 4, 3, 3, 3, 3, 3]
    ref = make()
    assert ref.metric_driven
    lrs = []
    for m in metrics:
        lrs.append(ref.next())
        ref.step(m)
    # 2 bad metrics in a row (patience 1) reduce x0.1 from the next update on
    assert lrs == [
        0.0,
        1 / 3,
        2 / 3,
        1.0,
        0.1,
        0.1,
        0.1,
        0.1,
        0.010000000000000002,
        0.010000000000000002,
    ]
    a = make()
    for m in metrics[:6]:
        a.next()
        a.step(m)
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for m, want in zip(metrics[6:], lrs[6:], strict=True):
        assert b.next() == want
        b.step(m)
    assert b.state_dict() == ref.state_dict()
    # history: lr_at replays the reductions at the updates where they happened
    assert [b.lr_at(k) for k in range(len(metrics))] == lrs


def test_plateau_state_is_json_safe_and_validated() -> None:
    p = decay.ReduceLROnPlateau(1.0, mode="max", patience=0)
    assert p.state_dict()["best"] is None  # torch keeps -inf, which JSON cannot carry
    p.step(1.0)
    p.step(0.5)
    s = json.loads(json.dumps(p.state_dict()))
    assert s["changes"] == [[0, 0.1]]
    q = decay.ReduceLROnPlateau(1.0, mode="max", patience=0)
    q.load_state_dict(s)
    assert q.current_lr == 0.1 and q.best == 1.0
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau.load_state_dict: malformed state"):
        q.load_state_dict({"count": 0})
    with pytest.raises(
        ValueError,
        match=r"ReduceLROnPlateau.step: metric=nan is not valid: expected a finite number",
    ):
        q.step(float("nan"))


def test_load_state_dict_errors() -> None:
    s = decay.NoDecay(1.0)
    with pytest.raises(
        ValueError,
        match=r"NoDecay.load_state_dict: count=-3 is not valid: expected an integer >= 0",
    ):
        s.load_state_dict({"count": -3})
    with pytest.raises(
        ValueError, match=r"NoDecay.load_state_dict: expected a mapping with a 'count'"
    ):
        s.load_state_dict({"step": 3})


def test_peek_advance_and_skipped_updates() -> None:
    s = decay.StepLR(1.0, 2, 0.5)
    applied = [True, False, True, True, False, False, True]  # False: AMP skipped the update
    used = []
    for ok in applied:
        lr = s.peek()
        used.append(lr)
        if ok:
            s.advance()
    # a skipped update retries with the same step size; the schedule counts applied updates only
    assert used == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    assert s.count == 4
    with pytest.raises(ValueError, match=r"advance\(n\): n=-1 is not valid"):
        s.advance(-1)


def test_schedulers_pickle_for_shipping_to_workers() -> None:
    for name in decay.names():
        s = build(name)
        for _ in range(7):
            s.next()
        t = pickle.loads(pickle.dumps(s))
        assert t.count == 7 and [t.lr_at(k) for k in range(30)] == [s.lr_at(k) for k in range(30)]


def test_describe_names_schedule_and_parameters() -> None:
    s = decay.from_conf({"ml.opt.decay.class.name": "steplr", "ml.opt.decay.step.size": "3"})
    assert s.describe() == "StepLR(lr=0.5, step_size=3, gamma=0.1)"
    seq = decay.SequentialLR([decay.NoDecay(1.0), decay.ExponentialLR(1.0, 0.5)], [4])
    assert (
        repr(seq)
        == "SequentialLR(schedulers=[NoDecay(lr=1.0), ExponentialLR(lr=1.0, gamma=0.5)], milestones=[4])"
    )


@pytest.mark.parametrize(
    "n,batch,workers,accum,drop_last,want",
    [
        (1000, 32, 1, 1, False, 32),  # ceil(1000/32)
        (1000, 32, 1, 1, True, 31),
        (1000, 32, 2, 1, False, 16),  # 500 per worker -> 16 micro-batches
        (1000, 32, 2, 4, False, 4),  # 16 micro-batches / 4 accumulation steps
        (1000, 32, 2, 4, True, 3),  # 15 full micro-batches -> 3 full accumulations
        (1001, 10, 3, 2, False, 17),  # 334 per worker -> 34 micro-batches -> 17 updates
        (0, 8, 2, 2, False, 0),
    ],
)
def test_updates_per_epoch(
    n: int, batch: int, workers: int, accum: int, drop_last: bool, want: int
) -> None:
    assert decay.updates_per_epoch(n, batch, workers, accum, drop_last=drop_last) == want


def test_updates_per_epoch_errors() -> None:
    with pytest.raises(
        ValueError, match=r"updates_per_epoch: accum_steps=0 is not valid: expected an integer >= 1"
    ):
        decay.updates_per_epoch(10, 2, 1, 0)
    with pytest.raises(ValueError, match=r"updates_per_epoch: num_samples=-1 is not valid"):
        decay.updates_per_epoch(-1, 2, 1, 1)


def test_schedule_counts_optimizer_updates_not_micro_batches() -> None:
    # 4 micro-batches per update: the schedule advances once per update, so after one epoch of
    # 16 micro-batches it has advanced 4 times.
    s = decay.StepLR(1.0, 4, 0.1)
    per_epoch = decay.updates_per_epoch(64, 4, 1, 4)
    assert per_epoch == 4
    micro = 0
    for _ in range(16):
        micro += 1
        if micro % 4 == 0:
            s.next()
    assert s.count == per_epoch and s.peek() == pytest.approx(0.1)


@pytest.mark.parametrize("name", sorted(n for n in CONFS if n != "ReduceLROnPlateau"))
def test_next_equals_lr_at_bit_for_bit(name: str) -> None:
    # next() is lr_at(count) then count + 1: lr_at's numbers exactly, from any start.
    for start in (0, 3, 97, 1000):
        s = build(name)
        s.load_state_dict({"count": start})
        got = [s.next() for _ in range(700)]
        fresh = build(name)
        assert got == [fresh.lr_at(k) for k in range(start, start + 700)], start


DRAWN = st.one_of(
    st.builds(
        lambda t, p, c, th, d: decay.OneCycleLR(
            1.0, t, pct_start=p, anneal_strategy=c, three_phase=th, div_factor=d
        ),
        st.integers(2, 400),
        st.floats(0.05, 0.95),
        st.sampled_from(["cos", "linear"]),
        st.booleans(),
        st.floats(1, 50),
    ),
    st.builds(lambda t, p: decay.PolynomialLR(0.3, t, p), st.integers(1, 600), st.floats(0.0, 3.0)),
    st.builds(
        lambda s, e, t: decay.LinearLR(0.3, s, e, t),
        st.floats(0.01, 1),
        st.floats(0, 1),
        st.integers(1, 600),
    ),
    st.builds(
        lambda w, s, d, r, kind: decay.WarmupStableDecay(
            2.0, warmup_steps=w, stable_steps=s, decay_steps=d, min_lr_ratio=r, decay_type=kind
        ),
        st.integers(0, 300),
        st.integers(0, 300),
        st.integers(1, 300),
        st.floats(0, 1),
        st.sampled_from(["cosine", "linear", "sqrt"]),
    ),
    st.builds(
        lambda w, d, r: decay.WarmupCosine(2.0, warmup_steps=w, decay_steps=d, min_lr_ratio=r),
        st.integers(0, 300),
        st.integers(1, 300),
        st.floats(0, 1),
    ),
    st.builds(
        lambda w, d, r: decay.WarmupLinear(2.0, warmup_steps=w, decay_steps=d, min_lr_ratio=r),
        st.integers(0, 300),
        st.integers(1, 300),
        st.floats(0, 1),
    ),
    st.builds(
        lambda w, d, a, r: decay.Rex(
            2.0, warmup_steps=w, decay_steps=d, rex_alpha=a, min_lr_ratio=r
        ),
        st.integers(0, 300),
        st.integers(1, 300),
        st.one_of(st.just(1.0), st.floats(0.2, 3)),
        st.sampled_from([0.0, 0.1, 0.7]),
    ),
    st.builds(
        lambda w, t, r: decay.InverseSqrt(2.0, warmup_steps=w, timescale=t, min_lr_ratio=r),
        st.integers(0, 300),
        st.floats(1, 1e4),
        st.sampled_from([0.0, 0.3]),
    ),
    st.builds(
        lambda t0, m: decay.CosineAnnealingWarmRestarts(1.0, t0, m),
        st.integers(1, 100),
        st.integers(1, 3),
    ),
    st.builds(lambda i, a: decay.WarmRestarts(1.0, a, i), st.integers(1, 100), st.floats(0, 1)),
    st.builds(
        lambda up, down, mode: decay.CyclicLR(
            0.1, 1.0, step_size_up=up, step_size_down=down, mode=mode, gamma=0.999
        ),
        st.integers(1, 200),
        st.integers(1, 200),
        st.sampled_from(["triangular", "triangular2", "exp_range"]),
    ),
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(s=DRAWN, start=st.integers(0, 700))
def test_next_equals_lr_at_for_drawn_parameters(s: decay.StepSizeScheduler, start: int) -> None:
    s.advance(start)
    got = [s.next() for _ in range(600)]
    assert got == [s.lr_at(k) for k in range(start, start + 600)]
