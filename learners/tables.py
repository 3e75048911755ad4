"""The PS tables a model declares (:class:`TableDecl`), and the PS table specs made from them.

A model never talks to the parameter server: it lists the tables it reads, and the learner turns
each declaration into an ``angelps`` ``TableSpec`` with the optimizer its role names in the job
configuration. A declaration's ``rows``/``cols`` are the table's shape as the PS stores it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TableDecl"]


@dataclass(frozen=True)
class TableDecl:
    """A PS table a model needs.

    ``sparse`` tables are keyed by feature id (``rows`` = the feature index range) and only the
    rows of a batch's ids are pulled; dense tables (biases) are small and pulled whole. ``cols``
    is the width of a row (1 for a linear weight, k for an embedding).
    ``role`` selects the optimizer key: ``inputlayer`` → ``ml.inputlayer.optimizer``,
    ``embedding`` → ``ml.embedding.optimizer``, ``fclayer`` → ``ml.fclayer.optimizer``. Biases
    share their layer's role (Angel applied plain SGD to biases, bypassing the optimizer; here
    they go through it).
    """

    name: str
    rows: int
    cols: int
    sparse: bool
    role: str
    init_std: float = 0.0
    #: "normal" (std ``init_std``; zeros when it is 0) or "uniform" (``[-init_std, init_std)``).
    init: str = "normal"
