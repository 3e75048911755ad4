"""from_conf, the key declarations, the catalogue and every configuration error message."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest

import decay
from angelconf.config import TYPES, Key, load_config
from decay import registry
from decay.keys import PREFIX
from learners.keys import all_keys


def conf(*sets: str):
    return load_config(None, list(sets), all_keys())


# --- declarations --------------------------------------------------------------------------------


def test_keys_declared_once_with_valid_types() -> None:
    seen = [k.name for k in decay.KEYS]
    assert len(seen) == len(set(seen))
    for k in decay.KEYS:
        assert isinstance(k, Key) and k.deprecated is None
        assert k.type in TYPES and k.doc
    by = {k.name: k for k in decay.KEYS}
    assert by["ml.learn.rate"].default == 0.5
    assert by["ml.opt.decay.class.name"].default == "StandardDecay"
    assert by["ml.opt.decay.on.batch"].default is False
    assert by["ml.opt.decay.intervals"].default == 100
    assert by["ml.opt.decay.alpha"].default == 0.001
    assert by["ml.opt.decay.beta"].default == 0.001
    assert by["ml.learn.decay"].default is None
    assert by["ml.opt.decay.gamma"].default is None
    assert "ml.opt.decay.<i>.class.name" in by and "ml.opt.decay.<i>.gamma" in by


def test_every_schedule_parameter_is_a_declared_key_with_a_consistent_default() -> None:
    by = {k.name: k for k in decay.KEYS}
    for name in decay.names():
        cls = registry.schedule_class(name)
        for suffix, p in registry.schedule_keys(cls):
            key = by.get(PREFIX + suffix)
            assert key is not None, f"{name}.{p.name} has no key"
            assert PREFIX + "<i>." + suffix in by
            # A global default, when declared, must be what every schedule using it defaults to.
            if key.default is not None and p.default is not inspect.Parameter.empty:
                assert p.default == key.default, (name, suffix)


def test_issue_key_names_exist() -> None:
    by = {k.name for k in decay.KEYS}
    for suffix in (
        "gamma step.size milestones factor start.factor end.factor total.iters power t.max eta.min "
        "t.0 t.mult base.lr max.lr step.size.up step.size.down mode scale.mode total.steps pct.start "
        "anneal.strategy div.factor final.div.factor three.phase cycle.momentum base.momentum "
        "max.momentum patience threshold threshold.mode cooldown min.lr eps warmup.steps "
        "stable.steps decay.steps min.lr.ratio decay.type rex.alpha timescale alpha beta intervals "
        "on.batch schedulers"
    ).split():
        assert "ml.opt.decay." + suffix in by


# --- building --------------------------------------------------------------------------------------


def test_typed_config_raw_strings_and_typed_mapping_agree() -> None:
    sets = {
        "ml.opt.decay.class.name": "cyclicLR",
        "ml.learn.rate": "0.01",
        "ml.opt.decay.max.lr": "0.1",
        "ml.opt.decay.step.size.up": "5",
        "ml.opt.decay.mode": "Triangular2",
        "ml.opt.decay.cycle.momentum": "false",
    }
    typed = {
        "ml.opt.decay.class.name": "CyclicLR",
        "ml.learn.rate": 0.01,
        "ml.opt.decay.max.lr": 0.1,
        "ml.opt.decay.step.size.up": 5,
        "ml.opt.decay.mode": "triangular2",
        "ml.opt.decay.cycle.momentum": False,
    }
    a = decay.from_conf(conf(*(f"{k}={v}" for k, v in sets.items())))
    b = decay.from_conf(sets)
    c = decay.from_conf(typed)
    assert isinstance(a, decay.CyclicLR)
    for k in range(40):
        assert a.lr_at(k) == b.lr_at(k) == c.lr_at(k)
    assert a.momentum_at(3) is None


def test_default_is_standard_decay() -> None:
    s = decay.from_conf(conf())
    assert isinstance(s, decay.StandardDecay)
    assert (s.lr, s.alpha, s.intervals) == (0.5, 0.001, 100)


def test_per_schedule_defaults_apply_when_global_key_unset() -> None:
    s = decay.from_conf(conf("ml.opt.decay.class.name=StepLR", "ml.opt.decay.step.size=3"))
    assert s.gamma == 0.1
    p = decay.from_conf(conf("ml.opt.decay.class.name=ReduceLROnPlateau"))
    assert (p.factor, p.mode, p.patience) == (0.1, "min", 10)
    c = decay.from_conf(conf("ml.opt.decay.class.name=ConstantLR"))
    assert (c.factor, c.total_iters) == (1 / 3, 5)
    w = decay.from_conf(conf("ml.opt.decay.class.name=WarmRestarts", "ml.learn.rate=2"))
    assert w.eta_min == 0.2


def test_total_steps_fills_t_max_total_steps_and_decay_length() -> None:
    c = decay.from_conf(conf("ml.opt.decay.class.name=CosineAnnealingLR"), total_steps=300)
    assert c.t_max == 300
    o = decay.from_conf(conf("ml.opt.decay.class.name=OneCycleLR"), total_steps=50)
    assert o.total_steps == 50 and o.max_lr == 0.5
    w = decay.from_conf(
        conf("ml.opt.decay.class.name=WarmupCosine", "ml.opt.decay.warmup.steps=10"),
        total_steps=110,
    )
    assert w.lr_at(110) == pytest.approx(0.05) and w.lr_at(109) > 0.05
    # an explicit key wins over the learner's total
    c = decay.from_conf(
        conf("ml.opt.decay.class.name=CosineAnnealingLR", "ml.opt.decay.t.max=7"), total_steps=300
    )
    assert c.t_max == 7


def test_warmup_steps_on_any_schedule_puts_a_warmup_in_front() -> None:
    s = decay.from_conf(
        conf(
            "ml.opt.decay.class.name=CosineAnnealingLR",
            "ml.opt.decay.warmup.steps=10",
            "ml.learn.rate=1",
        ),
        total_steps=110,
    )
    assert isinstance(s, decay.Warmup) and isinstance(s.inner, decay.CosineAnnealingLR)
    assert s.inner.t_max == 100  # the inner schedule spans the updates after the warmup
    assert [s.lr_at(k) for k in (0, 9, 10, 110)] == [0.0, 0.9, 1.0, 0.0]
    # Warmup* schedules have their own warmup: no wrapper
    m = decay.from_conf(
        conf("ml.opt.decay.class.name=WarmupConstant", "ml.opt.decay.warmup.steps=3")
    )
    assert isinstance(m, decay.WarmupConstant)


def test_sequential_from_properties() -> None:
    s = decay.from_conf(
        conf(
            "ml.opt.decay.class.name=SequentialLR",
            "ml.opt.decay.schedulers=LinearLR,CosineAnnealingLR",
            "ml.opt.decay.milestones=3",
            "ml.opt.decay.0.start.factor=0.1",
            "ml.opt.decay.0.total.iters=3",
            "ml.learn.rate=1",
        ),
        total_steps=7,
    )
    # the cosine child spans total - milestone = 4 updates
    want = [0.1, 0.4, 0.7, 1.0, 0.853553, 0.5, 0.146447, 0.0, 0.146447, 0.5]
    assert [round(s.lr_at(k), 6) for k in range(10)] == want


def test_chained_from_properties_with_child_class_names() -> None:
    s = decay.from_conf(
        {
            "ml.opt.decay.class.name": "ChainedScheduler",
            "ml.opt.decay.0.class.name": "ConstantLR",
            "ml.opt.decay.0.factor": "0.1",
            "ml.opt.decay.0.total.iters": "20",
            "ml.opt.decay.1.class.name": "ExponentialLR",
            "ml.opt.decay.1.gamma": "0.9",
            "ml.learn.rate": "0.05",
        }
    )
    assert [round(s.lr_at(k), 6) for k in range(18, 23)] == [
        0.00075,
        0.000675,
        0.006079,
        0.005471,
        0.004924,
    ]


# --- errors ----------------------------------------------------------------------------------------


def test_unknown_class_lists_valid_names_closest_first() -> None:
    with pytest.raises(ValueError) as e:
        decay.from_conf(conf("ml.opt.decay.class.name=StepLr2"))
    msg = str(e.value)
    assert msg.startswith(
        "ml.opt.decay.class.name=StepLr2: unknown schedule; valid names (closest first): StepLR, "
    )
    for n in decay.names():
        assert n in msg
    with pytest.raises(
        ValueError,
        match=r"ml.opt.decay.class.name=cosine: unknown schedule; valid names \(closest first\): WarmupCosine, CosineAnnealingLR, ",
    ):
        decay.from_conf({"ml.opt.decay.class.name": "cosine"})


def test_python_only_schedules_are_explained() -> None:
    with pytest.raises(
        ValueError, match=r"LambdaLR takes a Python function and cannot be configured in properties"
    ):
        decay.from_conf({"ml.opt.decay.class.name": "lambdalr"})


@pytest.mark.parametrize(
    "sets,message",
    [
        (
            ["ml.opt.decay.class.name=ExponentialLR"],
            r"^ExponentialLR: ml.opt.decay.gamma is required; see docs/decay.md$",
        ),
        (
            ["ml.opt.decay.class.name=ExponentialLR", "ml.opt.decay.gamma=-0.5"],
            r"command line: ml.opt.decay.gamma=-0.5 is not valid: expected a number > 0",
        ),
        (
            ["ml.opt.decay.class.name=CosineAnnealingLR"],
            r"CosineAnnealingLR: ml.opt.decay.t.max is required \(or let the learner supply the total number of updates\)",
        ),
        (
            ["ml.opt.decay.class.name=CosineAnnealingLR", "ml.opt.decay.t.max=0"],
            r"ml.opt.decay.t.max=0 is not valid: expected an integer >= 1",
        ),
        (
            ["ml.opt.decay.class.name=CorrectionDecay", "ml.opt.decay.beta=1"],
            r"ml.opt.decay.beta=1 is not valid: expected a number in \[0, 1\)",
        ),
        (
            ["ml.opt.decay.class.name=MultiStepLR", "ml.opt.decay.milestones=5,3"],
            r"MultiStepLR: ml.opt.decay.milestones=5,3 is not valid: expected a strictly increasing list of integers >= 0 \(set in command line\)",
        ),
        (
            [
                "ml.opt.decay.class.name=OneCycleLR",
                "ml.opt.decay.total.steps=10",
                "ml.opt.decay.pct.start=1.0",
            ],
            r"ml.opt.decay.pct.start=1.0 is not valid: expected a number in \(0, 1\)",
        ),
        (
            [
                "ml.opt.decay.class.name=OneCycleLR",
                "ml.opt.decay.total.steps=10",
                "ml.opt.decay.pct.start=0.1",
            ],
            r"OneCycleLR: ml.opt.decay.pct.start=0.1 is not valid: expected a value with ml.opt.decay.pct.start·ml.opt.decay.total.steps != 1 \(ml.opt.decay.total.steps=10: the warm-up phase would have length 0\) \(set in command line\)",
        ),
        (["ml.opt.decay.class.name=CyclicLR"], r"CyclicLR: ml.opt.decay.max.lr is required"),
        (
            ["ml.opt.decay.class.name=CyclicLR", "ml.opt.decay.max.lr=1", "ml.opt.decay.mode=min"],
            r"CyclicLR: ml.opt.decay.mode=min is not valid: expected one of triangular, triangular2, exp_range",
        ),
        (
            [
                "ml.opt.decay.class.name=CyclicLR",
                "ml.opt.decay.max.lr=1",
                "ml.opt.decay.scale.mode=iterations",
            ],
            r"CyclicLR: ml.opt.decay.scale.mode=iterations is not valid: expected 'cycle' for mode=triangular",
        ),
        (
            ["ml.opt.decay.class.name=ReduceLROnPlateau", "ml.opt.decay.mode=triangular"],
            r"ReduceLROnPlateau: ml.opt.decay.mode=triangular is not valid: expected one of min, max",
        ),
        (
            ["ml.opt.decay.class.name=ReduceLROnPlateau", "ml.opt.decay.factor=1"],
            r"ReduceLROnPlateau: ml.opt.decay.factor=1.0 is not valid: expected a number in \(0, 1\)",
        ),
        (
            ["ml.opt.decay.class.name=ConstantLR", "ml.opt.decay.factor=0"],
            r"ml.opt.decay.factor=0 is not valid: expected a number in \(0, 1\]",
        ),
        (
            ["ml.opt.decay.class.name=WarmupCosine"],
            r"WarmupCosine: ml.opt.decay.decay.steps is required: set ml.opt.decay.decay.steps, or ml.opt.decay.total.steps \(the learner fills",
        ),
        (
            ["ml.opt.decay.class.name=SequentialLR"],
            r"SequentialLR: ml.opt.decay.schedulers is required",
        ),
        (
            ["ml.opt.decay.class.name=SequentialLR", "ml.opt.decay.schedulers=NoDecay,NoDecay"],
            r"SequentialLR: ml.opt.decay.milestones is required: 1 strictly increasing",
        ),
        (
            [
                "ml.opt.decay.class.name=SequentialLR",
                "ml.opt.decay.schedulers=NoDecay,NoDecay",
                "ml.opt.decay.milestones=4,8",
            ],
            r"SequentialLR: ml.opt.decay.milestones=4,8 is not valid: expected 1 integer\(s\), one fewer than the 2 schedules",
        ),
        (
            [
                "ml.opt.decay.class.name=SequentialLR",
                "ml.opt.decay.schedulers=NoDecay,StepLR",
                "ml.opt.decay.milestones=4",
            ],
            r"StepLR: ml.opt.decay.1.step.size is required",
        ),
        (
            [
                "ml.opt.decay.class.name=SequentialLR",
                "ml.opt.decay.schedulers=NoDecay,NoDecay",
                "ml.opt.decay.milestones=4",
                "ml.opt.decay.2.gamma=0.5",
            ],
            r"ml.opt.decay.2.gamma: child index 2 has no class: ml.opt.decay.schedulers lists 2 schedule\(s\) \(valid indices 0..1\)",
        ),
        (
            [
                "ml.opt.decay.class.name=ChainedScheduler",
                "ml.opt.decay.schedulers=NoDecay,ReduceLROnPlateau",
            ],
            r"ReduceLROnPlateau is metric-driven and cannot be a child of ChainedScheduler",
        ),
        (
            [
                "ml.opt.decay.class.name=ChainedScheduler",
                "ml.opt.decay.schedulers=NoDecay,SequentialLR",
            ],
            r"a SequentialLR cannot be a child in properties",
        ),
        (
            ["ml.opt.decay.class.name=ChainedScheduler", "ml.opt.decay.schedulers=NoDecay,Bogus"],
            r"ml.opt.decay.schedulers\[1\]=Bogus: unknown schedule",
        ),
        (
            [
                "ml.opt.decay.class.name=ChainedScheduler",
                "ml.opt.decay.schedulers=NoDecay,NoDecay",
                "ml.opt.decay.1.class.name=StepLR",
            ],
            r"ml.opt.decay.1.class.name=StepLR contradicts ml.opt.decay.schedulers\[1\]=NoDecay",
        ),
        (["ml.learn.rate=-1"], r"ml.learn.rate=-1 is not valid: expected a number >= 0"),
    ],
)
def test_error_messages(sets: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decay.from_conf(conf(*sets))


def test_raw_mapping_errors_name_key_value_and_range() -> None:
    with pytest.raises(
        ValueError, match=r"^ml.opt.decay.step.size=abc is not valid: expected an integer$"
    ):
        decay.from_conf({"ml.opt.decay.class.name": "StepLR", "ml.opt.decay.step.size": "abc"})
    with pytest.raises(
        ValueError, match=r"^ml.opt.decay.gamma=nan is not valid: expected a finite number$"
    ):
        decay.from_conf({"ml.opt.decay.class.name": "ExponentialLR", "ml.opt.decay.gamma": "nan"})
    with pytest.raises(
        ValueError, match=r"^ml.opt.decay.t.max=0 is not valid: expected an integer >= 1$"
    ):
        decay.from_conf({"ml.opt.decay.class.name": "CosineAnnealingLR", "ml.opt.decay.t.max": 0})
    with pytest.raises(
        ValueError, match=r"unknown key ml.opt.decay.gama \(did you mean ml.opt.decay.gamma"
    ):
        decay.from_conf({"ml.opt.decay.class.name": "StepLR", "ml.opt.decay.gama": "0.5"})
    with pytest.raises(
        ValueError, match=r"^ml.opt.decay.three.phase=maybe is not valid: expected true or false$"
    ):
        decay.from_conf({"ml.opt.decay.three.phase": "maybe"})
    with pytest.raises(
        ValueError, match=r"from_conf: total_steps=0 is not valid: expected an integer >= 1"
    ):
        decay.from_conf({}, total_steps=0)


def test_unused_keys_warn() -> None:
    with pytest.warns(
        UserWarning, match=r"ml.opt.decay.gamma: set but not used by CosineAnnealingLR"
    ):
        decay.from_conf(
            conf(
                "ml.opt.decay.class.name=CosineAnnealingLR",
                "ml.opt.decay.t.max=5",
                "ml.opt.decay.gamma=0.5",
            )
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decay.from_conf(
            conf(
                "ml.opt.decay.class.name=StepLR",
                "ml.opt.decay.step.size=5",
                "ml.opt.decay.on.batch=true",
            )
        )


def test_child_keys_of_a_schedule_that_is_not_a_chain_warn() -> None:
    """A child's keys (``ml.opt.decay.0.*``) were read only by a chain, and ignored silently
    by any other schedule."""
    with pytest.warns(
        UserWarning,
        match=r"^ml.opt.decay.0.class.name, ml.opt.decay.0.gamma, ml.opt.decay.0.step.size: "
        r"set but not used by StandardDecay",
    ):
        decay.from_conf(
            conf(
                "ml.opt.decay.0.class.name=StepLR",
                "ml.opt.decay.0.step.size=1",
                "ml.opt.decay.0.gamma=0.1",
            )
        )
    with warnings.catch_warnings():  # a chain reads them: no warning
        warnings.simplefilter("error")
        decay.from_conf(
            conf(
                "ml.opt.decay.class.name=SequentialLR",
                "ml.opt.decay.schedulers=StepLR,ConstantLR",
                "ml.opt.decay.milestones=3",
                "ml.opt.decay.0.step.size=1",
                "ml.opt.decay.0.gamma=0.1",
            )
        )


def test_never_inf_or_nan() -> None:
    g = decay.ExponentialLR(1.0, 10.0)
    assert g.lr_at(300) == 1e300
    with pytest.raises(
        ValueError, match=r"ExponentialLR: the step size at update 400 is inf \(overflow\)"
    ):
        g.lr_at(400)
    with pytest.raises(
        ValueError, match=r"update index k=-1 is not valid: expected an integer >= 0"
    ):
        decay.NoDecay(1.0).lr_at(-1)
    m = decay.MultiplicativeLR(1.0, lambda k: 1e10)
    with pytest.raises(ValueError, match=r"MultiplicativeLR: the step size at update 31 is inf"):
        m.lr_at(40)
    lam = decay.LambdaLR(1.0, lambda k: float("nan"))
    with pytest.raises(ValueError, match=r"LambdaLR: the step size at update 0 is nan"):
        lam.next()
    warnings.simplefilter("ignore")  # keys not read by one schedule or another
    for name in decay.names():
        if name in ("SequentialLR", "ChainedScheduler"):
            continue
        s = decay.from_conf(
            {
                "ml.opt.decay.class.name": name,
                "ml.opt.decay.gamma": "0.5",
                "ml.opt.decay.step.size": "3",
                "ml.opt.decay.t.0": "3",
                "ml.opt.decay.max.lr": "1.0",
                "ml.opt.decay.milestones": "2,5",
                "ml.opt.decay.stable.steps": "5",
                "ml.opt.decay.warmup.steps": "4",
            },
            total_steps=50,
        )
        assert all(math.isfinite(s.lr_at(k)) for k in range(0, 200)), name


def test_python_api_lambda_and_multiplicative() -> None:
    lam = decay.LambdaLR(2.0, lambda k: 1 / (k + 1))
    assert [lam.lr_at(k) for k in range(3)] == [2.0, 1.0, 2 / 3]
    m = decay.MultiplicativeLR(1.0, lambda k: 0.5)
    assert [m.next() for _ in range(4)] == [1.0, 0.5, 0.25, 0.125]
    assert m.lr_at(1) == 0.5 and m.lr_at(10) == 0.5**10


def test_learner_supplied_total_is_named_in_errors() -> None:
    with pytest.raises(
        ValueError,
        match=r"WarmupCosine: ml.opt.decay.total.steps=300 is not valid: expected an integer > "
        r"ml.opt.decay.warmup.steps = 2000, so that the decay has at least one step \(or set "
        r"ml.opt.decay.decay.steps\) "
        r"\(not set: the total number of updates, epochs × updates per epoch, was used\)",
    ):
        on_batch = conf("ml.opt.decay.class.name=WarmupCosine", "ml.opt.decay.on.batch=true")
        decay.from_conf(on_batch, total_steps=300)
    # per epoch (Angel's default), the total the learner gives is the number of epochs
    with pytest.raises(
        ValueError,
        match=r"\(not set: the number of epochs \(the schedule steps once an epoch: "
        r"ml.opt.decay.on.batch=false\), was used\)$",
    ):
        decay.from_conf(conf("ml.opt.decay.class.name=WarmupCosine"), total_steps=10)
