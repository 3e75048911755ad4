"""``ml.learn.rate.scaling``: the step sizes scaled with the global batch (standard library
only, so ``angelps schedule`` stays a config-only verb)."""

from __future__ import annotations

import math

__all__ = ["batch_scale"]


def batch_scale(scaling: str, global_batch: int, reference: int) -> float:
    """``ml.learn.rate.scaling``'s factor for a global batch of ``global_batch``."""
    if scaling == "linear":
        return global_batch / reference
    if scaling == "sqrt":
        return math.sqrt(global_batch / reference)
    return 1.0
