"""A mini-batch as the model's input: which PS rows to pull, and the rows as leaf tensors.

A :class:`~learners.data.Batch` (CSR ids and values, labels) becomes a
:class:`~learners.models.sparse_input.SparseInput` in three steps, so that the middle one can run
while the rows are in flight (the fused push-pull of the worker step):

    request (dedup the ids: each id's slot, the rows of every table)
    → prepare (the CSR structure over the slots, the labels)
    → attach (the pulled rows as leaf tensors; gradients flow to them)

Invariant: a table's rows are requested in slot order, so slot ``s`` of the input is row ``s``
of every sparse table's pulled block; dense tables are pulled whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from learners.data import Batch, binary_labels01
from learners.models.sparse_input import SparseInput
from learners.models.table_decl import TableDecl
from learners.models.zoo import BaseModel
from learners.worker.device import to_device
from learners.worker.device_step import host_copy, unique_slots

__all__ = ["BatchInput"]


class BatchInput:
    """The input of ``model``'s batches: its tables, frozen names, device and field count.

    ``dedup(ids)`` returns (unique ids sorted, slot of each id). ``ps_dense`` are the worker-side
    copies of dense PS tables (``angel.dense.placement=ps``), refreshed from every pull.
    """

    def __init__(
        self,
        model: BaseModel,
        tables: Sequence[TableDecl],
        frozen: set[str],
        device: torch.device,
        num_fields: int | None,
        ps_dense: Sequence[tuple[str, nn.Parameter]],
        dedup: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    ) -> None:
        self.model = model
        self.tables = list(tables)
        self.frozen = frozen
        self.device = device
        self.num_fields = num_fields
        self.ps_dense = list(ps_dense)
        self.dedup = dedup
        #: deduplicate on the device (set once the worker holds its tables)
        self.on_device = False
        #: sparse tables whose unique ids a dedup on the device also copies to the host (device
        #: tiers: their index is on the host)
        self.host_ids: frozenset[str] = frozenset()

    def request(self, batch: Batch) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Dedup the batch ids: (slot of each id, the rows to pull from every table). With
        ``on_device`` (every sparse table held by this one worker: learners/worker/device_step.py)
        the ids go up once and are deduplicated there: the slots and the sparse tables' ids are
        then tensors on the device (the same values), which only the held tables read; a device
        tier's (``host_ids``) come down once, a host array."""
        ids = np.asarray(batch.ids, dtype=np.int64)
        if self.on_device:
            uniq_t, slots_t = unique_slots(to_device(ids, self.device))
            sparse = [t.name for t in self.tables if t.sparse]
            uniq_h = host_copy(uniq_t) if self.host_ids.intersection(sparse) else None
            ids_of: dict[str, Any] = {
                t.name: (
                    (uniq_h if t.name in self.host_ids else uniq_t)
                    if t.sparse
                    else np.arange(t.rows, dtype=np.int64)
                )
                for t in self.tables
            }
            return slots_t, ids_of  # type: ignore[return-value]
        uniq, slots = self.dedup(ids)
        req = {
            t.name: (uniq if t.sparse else np.arange(t.rows, dtype=np.int64)) for t in self.tables
        }
        return slots, req

    def prepare(
        self, batch: Batch, slots: np.ndarray, labels: bool = True
    ) -> tuple[SparseInput, Tensor | None]:
        """Everything of a batch's input that does not need its rows: the CSR structure (and
        the matrices of the fast backward) and the labels. Built while the rows are in flight."""
        x = SparseInput.from_csr(
            batch.indptr,
            slots,
            np.asarray(batch.values, dtype=np.float32),
            {},
            self._fields_of(batch),
            device=self.device,
        )
        return x, (self.labels(batch) if labels else None)

    def attach(self, x: SparseInput, pulled: Mapping[str, np.ndarray | Tensor]) -> SparseInput:
        """The pulled rows as leaf tensors (the worker-side copies of dense PS tables updated).
        A table's rows may also come as a float32 tensor the caller owns (the worker cache's)."""
        if self.ps_dense:
            with torch.no_grad():
                for name, p in self.ps_dense:
                    v = torch.from_numpy(np.asarray(pulled[name], dtype=np.float32))
                    p.copy_(v.view_as(p))
        for t in self.tables:
            got = pulled[t.name]
            if isinstance(got, Tensor):
                r = got.to(self.device)
            else:
                # A copy: rows that came through the object store are read-only.
                r = to_device(np.asarray(got, dtype=np.float32), self.device)
            x.rows[t.name] = r.requires_grad_(
                t.name.lower() not in self.frozen and torch.is_grad_enabled()
            )
        return x

    def _fields_of(self, batch: Batch) -> int | None:
        """The field count when every row has exactly that many ids, else None (an error for
        a model that needs one id per field)."""
        f = self.num_fields
        if f is None:
            return None
        counts = np.diff(np.asarray(batch.indptr))
        if counts.size and (counts.min() != f or counts.max() != f):
            if self.model.needs_fields:
                bad = int(np.flatnonzero(counts != f)[0])
                row = batch.row_index[bad] if getattr(batch, "row_index", None) is not None else bad
                raise ValueError(
                    f"sample {int(row)} has {int(counts[bad])} non-zeros but ml.fm.field.num={f}: "
                    f"{self.model.angel_name} needs exactly one id per field"
                )
            return None
        return f

    def labels(self, batch: Batch) -> Tensor:
        """The batch's labels as the model's loss takes them (0/1 for binary models)."""
        y = np.asarray(batch.labels, dtype=np.float32)
        if self.model.task == "binary":
            y = np.asarray(binary_labels01(y), dtype=np.float32)
        # Checked and converted on the host (no device sync), then sent up (on a GPU only).
        host = self.model.prepare_labels(torch.from_numpy(np.ascontiguousarray(y)))
        return host if self.device.type == "cpu" else to_device(host.numpy(), self.device)
