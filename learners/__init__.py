"""learners: GraphLearner, models, data readers and metrics; where decay and angelps meet.

The public face is imported lazily (PEP 562): ``import learners.plan`` (key declarations,
used by the CLI's config-only verbs) must not pull in torch or Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it
_EXPORTS = {
    "GraphLearner": "learners.learner",
    "TrainResult": "learners.learner",
}

__all__ = ["GraphLearner", "TrainResult"]  # the keys of _EXPORTS, spelled out for linters

if TYPE_CHECKING:
    from learners.learner import GraphLearner, TrainResult


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'learners' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value
