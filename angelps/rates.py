"""The step of one push when a schedule sets more than its step size: :class:`StepRates`.

A push carries its step size ``lr`` (a float). A schedule that also drives the momentum (torch's
CyclicLR and OneCycleLR cycle SGD's momentum or Adam's beta1), or tables on schedules of their
own, make the push carry a :class:`StepRates` in its place: the step size and momentum of every
table, with per-table values where a table has its own. The shard resolves it per table
(:meth:`StepRates.of`) and the optimizer uses the momentum given in place of the table's
configured one (:func:`angelps.optim.apply`). It crosses the wire as a JSON list
(:meth:`StepRates.to_json`), Ray as a frozen dataclass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

__all__ = ["Step", "StepRates", "check_momentum", "rate_of"]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_momentum(m: Any) -> float | None:
    """A momentum (or Adam's beta1) a push carries: None, or a number in [0, 1)."""
    if m is None:
        return None
    if not _finite(m) or not 0 <= m < 1:
        raise ValueError(f"momentum {m!r} must be a number in [0, 1)")
    return float(m)


def _check_lr(lr: Any) -> float:
    if not _finite(lr) or lr < 0:
        raise ValueError(f"learning rate {lr!r} must be a finite number >= 0")
    return float(lr)


class _Rates(NamedTuple):
    lr: float
    momentum: float | None
    tables: Mapping[str, tuple[float, float | None]]


class StepRates(_Rates):
    """Step size and momentum of one push, with per-table values.

    ``lr``/``momentum`` apply to every table not in ``tables``; ``tables`` maps a table name to
    its own ``(lr, momentum)``. A momentum of None keeps the table's configured one
    (``ml.opt.momentum`` / ``ml.opt.adam.beta1``). An immutable tuple whose constructor checks
    every value (also when Ray unpickles one at a shard); :meth:`unchecked` skips the checks.
    """

    __slots__ = ()

    def __new__(
        cls,
        lr: float,
        momentum: float | None = None,
        tables: Mapping[str, tuple[float, float | None]] | None = None,
    ) -> StepRates:
        own: dict[str, tuple[float, float | None]] = {}
        for name, pair in dict(tables or {}).items():
            if not isinstance(name, str) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"StepRates.tables: {name!r}: {pair!r} is not (lr, momentum)")
            own[name] = (_check_lr(pair[0]), check_momentum(pair[1]))
        return tuple.__new__(cls, (_check_lr(lr), check_momentum(momentum), own))

    @classmethod
    def unchecked(
        cls, lr: float, momentum: float | None, tables: Mapping[str, tuple[float, float | None]]
    ) -> StepRates:
        """Built without the checks, from values the caller has checked (the learner's rate
        plan, once per update: the checks would cost more than the schedule)."""
        return tuple.__new__(cls, (lr, momentum, tables))

    def of(self, table: str) -> tuple[float, float | None]:
        """``(lr, momentum)`` of ``table``."""
        return self.tables.get(table, (self.lr, self.momentum))

    def to_json(self) -> list[Any]:
        """``[lr, momentum, {table: [lr, momentum]}]``: the wire's form."""
        return [self.lr, self.momentum, {k: list(v) for k, v in self.tables.items()}]

    @classmethod
    def from_json(cls, obj: Any) -> StepRates:
        """The inverse of :meth:`to_json`; ValueError for anything else."""
        if not isinstance(obj, list) or len(obj) != 3 or not isinstance(obj[2], dict):
            raise ValueError(f"malformed step rates {obj!r}")
        return cls(obj[0], obj[1], {k: tuple(v) for k, v in obj[2].items()})


#: What a push carries as its step: a step size, or the rates of a schedule-driven push.
Step: TypeAlias = float | StepRates


def rate_of(step: Step, table: str) -> tuple[float, float | None]:
    """``(lr, momentum)`` of ``table`` under ``step`` (a plain float: no momentum override)."""
    if isinstance(step, StepRates):
        return step.of(table)
    return step, None
