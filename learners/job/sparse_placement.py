"""Where each PS table lives: on the shard actors, or held by the workers
(``angel.sparse.placement``; the workers' side is learners/worker/held_tables.py).

``ps`` keeps every table on the shards. ``worker`` holds every sparse table on the workers
(each owns the rows that the table's partitioner assigns it among ``W`` owners). ``auto`` holds
them on the workers when the job is BSP (and uses no shard-only feature) and the tables fit
``angel.sparse.worker.memory.mb`` per worker, else on the shards. Dense tables (biases, and the
MLP with ``angel.dense.placement=ps``) stay on the shards. :func:`place_tables` also says why,
for the start screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from angelps import TableSpec
from angelps.optim import slot_widths
from learners.job.loop_options import TrainPlan

__all__ = ["Placed", "held_bytes", "place_tables"]


@dataclass(frozen=True)
class Placed:
    """The tables of a job split by where they live, and why (table name → reason)."""

    ps: list[TableSpec]
    held: list[TableSpec]
    why: dict[str, str] = field(default_factory=dict)

    def where(self) -> dict[str, str]:
        """Table name → where it lives and why, for the start screen."""
        on = {t.name: "the workers" for t in self.held} | {t.name: "the shards" for t in self.ps}
        return {name: f"on {on[name]}: {why}" for name, why in self.why.items()}


def held_bytes(spec: TableSpec, num_workers: int) -> int:
    """Bytes of one worker's share of ``spec`` held on the workers: rows and optimizer state
    (the largest owner's share when the rows do not split evenly)."""
    width = spec.cols + sum(slot_widths(spec.optimizer, spec.cols).values())
    rows = -(-max(spec.rows, 0) // max(num_workers, 1))
    return int(rows * width * np.dtype(spec.dtype).itemsize)


def place_tables(plan: TrainPlan, tables: Sequence[TableSpec]) -> Placed:
    """Split ``tables`` between the shards and the workers as ``plan`` says."""
    mode = plan.sparse.placement
    sparse = [t for t in tables if t.sparse]
    why = {t.name: "dense tables stay on the shards" for t in tables if not t.sparse}
    held: list[TableSpec] = []
    if mode == "ps":
        why |= {t.name: "angel.sparse.placement=ps" for t in sparse}
    elif mode == "worker":
        held = list(sparse)
        why |= {t.name: "angel.sparse.placement=worker" for t in sparse}
    elif plan.sparse.conflict:
        why |= {t.name: f"auto: {plan.sparse.conflict}" for t in sparse}
    else:
        need = sum(held_bytes(t, plan.workers) for t in sparse)
        mib = f"{need / 2**20:.1f} MiB a worker"
        budget = f"angel.sparse.worker.memory.mb={plan.sparse.budget / 2**20:g}"
        if need <= plan.sparse.budget:
            held = list(sparse)
            why |= {t.name: f"auto: BSP, {mib} within {budget}" for t in sparse}
        else:
            why |= {t.name: f"auto: {mib} is above {budget}" for t in sparse}
    names = {t.name for t in held}
    ps = [t for t in tables if t.name not in names]
    return Placed(ps, held, {t.name: why[t.name] for t in tables})
