"""The factory: :func:`from_conf` builds the schedule a configuration asks for.

``conf`` is a loaded ``angelconf.config.Config`` or a plain mapping of key names to properties
strings or typed values. Every ``ml.opt.decay.*`` value is converted and checked through
``angelconf.config.validate`` against its declaration in ``decay.keys``, so a bad value reads the
same as when the loader catches it (``name=value is not valid: expected ...``), with where it was
set appended when ``conf`` knows. A schedule's own parameter checks raise ``ParamError``, which is
re-raised here with the key in place of the parameter name. Invariants: every decay value present
is checked, even one the chosen schedule ignores; an unknown ``ml.opt.decay.*`` key is an error;
a key set but not used warns.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Mapping
from typing import Any

from angelconf.config import ConfigError, KeyIndex, validate
from decay import angel, compose
from decay.base import ParamError, StepSizeScheduler
from decay.keys import CLASS_KEY, DEPRECATED_ALPHA_KEY, KEYS, LR_KEY, PREFIX, SCHEDULE_SUFFIXES
from decay.registry import COMPOSITE, FROM_TOTAL, schedule_class, schedule_keys, suffix

__all__ = ["DecayDeprecationWarning", "UnusedDecayKeys", "from_conf"]

_INDEX = KeyIndex(KEYS)
_CHILD = re.compile(r"^ml\.opt\.decay\.(\d+)\.(.+)$")
_LISTING = "docs/decay.md lists every decay key"
# Keys the learner reads, not the schedule: never reported as unused.
_LEARNER_KEYS = (PREFIX + "on.batch", PREFIX + "intervals", PREFIX + "unit")


class DecayDeprecationWarning(UserWarning):
    """A deprecated decay key was used (shown by default, unlike DeprecationWarning)."""


class UnusedDecayKeys(UserWarning):
    """Decay keys set but not read by the schedule built (``keys``, sorted; ``schedule``: its
    class name), so that a caller can tell where each was set (an Angel JSON's ``train``
    block sets keys its decay ignores, as Angel's did)."""

    def __init__(self, keys: list[str], schedule: str) -> None:
        super().__init__(f"{', '.join(keys)}: set but not used by {schedule}")
        self.keys = tuple(keys)
        self.schedule = schedule

    def __reduce__(self) -> tuple[type[UnusedDecayKeys], tuple[list[str], str]]:
        return type(self), (list(self.keys), self.schedule)


class _Reader:
    """Typed access to a Config (typed values, ``is_set``/``source``) or a plain mapping of
    properties strings or typed values; remembers which keys the build read."""

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
        """The typed, checked value of a declared key, or its declared default when unset."""
        if mark:
            self.used.add(key)
        declared = _INDEX.find(key)
        if declared is None:
            raise KeyError(key)
        value = self._raw(key)
        if value is None:
            return declared.default
        try:
            return validate(declared, value, key)
        except ConfigError as e:
            raise ConfigError(f"{e}{self.where(key)}") from None

    def keys(self) -> list[str]:
        return [k for k in self.conf if isinstance(k, str)]


def _param_error(e: ParamError, prefix: str, r: _Reader) -> ValueError:
    """A schedule's ParamError, with keys in place of the Python parameter names."""
    key = LR_KEY if e.param == "lr" else prefix + suffix(e.param)
    if e.param.startswith("schedulers["):
        key = PREFIX + "schedulers"
    # The valid-range text names other parameters in Python; name them as keys here.
    e.valid = re.sub(
        r"\b[a-z]+(?:_[a-z0-9]+)+\b",
        lambda m: (
            prefix + suffix(m.group(0)) if suffix(m.group(0)) in SCHEDULE_SUFFIXES else m.group(0)
        ),
        e.valid,
    )
    hint = r.where(key)
    if e.param in FROM_TOTAL and not r.is_set(key):
        hint = f" (not set: {_total_is(r)}, was used)"
    return ValueError(e.render(key, properties=True) + hint)


def _total_is(r: _Reader) -> str:
    """What the job's total length counts, as ml.opt.decay.unit and .on.batch say."""
    unit = str(r.get(PREFIX + "unit", mark=False)).lower()
    if unit == "samples":
        return "the total number of samples, epochs × rows per epoch"
    if unit == "epochs" or not r.get(PREFIX + "on.batch", mark=False):
        return (
            "the number of epochs (the schedule steps once an epoch: ml.opt.decay.on.batch=false)"
        )
    return "the total number of updates, epochs × updates per epoch"


def _after_warmup(total_steps: int | None, warmup: int | None) -> int | None:
    """The updates left to the schedule behind a warmup (it starts after the warmup)."""
    if warmup and total_steps is not None:
        return max(1, total_steps - warmup)
    return total_steps


def _kwargs(
    r: _Reader, cls: type[StepSizeScheduler], prefix: str, total_steps: int | None
) -> dict[str, Any]:
    """The constructor arguments of ``cls`` from its keys under ``prefix``."""
    kwargs: dict[str, Any] = {}
    for key_suffix, p in schedule_keys(cls):
        key = prefix + key_suffix
        value = r.get(key)
        if value is None and p.name in FROM_TOTAL and total_steps is not None:
            value = total_steps
        if value is None:
            if p.default is inspect.Parameter.empty:
                hint = (
                    " (or let the learner supply the total number of updates)"
                    if p.name in FROM_TOTAL
                    else ""
                )
                raise ValueError(f"{cls.__name__}: {key} is required{hint}; see docs/decay.md")
            continue
        kwargs[p.name] = value
    return kwargs


def _build_one(
    r: _Reader,
    name: str,
    name_key: str,
    prefix: str,
    lr: float,
    total_steps: int | None,
    top: bool,
) -> StepSizeScheduler:
    """The schedule named ``name`` (read from ``name_key``), configured by keys under ``prefix``."""
    cls = schedule_class(name, name_key)
    if cls in COMPOSITE:
        if not top:
            raise ValueError(
                f"{name_key}={name}: a {cls.__name__} cannot be a child in properties (only one "
                "level of ml.opt.decay.<i>.*); nest schedules with the Python API"
            )
        return _build_composite(r, cls, lr, total_steps)
    own_warmup = any(p.name == "warmup_steps" for _, p in schedule_keys(cls))
    warmup = None if own_warmup else r.get(prefix + "warmup.steps")
    kwargs = _kwargs(r, cls, prefix, _after_warmup(total_steps, warmup))
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
    old = r.get(DEPRECATED_ALPHA_KEY)
    if old is None:
        return None
    if alpha_set:
        warnings.warn(
            f"{DEPRECATED_ALPHA_KEY} is deprecated and ignored because ml.opt.decay.alpha is "
            f"set; remove {DEPRECATED_ALPHA_KEY}",
            DecayDeprecationWarning,
            stacklevel=4,
        )
        return None
    warnings.warn(
        f"{DEPRECATED_ALPHA_KEY}={old} is deprecated: StandardDecay uses it as "
        f"ml.opt.decay.alpha; set ml.opt.decay.alpha={old} instead",
        DecayDeprecationWarning,
        stacklevel=4,
    )
    return float(old)


# --- composite schedules: children under ml.opt.decay.<i>.* -------------------------------------


def _child_count(r: _Reader, cls: type[StepSizeScheduler], listed: list[str]) -> int:
    """How many children: the ``schedulers`` list, or further indices with a class name; every
    ``ml.opt.decay.<i>.*`` key set must belong to one of them."""
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
    return n


def _spans(n: int, milestones: list[int] | None, total_steps: int | None) -> list[int | None]:
    """The number of updates each child spans: all of them, or in a sequence from its milestone
    to the next (the last one to the end)."""
    spans: list[int | None] = [total_steps] * n
    if milestones is not None and len(milestones) == n - 1:
        bounds = [0, *milestones]
        for i in range(n):
            end = bounds[i + 1] if i + 1 < n else total_steps
            spans[i] = None if end is None or end - bounds[i] < 1 else end - bounds[i]
    return spans


def _child(
    r: _Reader,
    parent: type[StepSizeScheduler],
    i: int,
    listed: list[str],
    lr: float,
    span: int | None,
) -> StepSizeScheduler:
    """Child ``i``: named by ``ml.opt.decay.<i>.class.name`` or entry i of ``schedulers``."""
    key = f"{PREFIX}{i}.class.name"
    own = r.get(key)
    name = own if own is not None else (listed[i] if i < len(listed) else None)
    if own is not None and i < len(listed) and own.lower() != listed[i].lower():
        raise ValueError(
            f"{key}={own} contradicts {PREFIX}schedulers[{i}]={listed[i]}: set one of them"
        )
    if name is None:
        raise ValueError(
            f"{PREFIX}{i}: child index {i} has no class: set {key} or list it in {PREFIX}schedulers"
        )
    name_key = key if own is not None else f"{PREFIX}schedulers[{i}]"
    child = _build_one(r, name, name_key, f"{PREFIX}{i}.", lr, span, top=False)
    if child.metric_driven:
        raise ValueError(
            f"{name_key}={name}: {type(child).__name__} is metric-driven and cannot be a "
            f"child of {parent.__name__}"
        )
    return child


def _build_composite(
    r: _Reader, cls: type[StepSizeScheduler], lr: float, total_steps: int | None
) -> StepSizeScheduler:
    """A SequentialLR or ChainedScheduler of the children configured under ml.opt.decay.<i>.*."""
    listed: list[str] = r.get(PREFIX + "schedulers") or []
    n = _child_count(r, cls, listed)
    milestones = r.get(PREFIX + "milestones") if cls is compose.SequentialLR else None
    warmup = r.get(PREFIX + "warmup.steps")
    spans = _spans(n, milestones, _after_warmup(total_steps, warmup))
    children = [_child(r, cls, i, listed, lr, spans[i]) for i in range(n)]
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


# --- the entry point -----------------------------------------------------------------------------


def _check_every_value(r: _Reader) -> None:
    """Reject unknown ``ml.opt.decay.*`` keys and check every decay value present, even those the
    chosen schedule ignores."""
    for key in r.keys():
        if key.startswith(PREFIX) and _INDEX.find(key) is None:
            raise _INDEX.unknown(key, listing=_LISTING)
        if key.startswith(PREFIX) or key in (LR_KEY, DEPRECATED_ALPHA_KEY):
            r.get(key, mark=False)


def _is_table_key(key: str) -> bool:
    declared = _INDEX.find(key)
    return declared is not None and "<table>" in declared.name


def _warn_unused(r: _Reader, sched: StepSizeScheduler) -> None:
    unused = [
        k
        for k in r.keys()
        if k.startswith(PREFIX)
        and k not in r.used
        and k not in _LEARNER_KEYS
        and not _is_table_key(k)  # a table's own schedule reads it (learners)
        and r.is_set(k)
    ]
    if unused:
        warnings.warn(UnusedDecayKeys(sorted(unused), type(sched).__name__), stacklevel=3)


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
            f"from_conf: total_steps={total_steps!r} is not valid: expected an integer >= 1"
        )
    r = _Reader(conf)
    _check_every_value(r)
    lr = r.get(LR_KEY)
    name = r.get(CLASS_KEY)
    sched = _build_one(r, name, CLASS_KEY, PREFIX, lr, total_steps, top=True)
    _warn_unused(r, sched)
    return sched
