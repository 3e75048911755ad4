"""Step-size schedules: pure functions of the update count, exact against Angel and torch.

The public API is :func:`from_conf` (build the schedule a configuration asks for, from a loaded
``angelconf.config.Config`` or a plain mapping of key names to strings or typed values) and
:class:`StepSizeScheduler` (what it returns: ``lr_at(k)``, ``peek()``/``advance()`` in a training
loop, ``next()`` Angel style, ``state_dict()``). Every schedule class is exported for the Python
API, and :data:`KEYS` lists every configuration key decay reads (docs/decay.md documents them).

>>> from decay import from_conf
>>> s = from_conf({"ml.opt.decay.class.name": "StepLR", "ml.opt.decay.step.size": "2",
...                "ml.learn.rate": "1.0"})
>>> [s.next() for _ in range(5)]
[1.0, 1.0, 0.1, 0.1, 0.010000000000000002]

Layout: ``base`` (the contract), ``angel``, ``classic``, ``cyclic``, ``plateau``, ``modern``,
``compose`` (the schedules), ``keys`` (the key declarations), ``registry`` (the catalogue of
names), ``factory`` (``from_conf``), ``steps`` (updates per epoch), ``render`` (docs/decay.md),
``torch`` (the adapter to torch optimizers). Invariant: imports only the standard library and
``angelconf.config`` (itself standard library only), except ``decay.torch``, which is not imported
here.
"""

from __future__ import annotations

from decay.angel import ConstantLearningRate, CorrectionDecay, StandardDecay, WarmRestarts
from decay.base import ParamError, StepSizeScheduler
from decay.classic import (
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiplicativeLR,
    MultiStepLR,
    PolynomialLR,
    StepLR,
)
from decay.compose import ChainedScheduler, SequentialLR, Warmup
from decay.cyclic import CyclicLR, OneCycleLR
from decay.docs import render_markdown
from decay.factory import DecayDeprecationWarning, UnusedDecayKeys, from_conf
from decay.keys import KEYS
from decay.modern import (
    InverseSqrt,
    NoDecay,
    Rex,
    WarmupConstant,
    WarmupCosine,
    WarmupLinear,
    WarmupStableDecay,
)
from decay.plateau import ReduceLROnPlateau
from decay.registry import names
from decay.steps import updates_per_epoch

__all__ = [
    "KEYS",
    "ChainedScheduler",
    "ConstantLR",
    "ConstantLearningRate",
    "CorrectionDecay",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "DecayDeprecationWarning",
    "ExponentialLR",
    "InverseSqrt",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "NoDecay",
    "OneCycleLR",
    "ParamError",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "Rex",
    "SequentialLR",
    "StandardDecay",
    "StepLR",
    "StepSizeScheduler",
    "UnusedDecayKeys",
    "WarmRestarts",
    "Warmup",
    "WarmupConstant",
    "WarmupCosine",
    "WarmupLinear",
    "WarmupStableDecay",
    "from_conf",
    "names",
    "render_markdown",
    "updates_per_epoch",
]
