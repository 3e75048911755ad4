"""The registry: every schedule and every properties key, declared once.

The factory (:func:`from_conf`), the error messages, the ``angelps schedule`` verb and
docs/decay.md are generated from these declarations. A schedule's keys are its constructor's
parameters: parameter ``step_size`` is key ``ml.opt.decay.step.size``; a parameter without a
default is a required key; ``lr`` is ``ml.learn.rate``.
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from decay import angel, classic, compose, modern
from decay.base import ParamError, StepSizeScheduler

__all__ = [
    "CATALOGUE",
    "KEYS",
    "PREFIX",
    "DecayDeprecationWarning",
    "Param",
    "from_conf",
    "names",
    "schedule_class",
    "schedule_keys",
]

PREFIX = "ml.opt.decay."
LR_KEY = "ml.learn.rate"
CLASS_KEY = PREFIX + "class.name"
TYPES = ("int", "float", "bool", "str", "int_list", "float_list", "str_list")


class DecayDeprecationWarning(UserWarning):
    """A deprecated decay key was used (shown by default, unlike DeprecationWarning)."""


@dataclass(frozen=True)
class Param:
    """One properties key read by ``decay`` (the loader turns it into its own key type).

    ``check(value)`` returns None when the value is fine, else what is valid; ``choices``
    restricts a ``str`` key (case-insensitive); ``<i>`` in a name stands for a child index.
    ``default=None`` means unset: the schedule's own default applies.
    """

    name: str
    type: str
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] | None = None


# --- checks --------------------------------------------------------------------------------------


def _ge(low: float, what: str = "a number") -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v >= low else f"{what} >= {low:g}"

    return check


def _gt(low: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v > low else f"a number > {low:g}"

    return check


def _within(low: float, high: float, lo_open: bool, hi_open: bool) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = (v > low if lo_open else v >= low) and (v < high if hi_open else v <= high)
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        return None if ok else f"a number in {left}{low:g}, {high:g}{right}"

    return check


def _int_ge(low: int) -> Callable[[Any], str | None]:
    return _ge(low, "an integer")


# --- the keys ------------------------------------------------------------------------------------

# suffix under ml.opt.decay. -> (type, default, doc, check, choices). Defaults are None where
# schedules differ (the schedule's own default then applies, see docs/decay.md).
_SUFFIXES: dict[
    str, tuple[str, Any, str, Callable[[Any], str | None] | None, tuple[str, ...] | None]
] = {
    "class.name": (
        "str",
        "StandardDecay",
        "Schedule name (case-insensitive); see docs/decay.md.",
        None,
        None,
    ),
    "intervals": (
        "int",
        100,
        "Angel's I: the interval of is_interval_boundary(), and WarmRestarts' first period.",
        _int_ge(1),
        None,
    ),
    "alpha": (
        "float",
        0.001,
        "Angel's alpha: StandardDecay/CorrectionDecay decay rate, WarmRestarts peak decay.",
        _ge(0),
        None,
    ),
    "beta": (
        "float",
        0.001,
        "CorrectionDecay's beta (the momentum it corrects for), in [0, 1).",
        _within(0, 1, False, True),
        None,
    ),
    "gamma": (
        "float",
        None,
        "Multiplicative decay factor (StepLR/MultiStepLR 0.1, CyclicLR exp_range 1.0; required by ExponentialLR).",
        _gt(0),
        None,
    ),
    "step.size": ("int", None, "StepLR period in updates (required by StepLR).", _int_ge(1), None),
    "milestones": (
        "int_list",
        None,
        "Strictly increasing update indices (MultiStepLR decays, SequentialLR switches).",
        None,
        None,
    ),
    "factor": (
        "float",
        None,
        "ConstantLR factor (1/3) or ReduceLROnPlateau reduction factor (0.1).",
        _within(0, 1, True, False),
        None,
    ),
    "start.factor": (
        "float",
        None,
        "LinearLR start factor, in (0, 1] (default 1/3).",
        _within(0, 1, True, False),
        None,
    ),
    "end.factor": (
        "float",
        None,
        "LinearLR end factor, in [0, 1] (default 1.0).",
        _within(0, 1, False, False),
        None,
    ),
    "total.iters": (
        "int",
        None,
        "ConstantLR/LinearLR/PolynomialLR length in updates (default 5).",
        _int_ge(1),
        None,
    ),
    "power": ("float", None, "PolynomialLR exponent (default 1.0).", _ge(0), None),
    "t.max": (
        "int",
        None,
        "CosineAnnealingLR half-period in updates (default: the total number of updates).",
        _int_ge(1),
        None,
    ),
    "eta.min": (
        "float",
        None,
        "Cosine floor, an absolute step size (0.0; WarmRestarts: ml.learn.rate/10).",
        _ge(0),
        None,
    ),
    "t.0": (
        "int",
        None,
        "CosineAnnealingWarmRestarts first period in updates (required).",
        _int_ge(1),
        None,
    ),
    "t.mult": (
        "int",
        None,
        "CosineAnnealingWarmRestarts period multiplier after each restart (default 1).",
        _int_ge(1),
        None,
    ),
    "base.lr": ("float", None, "CyclicLR lower step size (default ml.learn.rate).", _ge(0), None),
    "max.lr": (
        "float",
        None,
        "CyclicLR upper step size (required); OneCycleLR peak (default ml.learn.rate).",
        _ge(0),
        None,
    ),
    "step.size.up": (
        "int",
        None,
        "CyclicLR updates from base.lr up to max.lr (default 2000).",
        _int_ge(1),
        None,
    ),
    "step.size.down": (
        "int",
        None,
        "CyclicLR updates back down (default step.size.up).",
        _int_ge(1),
        None,
    ),
    "mode": (
        "str",
        None,
        "CyclicLR mode (triangular) or ReduceLROnPlateau mode (min).",
        None,
        ("triangular", "triangular2", "exp_range", "min", "max"),
    ),
    "scale.mode": (
        "str",
        None,
        "CyclicLR scale mode; fixed by the mode unless a custom scale_fn is given.",
        None,
        ("cycle", "iterations"),
    ),
    "total.steps": (
        "int",
        None,
        "OneCycleLR length; the decay length of the Warmup* schedules (default: the total number of updates).",
        _int_ge(1),
        None,
    ),
    "pct.start": (
        "float",
        0.3,
        "OneCycleLR fraction of the cycle spent increasing the step size, in (0, 1).",
        _within(0, 1, True, True),
        None,
    ),
    "anneal.strategy": (
        "str",
        "cos",
        "OneCycleLR annealing: cos or linear.",
        None,
        ("cos", "linear"),
    ),
    "div.factor": (
        "float",
        25.0,
        "OneCycleLR: initial step size = max.lr/div.factor.",
        _gt(0),
        None,
    ),
    "final.div.factor": (
        "float",
        1e4,
        "OneCycleLR: final step size = initial/final.div.factor.",
        _gt(0),
        None,
    ),
    "three.phase": (
        "bool",
        False,
        "OneCycleLR: a third phase annealing back to the initial step size first.",
        None,
        None,
    ),
    "cycle.momentum": (
        "bool",
        True,
        "CyclicLR/OneCycleLR: also cycle the momentum (or Adam's beta1) inversely.",
        None,
        None,
    ),
    "base.momentum": (
        "float",
        None,
        "Lower momentum of the cycle (CyclicLR 0.8, OneCycleLR 0.85).",
        None,
        None,
    ),
    "max.momentum": (
        "float",
        None,
        "Upper momentum of the cycle (CyclicLR 0.9, OneCycleLR 0.95).",
        None,
        None,
    ),
    "patience": (
        "int",
        10,
        "ReduceLROnPlateau: metrics without improvement before reducing.",
        _int_ge(0),
        None,
    ),
    "threshold": (
        "float",
        1e-4,
        "ReduceLROnPlateau: minimum change that counts as an improvement.",
        _ge(0),
        None,
    ),
    "threshold.mode": (
        "str",
        "rel",
        "ReduceLROnPlateau threshold mode: rel or abs.",
        None,
        ("rel", "abs"),
    ),
    "cooldown": (
        "int",
        0,
        "ReduceLROnPlateau: metrics ignored after a reduction.",
        _int_ge(0),
        None,
    ),
    "min.lr": ("float", 0.0, "ReduceLROnPlateau: lower bound of the step size.", _ge(0), None),
    "eps": ("float", 1e-8, "ReduceLROnPlateau: smaller reductions are skipped.", _ge(0), None),
    "warmup.steps": (
        "int",
        None,
        "Linear warmup from 0 in updates (Warmup* schedules: 2000; on any other schedule: a warmup in front of it).",
        _int_ge(0),
        None,
    ),
    "stable.steps": (
        "int",
        None,
        "WarmupStableDecay: updates at the peak between warmup and decay.",
        _int_ge(0),
        None,
    ),
    "decay.steps": (
        "int",
        None,
        "Warmup* schedules: updates of the decay (default: total.steps minus warmup [and stable] steps).",
        _int_ge(1),
        None,
    ),
    "min.lr.ratio": (
        "float",
        None,
        "Warmup* schedules: floor as a fraction of ml.learn.rate (0.1; InverseSqrt 0.0).",
        _within(0, 1, False, False),
        None,
    ),
    "decay.type": (
        "str",
        "cosine",
        "WarmupStableDecay cooldown shape: cosine, linear or sqrt.",
        None,
        ("cosine", "linear", "sqrt"),
    ),
    "rex.alpha": ("float", 1.0, "Rex exponent: (1 - p)^rex.alpha.", _gt(0), None),
    "timescale": (
        "float",
        None,
        "InverseSqrt timescale (default: warmup.steps, or 10000 without warmup).",
        _gt(0),
        None,
    ),
}

# Keys that exist only at the top level.
_TOP_ONLY = {
    "on.batch": (
        "bool",
        False,
        "Advance the schedule once per update (true) or once per epoch (false).",
        None,
        None,
    ),
    "schedulers": (
        "str_list",
        None,
        "SequentialLR/ChainedScheduler children, in order; child i's keys are ml.opt.decay.<i>.*.",
        None,
        None,
    ),
}


def _make_keys() -> list[Param]:
    keys = [
        Param(LR_KEY, "float", 0.5, "Initial step size (Angel's eta).", _ge(0), None),
        Param(
            "ml.learn.decay",
            "float",
            None,
            "Deprecated alias of ml.opt.decay.alpha for StandardDecay (warns; "
            "ml.opt.decay.alpha wins when both are set).",
            _ge(0),
            None,
        ),
    ]
    for suffix, (t, d, doc, chk, ch) in {**_SUFFIXES, **_TOP_ONLY}.items():
        keys.append(Param(PREFIX + suffix, t, d, doc, chk, ch))
    for suffix, (t, _d, doc, chk, ch) in _SUFFIXES.items():
        # Child keys default to unset: the child's schedule default applies.
        keys.append(Param(f"{PREFIX}<i>.{suffix}", t, None, f"Child <i>: {doc}", chk, ch))
    return keys


#: Every key read by decay, each declared once.
KEYS: list[Param] = _make_keys()
_BY_NAME = {k.name: k for k in KEYS}

# --- the schedules -------------------------------------------------------------------------------

#: Catalogue order: (section title, schedule classes).
CATALOGUE: tuple[tuple[str, tuple[type[StepSizeScheduler], ...]], ...] = (
    (
        "Angel's four",
        (
            angel.ConstantLearningRate,
            angel.StandardDecay,
            angel.CorrectionDecay,
            angel.WarmRestarts,
        ),
    ),
    (
        "Torch-equivalent",
        (
            classic.StepLR,
            classic.MultiStepLR,
            classic.ConstantLR,
            classic.LinearLR,
            classic.ExponentialLR,
            classic.PolynomialLR,
            classic.CosineAnnealingLR,
            classic.CosineAnnealingWarmRestarts,
            classic.CyclicLR,
            classic.OneCycleLR,
            classic.ReduceLROnPlateau,
        ),
    ),
    (
        "Modern (KempnerForge semantics)",
        (
            modern.WarmupCosine,
            modern.WarmupLinear,
            modern.WarmupConstant,
            modern.WarmupStableDecay,
            modern.Rex,
            modern.InverseSqrt,
            modern.NoDecay,
        ),
    ),
    ("Composition", (compose.SequentialLR, compose.ChainedScheduler)),
)

_CLASSES: dict[str, type[StepSizeScheduler]] = {
    c.__name__.lower(): c for _, group in CATALOGUE for c in group
}
_PYTHON_ONLY = {"lambdalr": classic.LambdaLR, "multiplicativelr": classic.MultiplicativeLR}
_COMPOSITE = (compose.SequentialLR, compose.ChainedScheduler)
# Constructor parameters that are not keys.
_NOT_KEYS = {"self", "lr", "fn", "scale_fn", "schedulers", "inner"}
# Filled from the learner's total number of updates when not set.
_FROM_TOTAL = {"t_max", "total_steps"}


def names() -> list[str]:
    """Every schedule selectable with ``ml.opt.decay.class.name``, in catalogue order."""
    return [c.__name__ for _, group in CATALOGUE for c in group]


def _closest(name: str) -> list[str]:
    low = name.lower()
    return sorted(
        names(),
        key=lambda n: -difflib.SequenceMatcher(None, low, n.lower()).ratio(),
    )


def schedule_class(name: str, key: str = CLASS_KEY) -> type[StepSizeScheduler]:
    """The schedule class for a (case-insensitive) name; ValueError lists valid names."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{key} is empty: expected one of {', '.join(names())}")
    low = name.strip().lower()
    if low in _CLASSES:
        return _CLASSES[low]
    if low in _PYTHON_ONLY:
        cls = _PYTHON_ONLY[low]
        raise ValueError(
            f"{key}={name}: {cls.__name__} takes a Python function and cannot be configured in "
            f"properties; build decay.{cls.__name__}(lr, fn) in Python, or use one of "
            f"{', '.join(names())}"
        )
    raise ValueError(
        f"{key}={name}: unknown schedule; valid names (closest first): {', '.join(_closest(name))}"
    )


def _suffix(param: str) -> str:
    return param.replace("_", ".")


def schedule_keys(cls: type[StepSizeScheduler]) -> list[tuple[str, inspect.Parameter]]:
    """(key suffix, constructor parameter) for every key a schedule reads, in signature order."""
    out = []
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name in _NOT_KEYS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append((_suffix(name), p))
    return out


# --- reading a configuration ---------------------------------------------------------------------

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_WHAT = {
    "int": "an integer",
    "float": "a finite number",
    "bool": "true or false",
    "str": "a string",
    "int_list": "a comma-separated list of integers",
    "float_list": "a comma-separated list of numbers",
    "str_list": "a comma-separated list of names",
}
_CHILD = re.compile(r"^ml\.opt\.decay\.(\d+)\.(.+)$")


def _declaration(key: str) -> Param | None:
    p = _BY_NAME.get(key)
    if p is not None:
        return p
    m = _CHILD.match(key)
    if m:
        return _BY_NAME.get(f"{PREFIX}<i>.{m.group(2)}")
    return None


def _scalar(t: str, v: Any) -> Any:
    if t == "bool":
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
            return v.strip().lower() in _TRUE
        raise ValueError
    if t == "int":
        if isinstance(v, bool):
            raise ValueError
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str):
            s = v.strip()
            try:
                return int(s)
            except ValueError:
                f = float(s)
                if f.is_integer():
                    return int(f)
        raise ValueError
    if t == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError
        f = float(v)
        if not math.isfinite(f):
            raise ValueError
        return f
    if not isinstance(v, str):
        raise ValueError
    return v.strip()


def convert(param: Param, value: Any, name: str | None = None) -> Any:
    """Convert a raw properties string (or a typed value) to ``param``'s type and check it."""
    name = name or param.name
    if value is None:
        return None
    try:
        if param.type.endswith("_list"):
            if isinstance(value, str):
                items: list[Any] = [s.strip() for s in value.split(",")] if value.strip() else []
            elif isinstance(value, (list, tuple)):
                items = list(value)
            else:
                raise ValueError
            typed: Any = [_scalar(param.type[:-5], v) for v in items]
        else:
            typed = _scalar(param.type, value)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"{name}={value} is invalid: expected {_WHAT[param.type]}") from None
    if param.choices and param.type == "str":
        match = {c.lower(): c for c in param.choices}.get(typed.lower())
        if match is None:
            raise ValueError(
                f"{name}={value} is invalid: expected one of {', '.join(param.choices)}"
            )
        typed = match
    if param.check is not None:
        for item in typed if isinstance(typed, list) else [typed]:
            problem = param.check(item)
            if problem:
                raise ValueError(f"{name}={value} is invalid: expected {problem}")
    return typed


class _Reader:
    """Typed access to a Config (typed values, ``is_set``/``source``) or a plain mapping of
    properties strings or typed values."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        if not isinstance(conf, Mapping):
            raise TypeError(
                f"from_conf: expected a mapping of keys to values, got {type(conf).__name__}"
            )
        self.conf = conf
        self.used: set[str] = set()

    def _raw(self, key: str) -> Any:
        try:
            return self.conf[key]
        except KeyError:
            return None

    def is_set(self, key: str) -> bool:
        is_set = getattr(self.conf, "is_set", None)
        if callable(is_set):
            try:
                return bool(is_set(key))
            except KeyError:
                return False
        return self._raw(key) is not None

    def where(self, key: str) -> str:
        source = getattr(self.conf, "source", None)
        if callable(source) and self.is_set(key):
            try:
                return f" (set in {source(key)})"
            except KeyError:
                return ""
        return ""

    def get(self, key: str, mark: bool = True) -> Any:
        if mark:
            self.used.add(key)
        param = _declaration(key)
        if param is None:
            raise KeyError(key)
        value = self._raw(key)
        if value is None:
            return param.default
        try:
            return convert(param, value, key)
        except ValueError as e:
            raise ValueError(f"{e}{self.where(key)}") from None

    def keys(self) -> list[str]:
        return [k for k in self.conf if isinstance(k, str)]


def _param_error(e: ParamError, prefix: str, r: _Reader) -> ValueError:
    key = LR_KEY if e.param == "lr" else prefix + _suffix(e.param)
    if e.param.startswith("schedulers["):
        key = PREFIX + "schedulers"
    # The valid-range text names other parameters in Python; name them as keys here.
    e.valid = re.sub(
        r"\b[a-z]+(?:_[a-z0-9]+)+\b",
        lambda m: prefix + _suffix(m.group(0)) if _suffix(m.group(0)) in _SUFFIXES else m.group(0),
        e.valid,
    )
    hint = r.where(key)
    if e.param in _FROM_TOTAL and not r.is_set(key):
        hint = " (not set: the total number of updates, epochs × updates per epoch, was used)"
    return ValueError(e.render(key, properties=True) + hint)


def _build_one(
    r: _Reader,
    name: str,
    name_key: str,
    prefix: str,
    lr: float,
    total_steps: int | None,
    top: bool,
) -> StepSizeScheduler:
    cls = schedule_class(name, name_key)
    if cls in _COMPOSITE:
        if not top:
            raise ValueError(
                f"{name_key}={name}: a {cls.__name__} cannot be a child in properties (only one "
                "level of ml.opt.decay.<i>.*); nest schedules with the Python API"
            )
        return _build_composite(r, cls, lr, total_steps)
    kwargs: dict[str, Any] = {}
    own_warmup = any(p.name == "warmup_steps" for _, p in schedule_keys(cls))
    warmup = None if own_warmup else r.get(prefix + "warmup.steps")
    if warmup and total_steps is not None:
        # The inner schedule starts after the warmup, so it spans the remaining updates.
        total_steps = max(1, total_steps - warmup)
    for suffix, p in schedule_keys(cls):
        key = prefix + suffix
        value = r.get(key)
        if value is None and p.name in _FROM_TOTAL and total_steps is not None:
            value = total_steps
        if value is None:
            if p.default is inspect.Parameter.empty:
                hint = (
                    " (or let the learner supply the total number of updates)"
                    if p.name in _FROM_TOTAL
                    else ""
                )
                raise ValueError(f"{cls.__name__}: {key} is required{hint}; see docs/decay.md")
            continue
        kwargs[p.name] = value
    if cls is angel.StandardDecay and top:
        old = _deprecated_alpha(r, alpha_set=r.is_set(prefix + "alpha"))
        if old is not None:
            kwargs["alpha"] = old
    try:
        sched = cls(lr, **kwargs)
        if warmup:
            sched = compose.Warmup(sched, warmup)
    except ParamError as e:
        raise _param_error(e, prefix, r) from None
    return sched


def _deprecated_alpha(r: _Reader, alpha_set: bool = False) -> float | None:
    """StandardDecay's alpha from the deprecated ml.learn.decay, when that is set explicitly."""
    old = r.get("ml.learn.decay")
    if old is None:
        return None
    if alpha_set:
        warnings.warn(
            "ml.learn.decay is deprecated and ignored because ml.opt.decay.alpha is set; "
            "remove ml.learn.decay",
            DecayDeprecationWarning,
            stacklevel=4,
        )
        return None
    warnings.warn(
        f"ml.learn.decay={old} is deprecated: StandardDecay uses it as ml.opt.decay.alpha; "
        f"set ml.opt.decay.alpha={old} instead",
        DecayDeprecationWarning,
        stacklevel=4,
    )
    return float(old)


def _build_composite(
    r: _Reader, cls: type[StepSizeScheduler], lr: float, total_steps: int | None
) -> StepSizeScheduler:
    listed: list[str] = r.get(PREFIX + "schedulers") or []
    # Child indices that appear in any ml.opt.decay.<i>.* key.
    indices: dict[int, list[str]] = {}
    for key in r.keys():
        m = _CHILD.match(key)
        if m and r.is_set(key):
            indices.setdefault(int(m.group(1)), []).append(key)
    n = len(listed)
    named = {i for i, keys in indices.items() if f"{PREFIX}{i}.class.name" in keys}
    if named:
        n = max(n, max(named) + 1)
    if n == 0:
        raise ValueError(
            f"{cls.__name__}: {PREFIX}schedulers is required: a comma-separated list of child "
            f"schedules (child i configured by {PREFIX}<i>.*)"
        )
    for i in sorted(indices):
        if i >= n:
            raise ValueError(
                f"{indices[i][0]}: child index {i} has no class: {PREFIX}schedulers lists {n} "
                f"schedule(s) (valid indices 0..{n - 1}); add it there or set {PREFIX}{i}.class.name"
            )
    milestones = r.get(PREFIX + "milestones") if cls is compose.SequentialLR else None
    warmup = r.get(PREFIX + "warmup.steps")
    if warmup and total_steps is not None:
        total_steps = max(1, total_steps - warmup)
    spans: list[int | None] = [total_steps] * n
    if milestones is not None and len(milestones) == n - 1:
        # Each child of a sequence spans from its milestone to the next (the last one to the end).
        bounds = [0, *milestones]
        for i in range(n):
            end = bounds[i + 1] if i + 1 < n else total_steps
            spans[i] = None if end is None or end - bounds[i] < 1 else end - bounds[i]
    children = []
    for i in range(n):
        key = f"{PREFIX}{i}.class.name"
        own = r.get(key)
        name = own if own is not None else (listed[i] if i < len(listed) else None)
        if own is not None and i < len(listed) and own.lower() != listed[i].lower():
            raise ValueError(
                f"{key}={own} contradicts {PREFIX}schedulers[{i}]={listed[i]}: set one of them"
            )
        if name is None:
            raise ValueError(
                f"{PREFIX}{i}: child index {i} has no class: set {key} or list it in "
                f"{PREFIX}schedulers"
            )
        name_key = key if own is not None else f"{PREFIX}schedulers[{i}]"
        child = _build_one(r, name, name_key, f"{PREFIX}{i}.", lr, spans[i], top=False)
        if not child.composable:
            raise ValueError(
                f"{name_key}={name}: {type(child).__name__} is metric-driven and cannot be a "
                f"child of {cls.__name__}"
            )
        children.append(child)
    try:
        if cls is compose.SequentialLR:
            if milestones is None:
                raise ValueError(
                    f"SequentialLR: {PREFIX}milestones is required: {n - 1} strictly increasing "
                    "update indices at which the next schedule starts"
                )
            sched: StepSizeScheduler = compose.SequentialLR(children, milestones)
        else:
            sched = compose.ChainedScheduler(children)
        if warmup:
            sched = compose.Warmup(sched, warmup)
    except ParamError as e:
        raise _param_error(e, PREFIX, r) from None
    return sched


def from_conf(conf: Mapping[str, Any], total_steps: int | None = None) -> StepSizeScheduler:
    """Build the scheduler a configuration asks for.

    ``conf`` is a typed ``Config`` or any mapping of keys to properties strings or typed values.
    ``ml.opt.decay.class.name`` selects the schedule (case-insensitive), ``ml.learn.rate`` is the
    initial step size, ``ml.opt.decay.*`` its parameters. ``total_steps`` (epochs × updates per
    epoch, from the learner) fills ``ml.opt.decay.total.steps`` / ``.t.max`` (and so the decay
    length of the Warmup* schedules) when they are not set. Raises ValueError naming the key,
    the value and what is valid.
    """
    if total_steps is not None and (
        isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1
    ):
        raise ValueError(
            f"from_conf: total_steps={total_steps!r} is invalid: expected an integer >= 1"
        )
    r = _Reader(conf)
    for key in r.keys():
        if key.startswith(PREFIX) and _declaration(key) is None:
            close = difflib.get_close_matches(key, list(_BY_NAME), n=3, cutoff=0.6)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ValueError(f"unknown key {key}{hint}; docs/decay.md lists every decay key")
        if key.startswith(PREFIX) or key in (LR_KEY, "ml.learn.decay"):
            r.get(key, mark=False)  # every value is checked, even those this schedule ignores
    lr = r.get(LR_KEY)
    name = r.get(CLASS_KEY)
    sched = _build_one(r, name, CLASS_KEY, PREFIX, lr, total_steps, top=True)
    unused = [
        k
        for k in r.keys()
        if k.startswith(PREFIX)
        and k not in r.used
        and k not in (PREFIX + "on.batch", PREFIX + "intervals")
        and not _CHILD.match(k)
        and r.is_set(k)
    ]
    if unused:
        warnings.warn(
            f"{', '.join(sorted(unused))}: set but not used by {type(sched).__name__}",
            UserWarning,
            stacklevel=2,
        )
    return sched
