"""Every properties key ``decay`` reads, declared once as an ``angelconf.config.Key``.

A schedule's keys are its constructor's parameters: parameter ``step_size`` is key
``ml.opt.decay.step.size`` (``lr`` is ``ml.learn.rate``); child ``<i>`` of a SequentialLR or
ChainedScheduler reads the same keys under ``ml.opt.decay.<i>.``. Invariants: every key has one
declaration here; a default is declared only where every schedule reading the key shares it
(``None`` elsewhere: the schedule's own default applies, see docs/decay.md); child keys default
to unset. Imports only the standard library and ``angelconf.config`` (itself standard library only).
"""

from __future__ import annotations

from dataclasses import replace

from angelconf.config import Key, at_least, between, in_range, interval, non_negative, positive

__all__ = [
    "CLASS_KEY",
    "DEPRECATED_ALPHA_KEY",
    "KEYS",
    "LR_KEY",
    "PREFIX",
    "SCHEDULE_SUFFIXES",
    "TABLE_LR_KEY",
]

PREFIX = "ml.opt.decay."
LR_KEY = "ml.learn.rate"
CLASS_KEY = PREFIX + "class.name"
DEPRECATED_ALPHA_KEY = "ml.learn.decay"

# Integer checks: counts of updates or metrics.
_AT_LEAST_ONE = at_least(1, "an integer")
_AT_LEAST_ZERO = at_least(0, "an integer")

# Keys of the schedules' parameters: each exists at the top level and for every child <i>.
_SCHEDULE_KEYS = [
    Key(
        PREFIX + "class.name",
        "str",
        "StandardDecay",
        "Schedule name (case-insensitive); see docs/decay.md.",
    ),
    Key(
        PREFIX + "intervals",
        "int",
        100,
        "Angel's I: the interval of is_interval_boundary(), and WarmRestarts' first period.",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "alpha",
        "float",
        0.001,
        "Angel's alpha: StandardDecay/CorrectionDecay decay rate, WarmRestarts peak decay.",
        non_negative,
    ),
    Key(
        PREFIX + "beta",
        "float",
        0.001,
        "CorrectionDecay's beta (the momentum it corrects for), in [0, 1).",
        interval(0, 1, high_open=True),
    ),
    Key(
        PREFIX + "gamma",
        "float",
        None,
        "Multiplicative decay factor (StepLR/MultiStepLR 0.1, CyclicLR exp_range 1.0; required by ExponentialLR).",
        positive,
    ),
    Key(
        PREFIX + "step.size",
        "int",
        None,
        "StepLR period in updates (required by StepLR).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "milestones",
        "int_list",
        None,
        "Strictly increasing update indices (MultiStepLR decays, SequentialLR switches).",
    ),
    Key(
        PREFIX + "factor",
        "float",
        None,
        "ConstantLR factor (1/3) or ReduceLROnPlateau reduction factor (0.1).",
        interval(0, 1, low_open=True),
    ),
    Key(
        PREFIX + "start.factor",
        "float",
        None,
        "LinearLR start factor, in (0, 1] (default 1/3).",
        interval(0, 1, low_open=True),
    ),
    Key(
        PREFIX + "end.factor",
        "float",
        None,
        "LinearLR end factor, in [0, 1] (default 1.0).",
        between(0, 1),
    ),
    Key(
        PREFIX + "total.iters",
        "int",
        None,
        "ConstantLR/LinearLR/PolynomialLR length in updates (default 5).",
        _AT_LEAST_ONE,
    ),
    Key(PREFIX + "power", "float", None, "PolynomialLR exponent (default 1.0).", non_negative),
    Key(
        PREFIX + "t.max",
        "int",
        None,
        "CosineAnnealingLR half-period in updates (default: the total number of updates).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "eta.min",
        "float",
        None,
        "Cosine floor, an absolute step size (0.0; WarmRestarts: ml.learn.rate/10).",
        non_negative,
    ),
    Key(
        PREFIX + "t.0",
        "int",
        None,
        "CosineAnnealingWarmRestarts first period in updates (required).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "t.mult",
        "int",
        None,
        "CosineAnnealingWarmRestarts period multiplier after each restart (default 1).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "base.lr",
        "float",
        None,
        "CyclicLR lower step size (default ml.learn.rate).",
        non_negative,
    ),
    Key(
        PREFIX + "max.lr",
        "float",
        None,
        "CyclicLR upper step size (required); OneCycleLR peak (default ml.learn.rate).",
        non_negative,
    ),
    Key(
        PREFIX + "step.size.up",
        "int",
        None,
        "CyclicLR updates from base.lr up to max.lr (default 2000).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "step.size.down",
        "int",
        None,
        "CyclicLR updates back down (default step.size.up).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "mode",
        "str",
        None,
        "CyclicLR mode (triangular) or ReduceLROnPlateau mode (min).",
        choices=("triangular", "triangular2", "exp_range", "min", "max"),
    ),
    Key(
        PREFIX + "scale.mode",
        "str",
        None,
        "CyclicLR scale mode; fixed by the mode unless a custom scale_fn is given.",
        choices=("cycle", "iterations"),
    ),
    Key(
        PREFIX + "total.steps",
        "int",
        None,
        "OneCycleLR length; the decay length of the Warmup* schedules (default: the total number of updates).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "pct.start",
        "float",
        0.3,
        "OneCycleLR fraction of the cycle spent increasing the step size, in (0, 1).",
        in_range(0, 1),
    ),
    Key(
        PREFIX + "anneal.strategy",
        "str",
        "cos",
        "OneCycleLR annealing: cos or linear.",
        choices=("cos", "linear"),
    ),
    Key(
        PREFIX + "div.factor",
        "float",
        25.0,
        "OneCycleLR: initial step size = max.lr/div.factor.",
        positive,
    ),
    Key(
        PREFIX + "final.div.factor",
        "float",
        10000.0,
        "OneCycleLR: final step size = initial/final.div.factor.",
        positive,
    ),
    Key(
        PREFIX + "three.phase",
        "bool",
        False,
        "OneCycleLR: a third phase annealing back to the initial step size first.",
    ),
    Key(
        PREFIX + "cycle.momentum",
        "bool",
        True,
        "CyclicLR/OneCycleLR: also cycle the momentum (or Adam's beta1) inversely.",
    ),
    Key(
        PREFIX + "base.momentum",
        "float",
        None,
        "Lower momentum of the cycle (CyclicLR 0.8, OneCycleLR 0.85).",
    ),
    Key(
        PREFIX + "max.momentum",
        "float",
        None,
        "Upper momentum of the cycle (CyclicLR 0.9, OneCycleLR 0.95).",
    ),
    Key(
        PREFIX + "patience",
        "int",
        10,
        "ReduceLROnPlateau: metrics without improvement before reducing.",
        _AT_LEAST_ZERO,
    ),
    Key(
        PREFIX + "threshold",
        "float",
        0.0001,
        "ReduceLROnPlateau: minimum change that counts as an improvement.",
        non_negative,
    ),
    Key(
        PREFIX + "threshold.mode",
        "str",
        "rel",
        "ReduceLROnPlateau threshold mode: rel or abs.",
        choices=("rel", "abs"),
    ),
    Key(
        PREFIX + "cooldown",
        "int",
        0,
        "ReduceLROnPlateau: metrics ignored after a reduction.",
        _AT_LEAST_ZERO,
    ),
    Key(
        PREFIX + "min.lr",
        "float",
        0.0,
        "ReduceLROnPlateau: lower bound of the step size.",
        non_negative,
    ),
    Key(
        PREFIX + "eps",
        "float",
        1e-08,
        "ReduceLROnPlateau: smaller reductions are skipped.",
        non_negative,
    ),
    Key(
        PREFIX + "warmup.steps",
        "int",
        None,
        "Linear warmup from 0 in updates (Warmup* schedules: 2000; on any other schedule: a warmup in front of it).",
        _AT_LEAST_ZERO,
    ),
    Key(
        PREFIX + "stable.steps",
        "int",
        None,
        "WarmupStableDecay: updates at the peak between warmup and decay.",
        _AT_LEAST_ZERO,
    ),
    Key(
        PREFIX + "decay.steps",
        "int",
        None,
        "Warmup* schedules: updates of the decay (default: total.steps minus warmup [and stable] steps).",
        _AT_LEAST_ONE,
    ),
    Key(
        PREFIX + "min.lr.ratio",
        "float",
        None,
        "Warmup* schedules: floor as a fraction of ml.learn.rate (0.1; InverseSqrt 0.0).",
        between(0, 1),
    ),
    Key(
        PREFIX + "decay.type",
        "str",
        "cosine",
        "WarmupStableDecay cooldown shape: cosine, linear or sqrt.",
        choices=("cosine", "linear", "sqrt"),
    ),
    Key(PREFIX + "rex.alpha", "float", 1.0, "Rex exponent: (1 - p)^rex.alpha.", positive),
    Key(
        PREFIX + "timescale",
        "float",
        None,
        "InverseSqrt timescale (default: warmup.steps, or 10000 without warmup).",
        positive,
    ),
]

# Keys that exist only at the top level.
_TOP_ONLY = [
    Key(
        PREFIX + "on.batch",
        "bool",
        False,
        "Advance the schedule once per update (true) or once per epoch (false).",
    ),
    Key(
        PREFIX + "unit",
        "str",
        "updates",
        "What the schedule counts: updates (optimizer steps; ml.opt.decay.on.batch says per "
        "update or per epoch), samples (training rows seen before the update) or epochs "
        "(fractional: samples / rows per epoch), both read at every update; step sizes, "
        "warmup and periods are in that unit.",
        choices=("updates", "samples", "epochs"),
    ),
    Key(
        PREFIX + "schedulers",
        "str_list",
        None,
        "SequentialLR/ChainedScheduler children, in order; child i's keys are ml.opt.decay.<i>.*.",
    ),
]

_BASE = [
    Key(LR_KEY, "float", 0.5, "Initial step size (Angel's eta).", non_negative),
    Key(
        LR_KEY + ".scaling",
        "str",
        "none",
        "Scale every step size by the global batch over ml.learn.rate.reference.batch: none, "
        "linear (Goyal et al. 2017) or sqrt.",
        choices=("none", "linear", "sqrt"),
    ),
    Key(
        LR_KEY + ".reference.batch",
        "int",
        256,
        "The global batch ml.learn.rate is tuned for (ml.learn.rate.scaling).",
        _AT_LEAST_ONE,
    ),
    Key(
        DEPRECATED_ALPHA_KEY,
        "float",
        None,
        "Deprecated alias of ml.opt.decay.alpha for StandardDecay (warns; "
        "ml.opt.decay.alpha wins when both are set).",
        non_negative,
    ),
]


def _child(key: Key) -> Key:
    """The ``ml.opt.decay.<i>.*`` twin of a schedule key: unset by default, so the child's
    schedule default applies."""
    suffix = key.name.removeprefix(PREFIX)
    return replace(key, name=f"{PREFIX}<i>.{suffix}", default=None, doc=f"Child <i>: {key.doc}")


def _table(key: Key) -> Key:
    """The ``ml.opt.decay.<table>.*`` twin of a schedule key: a table's own schedule (unset
    by default: the global key applies)."""
    suffix = key.name.removeprefix(PREFIX)
    return replace(
        key, name=f"{PREFIX}<table>.{suffix}", default=None, doc=f"Table <table>'s own: {key.doc}"
    )


#: ``ml.learn.rate.<table>``: a table's own initial step size.
TABLE_LR_KEY = Key(
    LR_KEY + ".<table>",
    "float",
    None,
    "Table <table>'s own initial step size (unset: ml.learn.rate); gives the table a schedule "
    "of its own, as any ml.opt.decay.<table>.* key does.",
    non_negative,
)

#: Every key read by decay, each declared once.
KEYS: list[Key] = [
    *_BASE,
    *_SCHEDULE_KEYS,
    *_TOP_ONLY,
    *(_child(k) for k in _SCHEDULE_KEYS),
    *(_table(k) for k in _SCHEDULE_KEYS),
    TABLE_LR_KEY,
]

#: Suffixes under ``ml.opt.decay.`` of the schedule keys (``step.size``, ``gamma``, ...).
SCHEDULE_SUFFIXES = frozenset(k.name.removeprefix(PREFIX) for k in _SCHEDULE_KEYS)
