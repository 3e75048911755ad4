"""The catalogue: every schedule selectable by name, and the keys each one reads.

``ml.opt.decay.class.name`` names a class of :data:`CATALOGUE` (case-insensitive). A schedule's
keys are its constructor's parameters (:func:`schedule_keys`): parameter ``step_size`` is key
suffix ``step.size``; a parameter without a default is a required key. Invariants: every class in
the catalogue has exactly one name; every constructor parameter outside :data:`NOT_KEYS` is a key
declared in ``decay.keys`` (a test checks it); the catalogue order is the order of docs/decay.md.
"""

from __future__ import annotations

import difflib
import inspect

from decay import angel, classic, compose, cyclic, modern, plateau
from decay.base import StepSizeScheduler
from decay.keys import CLASS_KEY

__all__ = [
    "CATALOGUE",
    "COMPOSITE",
    "FROM_TOTAL",
    "names",
    "schedule_class",
    "schedule_keys",
    "suffix",
]

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
            cyclic.CyclicLR,
            cyclic.OneCycleLR,
            plateau.ReduceLROnPlateau,
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

#: The schedules whose children are configured under ``ml.opt.decay.<i>.*``.
COMPOSITE: tuple[type[StepSizeScheduler], ...] = (compose.SequentialLR, compose.ChainedScheduler)
#: Parameters filled from the learner's total number of updates when their key is not set.
FROM_TOTAL = frozenset({"t_max", "total_steps"})
#: Constructor parameters that are not keys.
NOT_KEYS = frozenset({"self", "lr", "fn", "scale_fn", "schedulers", "inner"})

_CLASSES: dict[str, type[StepSizeScheduler]] = {
    c.__name__.lower(): c for _, group in CATALOGUE for c in group
}
# Schedules that take a Python function: named here only to explain why properties cannot build them.
_PYTHON_ONLY = {"lambdalr": classic.LambdaLR, "multiplicativelr": classic.MultiplicativeLR}


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


def suffix(param: str) -> str:
    """The key suffix of a constructor parameter: ``step_size`` -> ``step.size``."""
    return param.replace("_", ".")


def schedule_keys(cls: type[StepSizeScheduler]) -> list[tuple[str, inspect.Parameter]]:
    """(key suffix, constructor parameter) for every key a schedule reads, in signature order."""
    out = []
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name in NOT_KEYS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append((suffix(name), p))
    return out
