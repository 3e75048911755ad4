"""Step-size schedules: pure functions of the update count, exact against Angel and torch.

Imports only the standard library (``decay.torch`` holds the adapter to torch optimizers).

>>> import decay
>>> s = decay.from_conf({"ml.opt.decay.class.name": "StepLR", "ml.opt.decay.step.size": "2",
...                      "ml.learn.rate": "1.0"})
>>> [s.next() for _ in range(5)]
[1.0, 1.0, 0.1, 0.1, 0.010000000000000002]
"""

from __future__ import annotations

from decay.angel import ConstantLearningRate, CorrectionDecay, StandardDecay, WarmRestarts
from decay.base import ParamError, StepSizeScheduler
from decay.classic import (
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    StepLR,
)
from decay.compose import ChainedScheduler, SequentialLR, Warmup
from decay.docs import render_markdown
from decay.modern import (
    InverseSqrt,
    NoDecay,
    Rex,
    WarmupConstant,
    WarmupCosine,
    WarmupLinear,
    WarmupStableDecay,
)
from decay.registry import KEYS, DecayDeprecationWarning, Param, from_conf, names
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
    "Param",
    "ParamError",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "Rex",
    "SequentialLR",
    "StandardDecay",
    "StepLR",
    "StepSizeScheduler",
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
