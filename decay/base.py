"""The step-size scheduler contract: a schedule is a pure function of the update count.

``lr_at(k)`` is the step size applied to update ``k`` (k = 0, 1, 2, ...; or epoch ``k`` when the
learner decays once per epoch). The only state is the count of updates already made, so a
scheduler restored from ``state_dict()`` continues with identical numbers.

Invariants: each schedule writes its formula once, in ``_lr(k)``; ``peek()`` is
``lr_at(count)``, ``advance(n)`` adds to the count, and ``next()`` is ``lr_at(count)`` then
``count += 1`` (nothing is computed ahead, so a metric-driven schedule's reduction applies from
the next call on). Parameter errors are :class:`ParamError`, worded as configuration errors are
(``name=value is not valid: expected ...``).
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["ParamError", "StepSizeScheduler"]

_INF = math.inf


class ParamError(ValueError):
    """A bad schedule parameter: names the schedule, the parameter, the value and what is valid.

    ``from_conf`` re-raises it with the properties key (``ml.opt.decay.gamma``) in place of the
    Python parameter name (``gamma``).
    """

    def __init__(self, schedule: str, param: str, value: Any, valid: str) -> None:
        self.schedule = schedule
        self.param = param
        self.value = value
        self.valid = valid
        super().__init__(self.render(param))

    def render(self, name: str, properties: bool = False) -> str:
        """The message with ``name`` standing for the parameter; ``properties`` shows the value
        as it is written in a .properties file (``5,5``) instead of Python (``[5, 5]``)."""
        if self.value is None:
            return f"{self.schedule}: {name} is required: {self.valid}"
        shown = _show(self.value) if properties else repr(self.value)
        return f"{self.schedule}: {name}={shown} is not valid: expected {self.valid}"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_show(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


class StepSizeScheduler:
    """Base class: subclasses implement ``_lr(k)`` (and ``_momentum(k)`` if they drive momentum).

    Usage in a training loop (one update = one optimizer step, after gradient accumulation)::

        lr = sched.peek()            # step size for the coming update
        applied = optimizer_step(lr)  # e.g. False when AMP found inf/NaN and skipped it
        if applied:
            sched.advance()          # a skipped update does not advance the schedule

    or, Angel style, ``lr = sched.next()`` (returns ``lr_at(count)`` and advances).
    """

    #: True for schedules fed a validation metric through ``step(metric)`` (ReduceLROnPlateau,
    #: or a warmup in front of one): they cannot be children of a sequence or chain.
    metric_driven: bool = False

    def __init__(self, lr: float) -> None:
        _check_float(self, "lr", lr, lr >= 0 if _is_real(lr) else False, "a finite number >= 0")
        self.lr = float(lr)
        self._count = 0  # updates already made: the only state

    # --- the pure function ---------------------------------------------------------------------

    def lr_at(self, k: int) -> float:
        """The step size applied to update ``k`` (0-based)."""
        return self._lr(_check_k(k))

    def momentum_at(self, k: int) -> float | None:
        """The momentum (or Adam's beta1) for update ``k``; None when the schedule leaves it alone."""
        return self._momentum(_check_k(k))

    def value_at(self, x: float) -> tuple[float, float | None]:
        """Step size and momentum at a real position ``x >= 0``: the same formulas read between
        updates (a fractional epoch when the learner counts the schedule in epochs; step-like
        schedules such as StepLR change at whole multiples, smooth ones move continuously)."""
        if not 0 <= x < _INF:  # (negative, NaN and infinite positions fail; cheap: per update)
            raise ValueError(f"position x={x!r} is not valid: expected a finite number >= 0")
        at: Any = x  # the formulas are written for integers and hold for reals
        return self._rates(at)

    def _rates(self, k: int) -> tuple[float, float | None]:
        """``(_lr(k), _momentum(k))``; schedules that share work between the two override it."""
        return self._lr(k), self._momentum(k)

    def _lr_only(self, k: int) -> tuple[float, float | None]:
        return self._lr(k), None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A schedule that leaves the momentum alone reads one formula per update, not two.
        if cls._momentum is StepSizeScheduler._momentum and "_rates" not in cls.__dict__:
            cls._rates = StepSizeScheduler._lr_only  # type: ignore[method-assign]

    def _lr(self, k: int) -> float:
        raise NotImplementedError

    def _momentum(self, k: int) -> float | None:
        return None

    def _boundary(self, count: int) -> bool:
        """Angel's ``isIntervalBoundary`` after ``count`` calls of ``next()``; False by default."""
        return False

    # --- the count -----------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Number of updates already made (= calls of ``next()``/``advance()``)."""
        return self._count

    def next(self) -> float:
        """Return the step size of the next update and advance the count (Angel's ``next()``).

        If the step size cannot be computed (a growing schedule overflows), the error is raised
        and the count stays where it was.
        """
        k = self._count
        lr = self._lr(k)  # _lr, not lr_at: the count is a valid index by construction
        self._count = k + 1
        return lr

    def peek(self) -> float:
        """The step size of the next update, without advancing."""
        return self._lr(self._count)

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more updates (call after an update was really applied)."""
        if type(n) is not int or n < 0:  # (not isinstance: bool is refused too; per update)
            raise ValueError(f"advance(n): n={n!r} is not valid: expected an integer >= 0")
        self._count += n

    def is_interval_boundary(self) -> bool:
        """Angel's validation signal (``ml.opt.decay.intervals``); see each schedule."""
        return self._boundary(self._count)

    # --- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: the count only."""
        return {"count": self._count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the count saved by ``state_dict()``."""
        if not isinstance(state, Mapping) or "count" not in state:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: expected a mapping with a 'count', "
                f"got {state!r}"
            )
        count = state["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: count={count!r} is not valid: "
                "expected an integer >= 0"
            )
        self._count = count

    # --- description ---------------------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        """The constructor parameters of this schedule (for titles, logs and reprs)."""
        out: dict[str, Any] = {}
        for name, p in inspect.signature(type(self).__init__).parameters.items():
            if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            out[name] = getattr(self, name, None)
        return out

    def phases(self) -> list[tuple[int, str]]:
        """``(k, what)``: the steps at which this schedule changes phase in a way a job is
        meant to reach (a warmup's end, a first decay), for a check that the job is long
        enough (:func:`unreached`); none by default."""
        return []

    def describe(self) -> str:
        """``Name(param=value, ...)``, nested schedules included."""
        inner = ", ".join(f"{k}={_describe_value(v)}" for k, v in self.params().items())
        return f"{type(self).__name__}({inner})"

    def __repr__(self) -> str:
        return self.describe()


# --- validation helpers used by the schedules ----------------------------------------------------


def _describe_value(v: Any) -> str:
    if isinstance(v, StepSizeScheduler):
        return v.describe()
    if isinstance(v, (list, tuple)) and any(isinstance(x, StepSizeScheduler) for x in v):
        return "[" + ", ".join(_describe_value(x) for x in v) + "]"
    if callable(v):
        return getattr(v, "__name__", type(v).__name__)
    if v is None:
        return "None"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return _show(v)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"update index k={k!r} is not valid: expected an integer >= 0")
    return k


def _name(owner: Any) -> str:
    return owner if isinstance(owner, str) else type(owner).__name__


def _check_float(owner: Any, param: str, value: Any, ok: bool, valid: str) -> float:
    if not _is_real(value) or not ok:
        raise ParamError(_name(owner), param, value, valid)
    return float(value)


def _check_int(owner: Any, param: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ParamError(_name(owner), param, value, f"an integer >= {low}")
    return value


def _check_milestones(owner: Any, param: str, value: Any, low: int) -> list[int]:
    valid = f"a strictly increasing list of integers >= {low}"
    if not isinstance(value, (list, tuple)) or not value:
        raise ParamError(_name(owner), param, value if value else None, valid)
    for m in value:
        if isinstance(m, bool) or not isinstance(m, int) or m < low:
            raise ParamError(_name(owner), param, list(value), valid)
    if any(b <= a for a, b in itertools.pairwise(value)):
        raise ParamError(_name(owner), param, list(value), valid)
    return list(value)


def _check_choice(owner: Any, param: str, value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str):
        for c in choices:
            if c.lower() == value.lower():
                return c
    raise ParamError(_name(owner), param, value, "one of " + ", ".join(choices))


def _check_bool(owner: Any, param: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParamError(_name(owner), param, value, "true or false")
    return value


def _finite(owner: Any, k: int, value: float) -> float:
    """Guard against overflow of growing schedules (gamma > 1): never return inf or NaN."""
    if not math.isfinite(value):
        raise ValueError(
            f"{_name(owner)}: the step size at update {k} is {value!r} (overflow); "
            "use a smaller gamma or fewer updates"
        )
    return value


def _pow(owner: Any, k: int, base: float, exponent: float) -> float:
    try:
        return _finite(owner, k, base**exponent)
    except OverflowError:
        return _finite(owner, k, math.inf)
    except ZeroDivisionError:  # 0.0 ** negative; schedules validate against it, keep the contract
        return _finite(owner, k, math.inf)


def unreached(sched: StepSizeScheduler, total: int) -> list[tuple[int, str]]:
    """The phases of ``sched`` (:meth:`StepSizeScheduler.phases`) that a job of ``total``
    steps (k = 0 .. total − 1) never reaches: a warmup longer than the job ends it short of
    its step size, a first decay past its end never decays."""
    return [(k, what) for k, what in sched.phases() if k >= total]
