"""The PS tables a model declares (:class:`TableDecl`), and the PS table specs made from them.

A model never talks to the parameter server: it lists the tables it reads, and the learner turns
each declaration into an ``angelps`` ``TableSpec`` with the optimizer its role names in the job
configuration. A declaration's ``rows``/``cols`` are the table's shape as the PS stores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from angelps import OptimizerSpec, TableSpec
from learners.job.loop_options import SEED

__all__ = ["TableDecl", "table_specs"]


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
    #: A layer's own optimizer (Angel's per-layer ``optimizer`` of a JSON graph): its name and
    #: the OptimizerSpec fields it sets over the role's; None: the role's optimizer.
    optimizer: tuple[str, tuple[tuple[str, float], ...]] | None = None


def table_specs(conf: Mapping[str, Any], decls: Sequence[TableDecl]) -> list[TableSpec]:
    """PS table specs for a model's declared tables, with the optimizers named by the conf.

    Sparse tables take their role's optimizer (``ml.inputlayer.optimizer`` or
    ``ml.embedding.optimizer``) with ``ml.reg.*``; bias tables the same optimizer without
    regularisation (Angel never regularises biases). With ``angel.dense.placement=ps`` the MLP's
    parameters are dense tables with ``ml.fclayer.optimizer``. Table ``i`` is initialised with
    the seed ``ml.seed * 1000 + i``.
    """
    seed = int(SEED.read(conf))
    specs: list[TableSpec] = []
    for d in decls:
        opt = OptimizerSpec.from_conf(conf, f"ml.{d.role}.optimizer")
        if d.optimizer is not None:
            fields: dict[str, Any] = dict(d.optimizer[1])
            opt = replace(opt, name=d.optimizer[0], **fields)
        if not d.sparse and d.name.endswith("bias"):
            opt = replace(opt, l1=0.0, l2=0.0)
        specs.append(
            TableSpec(
                name=d.name,
                rows=int(d.rows),
                cols=int(d.cols),
                sparse=bool(d.sparse),
                init=d.init if d.init_std > 0 else "zeros",
                init_std=float(d.init_std),
                seed=seed * 1000 + len(specs),
                optimizer=opt,
            )
        )
    return specs
