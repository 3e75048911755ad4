"""A toy optimizer added from outside the package: one class and one registration.

signSGD (Bernstein et al. 2018): ``w ← w − η·sign(g)``, no state. Importing this module
registers it; a shard in another process imports it by the path its spec carries.
"""

from __future__ import annotations

from collections.abc import Mapping

from angelps.optimizers.base import Array, Ops, Optimizer
from angelps.optimizers.registry import register
from angelps.table import OptimizerSpec


class SignSGD(Optimizer):
    """``w ← w − η·sign(g)``."""

    name, display = "signsgd", "SignSGD"

    def update(
        self,
        xp: Ops,
        spec: OptimizerSpec,
        w: Array,
        state: Mapping[str, Array],
        g: Array,
        lr: float,
        momentum: float | None = None,
    ) -> None:
        w -= xp.scalar(w)(lr) * xp.sign(g)


register(SignSGD())
