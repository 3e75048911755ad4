"""decay.torch.DecayLR: any schedule driving a torch optimizer as an LRScheduler."""

from __future__ import annotations

import doctest
import json
import warnings

import pytest
import torch

import decay
import decay.torch as dt
from decay.torch import DecayLR


def _opt(kind: str = "sgd", groups: int = 1) -> torch.optim.Optimizer:
    params = [
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.1 * (i + 1)} for i in range(groups)
    ]
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.1)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _run(opt: torch.optim.Optimizer, sched: DecayLR, n: int) -> list[tuple[float, float]]:
    out = []
    g = opt.param_groups[0]
    for _ in range(n):
        m = g["betas"][0] if "betas" in g else g["momentum"]
        out.append((g["lr"], m))
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda: decay.StepLR(0.1, 3, 0.5),
        lambda: decay.WarmupCosine(0.1, warmup_steps=4, decay_steps=20),
        lambda: decay.StandardDecay(0.1, alpha=0.5),
        lambda: decay.SequentialLR(
            [decay.LinearLR(0.1, 0.2, 1.0, 4), decay.ExponentialLR(0.1, 0.9)], [4]
        ),
    ],
)
def test_lr_after_k_steps_is_lr_at_k(make) -> None:
    s = make()
    ref = make()
    opt = _opt()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no order warning: optimizer.step() comes first
        got = _run(opt, DecayLR(opt, s), 30)
    assert [lr for lr, _ in got] == [ref.lr_at(k) for k in range(30)]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_momentum_follows_one_cycle_like_torch(kind: str) -> None:
    ours_opt = _opt(kind)
    ours = _run(ours_opt, DecayLR(ours_opt, decay.OneCycleLR(0.1, 20, max_lr=1.0)), 20)
    t_opt = _opt(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = _run(t_opt, torch.optim.lr_scheduler.OneCycleLR(t_opt, 1.0, total_steps=20), 20)
    for (a, am), (b, bm) in zip(ours, theirs, strict=True):
        assert a == pytest.approx(b, rel=1e-12) and am == pytest.approx(bm, rel=1e-12)


def test_relative_keeps_group_ratios() -> None:
    opt = _opt(groups=2)
    sched = DecayLR(opt, decay.StepLR(0.5, 1, 0.5), relative=True)
    opt.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.1]
    assert sched.get_last_lr() == [0.05, 0.1]
    absolute = _opt(groups=2)
    DecayLR(absolute, decay.NoDecay(0.3))
    assert [g["lr"] for g in absolute.param_groups] == [0.3, 0.3]


def test_json_resume_is_exact_in_any_order() -> None:
    def make(opt: torch.optim.Optimizer) -> DecayLR:
        return DecayLR(opt, decay.CosineAnnealingWarmRestarts(0.1, 5, 2))

    opt = _opt()
    ref = _run(opt, make(opt), 40)
    a_opt = _opt()
    a = make(a_opt)
    _run(a_opt, a, 13)
    state = json.loads(json.dumps(a.state_dict()))
    opt_state = a_opt.state_dict()
    # scheduler first, then optimizer; and optimizer first, then scheduler (torch breaks here)
    for order in ("sched_first", "opt_first"):
        b_opt = _opt()
        b = make(b_opt)
        if order == "sched_first":
            b.load_state_dict(state)
            b_opt.load_state_dict(opt_state)
        else:
            b_opt.load_state_dict(opt_state)
            b.load_state_dict(state)
        assert _run(b_opt, b, 27) == ref[13:]


def test_adapter_errors() -> None:
    with pytest.raises(ValueError, match=r"DecayLR: ReduceLROnPlateau is metric-driven"):
        DecayLR(_opt(), decay.ReduceLROnPlateau(0.1))
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(
        ValueError,
        match=r"DecayLR: CyclicLR cycles the momentum but Adagrad has neither momentum nor betas",
    ):
        DecayLR(torch.optim.Adagrad([p], lr=0.1), decay.CyclicLR(0.1, 1.0))
    with pytest.raises(TypeError, match=r"DecayLR: schedule must be a StepSizeScheduler"):
        DecayLR(_opt(), 0.1)  # type: ignore[arg-type]


def test_doctest() -> None:
    assert doctest.testmod(dt).failed == 0
