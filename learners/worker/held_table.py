"""One worker's share of a sparse table held whole (``angel.sparse.placement=worker``
without a device tier): the rows the table's partitioner assigns it, on its own device,
weights and optimizer slots side by side in one ``[rows, cols + slots]`` tensor as a shard
stores them (learners/worker/held_tables.py holds them together and runs the step)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch
from torch import Tensor

from angelps import TableSpec
from angelps.optim import apply, slot_columns
from angelps.partition import Partitioner
from angelps.rates import Step, rate_of
from angelps.storage.table_rows import FrozenTable
from angelps.table import init_rows
from learners.worker.device import RowBlock, to_device, torch_dtype

__all__ = ["HeldTable"]

#: Rows per chunk of initialisation and of a checkpoint's export.
_CHUNK = 1 << 18


class HeldTable:
    """One worker's share of a sparse table: the rows it owns and their optimizer state."""

    def __init__(self, spec: TableSpec, part: Partitioner, owner: int, device: torch.device):
        if spec.rows <= 0:
            raise ValueError(
                f"table {spec.name!r} has no row range (rows={spec.rows}): only tables of a "
                "known id range can be held by the workers"
            )
        self.spec = spec
        self.part = part
        self.owner = owner
        self.device = device
        self.cols = spec.cols
        self.slots, self.width = slot_columns(spec.optimizer, spec.cols)
        everything = np.arange(spec.rows, dtype=np.int64)
        if part.num_shards == 1:
            self.keys = everything
            self.local: Tensor | None = None  # local row = key
            self._local_host: np.ndarray | None = None
        else:
            self.keys = everything[part.owns(owner, everything)]
            local = np.full(spec.rows, -1, dtype=np.int64)
            local[self.keys] = np.arange(len(self.keys), dtype=np.int64)
            self.local = to_device(local, device)
            self._local_host = local if device.type == "cpu" else None
        self.data = torch.zeros(
            (len(self.keys), self.width), dtype=torch_dtype(spec.dtype), device=device
        )
        self.touched = torch.zeros(len(self.keys), dtype=torch.bool, device=device)
        # On the CPU, whole rows move as numpy's opaque rows (RowBlock), by host slots.
        self._rows = RowBlock(self.data) if device.type == "cpu" else None
        self.reset()

    def reset(self) -> None:
        """Every row at its initial value, its optimizer state zero, none touched."""
        self.data.zero_()
        self.touched.zero_()
        if self.spec.init == "zeros":
            return
        for a in range(0, len(self.keys), _CHUNK):
            block = init_rows(self.spec, self.keys[a : a + _CHUNK])
            self.data[a : a + len(block), : self.cols] = to_device(block, self.device)

    def nbytes(self) -> int:
        return int(self.data.numel() * self.data.element_size())

    def _slots(self, keys: Tensor) -> Tensor:
        return keys if self.local is None else self.local.index_select(0, keys)

    def _host_slots(self, keys: Tensor) -> np.ndarray:
        s = keys.numpy()
        return s if self._local_host is None else self._local_host[s]

    def _take(self, keys: Tensor) -> Tensor:
        """Whole rows (weights and slots) of owned ``keys``, a new tensor; they are touched."""
        if self._rows is not None:
            s = self._host_slots(keys)
            self.touched.numpy()[s] = True
            return self._rows.take(s)
        idx = self._slots(keys)
        self.touched.index_fill_(0, idx, True)
        return self.data.index_select(0, idx)

    def _put(self, keys: Tensor, block: Tensor) -> None:
        """Write whole rows of owned ``keys``."""
        if self._rows is not None:
            self._rows.put(self._host_slots(keys), block)
            return
        self.data.index_copy_(0, self._slots(keys), block)

    def gather(self, keys: Tensor) -> Tensor:
        """The weights of owned ``keys`` (a new contiguous ``[k, cols]`` tensor); the rows are
        touched (as a shard creates a row when it is first read)."""
        return self._take(keys)[:, : self.cols].contiguous()

    def update(self, keys: Tensor, grads: Tensor, step: Step) -> None:
        """One optimizer update of the owned unique ``keys`` with their summed gradients, at
        this table's step size and momentum under ``step`` (as a shard resolves a push's)."""
        lr, momentum = rate_of(step, self.spec.name)
        block = self._take(keys)
        state = {k: block[:, a:b] for k, (a, b) in self.slots.items()}
        apply(
            self.spec.optimizer, block[:, : self.cols], state, grads.to(block.dtype), lr, momentum
        )
        self._put(keys, block)

    # --- checkpoints: the shards' file format ----------------------------------------------

    def export_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
        """(keys, rows, state) of the touched rows, keys ascending, in chunks (at least one)."""
        idx = torch.nonzero(self.touched).flatten().cpu().numpy()
        for a in range(0, max(len(idx), 1), _CHUNK):
            sel = idx[a : a + _CHUNK]
            block = self.data.index_select(0, to_device(sel, self.device)).cpu().numpy()
            state = {k: np.ascontiguousarray(block[:, x:y]) for k, (x, y) in self.slots.items()}
            yield self.keys[sel], np.ascontiguousarray(block[:, : self.cols]), state

    def freeze(self) -> FrozenTable:
        """A host copy of the touched rows as they are now (a checkpoint written in the
        background while training goes on: learners/worker/held_save.py), exported as
        :meth:`export_chunks` exports."""
        idx = torch.nonzero(self.touched).flatten()
        block = np.empty((len(idx), self.width), dtype=np.dtype(self.spec.dtype))
        for a in range(0, len(idx), _CHUNK):  # (on a GPU: a chunk's gather at a time)
            block[a : a + _CHUNK] = self.data.index_select(0, idx[a : a + _CHUNK]).cpu().numpy()
        return FrozenTable(self, self.keys[idx.cpu().numpy()], block)

    def frozen_nbytes(self) -> int:
        """Host bytes :meth:`freeze` copies (the touched rows with their state and keys)."""
        return int(self.touched.sum()) * (self.width * self.data.element_size() + 8)

    def assign(self, keys: np.ndarray, w: np.ndarray, state: Mapping[str, np.ndarray]) -> None:
        """Overwrite the rows (and state) of owned ``keys`` (a restore); they are touched."""
        block = np.empty((len(keys), self.width), dtype=np.dtype(self.spec.dtype))
        block[:, : self.cols] = w
        for k, (a, b) in self.slots.items():
            block[:, a:b] = state[k]
        ids = to_device(keys, self.device)
        self._take(ids)  # (touched)
        self._put(ids, to_device(block, self.device))
