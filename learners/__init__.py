"""learners: GraphLearner, models, data readers and metrics; where decay and angelps meet.

The public face is imported lazily (PEP 562): ``import learners.job.loop_options`` (key declarations,
used by the CLI's config-only verbs) must not pull in torch or Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from angelps.lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "GraphLearner": "learners.job.learner",
    "TrainResult": "learners.job.learner",
}

__all__ = ["GraphLearner", "TrainResult"]  # the keys of _EXPORTS, spelled out for linters

if TYPE_CHECKING:
    from learners.job.learner import GraphLearner, TrainResult


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
