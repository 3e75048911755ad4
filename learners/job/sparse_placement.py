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

__all__ = ["Placed", "held_bytes", "place_tables", "row_bytes", "tier_rows"]


@dataclass(frozen=True)
class Placed:
    """The tables of a job split by where they live, and why (table name → reason)."""

    ps: list[TableSpec]
    held: list[TableSpec]
    why: dict[str, str] = field(default_factory=dict)
    #: tables of ``held`` in a device tier over the shards (they are in ``ps`` too), with the
    #: rows each worker keeps on its device
    tiers: dict[str, int] = field(default_factory=dict)

    def whole(self) -> list[TableSpec]:
        """The tables the workers hold whole (their checkpoint files are the workers')."""
        return [t for t in self.held if t.name not in self.tiers]

    def where(self) -> dict[str, str]:
        """Table name → where it lives and why, for the start screen."""
        on = {t.name: "the workers" for t in self.held}
        on |= {t.name: "the shards" for t in self.ps if t.name not in self.tiers}
        on |= {
            name: f"the shards, {rows} rows a worker on its device (a device tier)"
            for name, rows in self.tiers.items()
        }
        return {name: f"on {on[name]}: {why}" for name, why in self.why.items()}


def held_bytes(spec: TableSpec, num_workers: int) -> int:
    """Bytes of one worker's share of ``spec`` held on the workers: rows and optimizer state
    (the largest owner's share when the rows do not split evenly)."""
    width = spec.cols + sum(slot_widths(spec.optimizer, spec.cols).values())
    rows = -(-max(spec.rows, 0) // max(num_workers, 1))
    return int(rows * width * np.dtype(spec.dtype).itemsize)


#: The device tier of a table of unknown range when the device's free memory is not known.
DEFAULT_TIER_ROWS = 1 << 20


def row_bytes(spec: TableSpec) -> int:
    """Bytes of one row of ``spec`` with its optimizer state."""
    width = spec.cols + sum(slot_widths(spec.optimizer, spec.cols).values())
    return int(width * np.dtype(spec.dtype).itemsize)


def tier_rows(plan: TrainPlan, held: Sequence[TableSpec], free: int | None) -> dict[str, int]:
    """The tables of ``held`` that get a device tier, with the rows a worker keeps on its
    device (``angel.worker.table.capacity``; ``free``: the smallest free device memory of
    the workers, for ``auto``). A table whose whole share fits is held whole; a table of
    unknown id range always gets a tier."""
    kind, n = plan.sparse.capacity
    w = max(plan.workers, 1)
    share = {t.name: -(-t.rows // w) if t.rows > 0 else -1 for t in held}
    if kind == "rows":
        return {t.name: n for t in held if share[t.name] < 0 or share[t.name] > n}
    if kind == "auto" and free is None:  # (the device's memory unknown: hold what can be)
        return {t.name: DEFAULT_TIER_ROWS for t in held if share[t.name] < 0}
    budget = n if kind == "bytes" else int(plan.sparse.fraction * (free or 0))
    known = [t for t in held if share[t.name] > 0]
    if len(known) == len(held) and sum(held_bytes(t, w) for t in held) <= budget:
        return {}
    # The budget split between the tables by the bytes of their shares (a table of unknown
    # range weighs the whole budget).
    weight = {t.name: held_bytes(t, w) if share[t.name] > 0 else budget for t in held}
    total = max(sum(weight.values()), 1)
    out = {}
    for t in held:
        rows = max(int(budget * weight[t.name] / total) // row_bytes(t), 1)
        if share[t.name] < 0 or rows < share[t.name]:
            out[t.name] = rows
    return out


def place_tables(plan: TrainPlan, tables: Sequence[TableSpec], free: int | None = None) -> Placed:
    """Split ``tables`` between the shards and the workers as ``plan`` says; ``free``: the
    smallest free device memory of the workers (bytes), which sizes device tiers under
    ``angel.worker.table.capacity=auto``."""
    mode = plan.sparse.placement
    sparse = [t for t in tables if t.sparse]
    # The model's small dense tables (biases) go with the sparse ones: a step then makes no
    # call to a shard at all (on a GPU: no round trip through the host). Dense layers placed
    # on the shards (angel.dense.placement=ps) stay there.
    dense = [t for t in tables if not t.sparse]
    with_dense = plan.dense_placement == "worker"
    why = {t.name: "dense tables stay on the shards" for t in dense}
    held: list[TableSpec] = []
    if mode == "ps":
        why |= {t.name: "angel.sparse.placement=ps" for t in sparse}
    elif mode == "worker":
        held = list(sparse) + (dense if with_dense else [])
        why |= {t.name: "angel.sparse.placement=worker" for t in sparse}
        if with_dense:
            why |= {
                t.name: "angel.sparse.placement=worker (a dense table, with the sparse ones)"
                for t in dense
            }
    elif plan.sparse.conflict:
        why |= {t.name: f"auto: {plan.sparse.conflict}" for t in sparse}
    elif any(t.rows <= 0 for t in sparse) and plan.sparse.capacity[0] == "auto":
        why |= {t.name: "auto: a table of unknown id range needs a capacity" for t in sparse}
    else:
        need = sum(held_bytes(t, plan.workers) for t in sparse)
        mib = f"{need / 2**20:.1f} MiB a worker"
        budget = f"angel.sparse.worker.memory.mb={plan.sparse.budget / 2**20:g}"
        if need <= plan.sparse.budget:
            held = list(sparse) + (dense if with_dense else [])
            why |= {t.name: f"auto: BSP, {mib} within {budget}" for t in sparse}
            if with_dense:
                why |= {t.name: "auto: a dense table, with the sparse ones" for t in dense}
        else:
            why |= {t.name: f"auto: {mib} is above {budget}" for t in sparse}
    tiers = tier_rows(plan, [t for t in held if t.sparse], free) if held else {}
    names = {t.name for t in held if t.name not in tiers}
    ps = [t for t in tables if t.name not in names]
    return Placed(ps, held, {t.name: why[t.name] for t in tables}, tiers)
