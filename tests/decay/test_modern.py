"""Modern schedules against a transcription of KempnerForge's multipliers (and Hugging Face's
inverse_sqrt), with warmup boundaries at ±1."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import decay

FAST = settings(max_examples=40, deadline=None, derandomize=True)


# KempnerForge kempnerforge/training/scheduler.py, as documented: warmup min(1, t/W) while t < W;
# p = min(1, s/D) over decay step s; a decay returns 1.0 if D <= 0.
def kf_warmup(t: int, w: int) -> float:
    return min(1.0, t / w) if w > 0 else 1.0


def kf(
    name: str,
    t: int,
    w: int,
    d: int,
    r: float,
    stable: int = 0,
    kind: str = "cosine",
    alpha: float = 1.0,
) -> float:
    if name != "none" and t < w:
        return kf_warmup(t, w)
    if name == "constant":
        return 1.0
    if name == "wsd":
        if t < w + stable:
            return 1.0
        s = t - w - stable
    else:
        s = t - w
    if name == "rex":
        p = min(1.0, s / max(d, 1))
        return max(r, (1 - p) ** alpha)
    if d <= 0:
        return 1.0
    p = min(1.0, s / d)
    if name == "cosine" or (name == "wsd" and kind == "cosine"):
        return r + 0.5 * (1 - r) * (1 + math.cos(math.pi * p))
    if name == "linear" or kind == "linear":
        return 1 - (1 - r) * p
    return r + (1 - r) * (1 - p) ** 0.5  # wsd sqrt


def test_warmup_cosine_reference_table() -> None:
    # W=2, N=10, peak 1: lr 0 at step 0, flat at the floor after N (torch's SequentialLR would rise)
    s = decay.WarmupCosine(1.0, total_steps=10, warmup_steps=2, min_lr_ratio=0.0)
    want = [
        0.0,
        0.5,
        1.0,
        0.96194,
        0.853553,
        0.691342,
        0.5,
        0.308658,
        0.146447,
        0.03806,
        0.0,
        0.0,
        0.0,
    ]
    assert [round(s.lr_at(t), 6) for t in range(13)] == want


@FAST
@given(
    lr=st.floats(1e-4, 5.0),
    w=st.integers(0, 30),
    d=st.integers(1, 200),
    r=st.floats(0.0, 1.0),
    name=st.sampled_from(["cosine", "linear", "rex"]),
    alpha=st.floats(0.25, 4.0),
)
def test_against_kempnerforge(lr: float, w: int, d: int, r: float, name: str, alpha: float) -> None:
    if name == "cosine":
        s: decay.StepSizeScheduler = decay.WarmupCosine(
            lr, warmup_steps=w, decay_steps=d, min_lr_ratio=r
        )
    elif name == "linear":
        s = decay.WarmupLinear(lr, warmup_steps=w, decay_steps=d, min_lr_ratio=r)
    else:
        s = decay.Rex(lr, warmup_steps=w, decay_steps=d, min_lr_ratio=r, rex_alpha=alpha)
    for t in range(w + d + 20):
        assert s.lr_at(t) == pytest.approx(
            lr * kf(name, t, w, d, r, alpha=alpha), rel=1e-12, abs=1e-15
        )


@FAST
@given(
    lr=st.floats(1e-4, 5.0),
    w=st.integers(0, 20),
    stable=st.integers(0, 50),
    d=st.integers(1, 100),
    r=st.floats(0.0, 1.0),
    kind=st.sampled_from(["cosine", "linear", "sqrt"]),
)
def test_wsd_against_kempnerforge(
    lr: float, w: int, stable: int, d: int, r: float, kind: str
) -> None:
    s = decay.WarmupStableDecay(
        lr, warmup_steps=w, stable_steps=stable, decay_steps=d, min_lr_ratio=r, decay_type=kind
    )
    for t in range(w + stable + d + 10):
        want = lr * kf("wsd", t, w, d, r, stable=stable, kind=kind)
        assert s.lr_at(t) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_wsd_lengths_from_total_steps() -> None:
    # stable from total - W - D
    a = decay.WarmupStableDecay(
        1.0, total_steps=100, warmup_steps=10, decay_steps=20, min_lr_ratio=0.0
    )
    b = decay.WarmupStableDecay(
        1.0, warmup_steps=10, stable_steps=70, decay_steps=20, min_lr_ratio=0.0
    )
    c = decay.WarmupStableDecay(
        1.0, total_steps=100, warmup_steps=10, stable_steps=70, min_lr_ratio=0.0
    )
    assert (
        [a.lr_at(t) for t in range(110)]
        == [b.lr_at(t) for t in range(110)]
        == [c.lr_at(t) for t in range(110)]
    )
    assert a.lr_at(79) == 1.0 and a.lr_at(80) == 1.0 and a.lr_at(81) < 1.0
    assert a.lr_at(100) == 0.0


def test_sqrt_is_kempnerforge_shape_not_hf() -> None:
    s = decay.WarmupStableDecay(
        1.0, warmup_steps=0, stable_steps=0, decay_steps=4, min_lr_ratio=0.0, decay_type="sqrt"
    )
    assert s.lr_at(1) == math.sqrt(0.75)  # KF: sqrt(1 - p); HF's 1 - sqrt(p) would be 0.5


@pytest.mark.parametrize(
    "make",
    [
        lambda: decay.WarmupCosine(2.0, warmup_steps=5, decay_steps=10),
        lambda: decay.WarmupLinear(2.0, warmup_steps=5, decay_steps=10),
        lambda: decay.WarmupConstant(2.0, warmup_steps=5),
        lambda: decay.Rex(2.0, warmup_steps=5, decay_steps=10),
        lambda: decay.InverseSqrt(2.0, warmup_steps=5),
        lambda: decay.WarmupStableDecay(2.0, warmup_steps=5, stable_steps=3, decay_steps=10),
    ],
)
def test_warmup_boundary_plus_minus_one(make) -> None:
    s = make()
    assert s.lr_at(0) == 0.0
    assert s.lr_at(4) == 2.0 * 4 / 5  # W - 1
    assert s.lr_at(5) == 2.0  # W: the peak, decay progress 0
    assert s.lr_at(6) <= 2.0  # W + 1


def test_inverse_sqrt_matches_hugging_face_and_angel() -> None:
    s = decay.InverseSqrt(1.0, warmup_steps=0, timescale=1)
    assert [round(s.lr_at(t), 4) for t in range(6)] == [1.0, 0.7071, 0.5774, 0.5, 0.4472, 0.4082]
    # HF: t < W: t/W; else 1/sqrt((t + timescale - W)/timescale), timescale defaults to W
    h = decay.InverseSqrt(1.0, warmup_steps=4)
    assert [h.lr_at(t) for t in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert h.lr_at(10) == 1 / math.sqrt((10 + 4 - 4) / 4)
    # W = 0: Angel's StandardDecay with alpha = 1/timescale, shifted by one update
    a = decay.StandardDecay(1.0, alpha=0.01)
    i = decay.InverseSqrt(1.0, warmup_steps=0, timescale=100)
    for k in range(50):
        assert i.lr_at(k + 1) == pytest.approx(a.lr_at(k), rel=1e-14)
    assert decay.InverseSqrt(1.0, warmup_steps=0).timescale == 10_000
    assert decay.InverseSqrt(1.0, warmup_steps=0, timescale=1, min_lr_ratio=0.5).lr_at(100) == 0.5


def test_no_decay() -> None:
    s = decay.NoDecay(0.3)
    assert {s.lr_at(k) for k in (0, 1, 10**9)} == {0.3}


def test_modern_errors() -> None:
    with pytest.raises(
        ValueError, match=r"WarmupCosine: decay_steps is required: set decay_steps, or total_steps"
    ):
        decay.WarmupCosine(1.0)
    with pytest.raises(
        ValueError,
        match=r"WarmupCosine: total_steps=100 is not valid: expected an integer > warmup_steps = 2000",
    ):
        decay.WarmupCosine(1.0, total_steps=100)
    with pytest.raises(ValueError, match=r"Rex: rex_alpha=0.0 is not valid: expected a number > 0"):
        decay.Rex(1.0, decay_steps=5, rex_alpha=0.0)
    with pytest.raises(
        ValueError,
        match=r"WarmupLinear: min_lr_ratio=1.5 is not valid: expected a number in \[0, 1\]",
    ):
        decay.WarmupLinear(1.0, decay_steps=5, min_lr_ratio=1.5)
    with pytest.raises(
        ValueError,
        match=r"WarmupStableDecay: decay_type='exp' is not valid: expected one of cosine, linear, sqrt",
    ):
        decay.WarmupStableDecay(1.0, stable_steps=1, decay_steps=1, decay_type="exp")
    with pytest.raises(ValueError, match=r"WarmupStableDecay: stable_steps is required"):
        decay.WarmupStableDecay(1.0, decay_steps=5)
    with pytest.raises(
        ValueError, match=r"WarmupConstant: warmup_steps=-1 is not valid: expected an integer >= 0"
    ):
        decay.WarmupConstant(1.0, warmup_steps=-1)
