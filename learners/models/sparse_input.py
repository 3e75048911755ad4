"""The sparse input of one batch (:class:`SparseInput`) and the autograd functions over it.

A batch arrives as CSR non-zeros whose feature ids the worker has already mapped to *slots*:
indices into the block of unique rows it pulled from each sparse PS table. A model reads the
pulled rows only through :class:`SparseInput`: ``weighted_rows`` (``x_j · row(slot_j)`` per
non-zero), ``per_sample`` (sums over each sample's non-zeros), ``linear`` and
``field_embeddings``.

Invariants: ``slot`` indexes the rows of every sparse table of the batch alike (one row per
distinct id, so ``max(slot) + 1`` rows); the gradients reaching the pulled rows equal those of
``index_select``/``index_add``, whichever path computes them. On CPU, when a batch hits few
enough rows often enough, the backward of the gather and the per-sample sums are products with
CSR matrices built once per batch (``index_add`` is slow there; figures in
docs/benchmarks-train.md); on CUDA the plain ``index_add`` path is used.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from learners.worker.device import to_device

__all__ = ["SparseInput"]


class _GatherRows(torch.autograd.Function):
    """``value_j · rows[slot_j]`` for every non-zero; the backward sums the non-zeros' gradients
    into their rows as a CSR product ``Mᵀ·g`` (``Mᵀ[u, j] = value_j`` where ``slot_j = u``).

    Autograd's own backward of ``index_select`` is ``index_add``, much slower on CPU than the
    CSR product; built once per batch, the matrix serves every table.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, rows: Tensor, slot: Tensor, value: Tensor | None, mt: Tensor | None
    ) -> Tensor:
        ctx.mt = mt
        if mt is None:
            ctx.save_for_backward(slot, value)
        ctx.shape = rows.shape
        out = rows.index_select(0, slot)
        return out if value is None else out * value.unsqueeze(1)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g: Tensor
    ) -> tuple[Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        if ctx.mt is not None:
            return ctx.mt @ g.contiguous(), None, None, None
        slot, value = ctx.saved_tensors
        if value is not None:
            g = g * value.unsqueeze(1)
        out = torch.zeros(ctx.shape, dtype=g.dtype, device=g.device)
        return out.index_add_(0, slot, g), None, None, None


class _SegmentSum(torch.autograd.Function):
    """``out[b] = Σ_{j in sample b} e_j`` as a CSR product ``S·e`` (``S`` = the batch's rows over
    its non-zeros); the backward gathers ``g[sample_j]``. Used on CPU, where ``index_add`` is
    slow."""

    @staticmethod
    def forward(ctx: Any, e: Tensor, sample: Tensor, s: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(sample)
        return s @ e.contiguous()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (sample,) = ctx.saved_tensors
        return g.index_select(0, sample), None, None


# The CSR backward needs the non-zeros sorted by row slot: numpy's stable argsort is a radix sort
# for 16-bit keys but a much slower merge sort for wider ones, so wider slots are sorted in two
# 16-bit radix passes (:func:`_order`; 2 ms for 213k non-zeros over 61k rows, against 29 ms for
# the merge sort). The product beats index_add from about 2 non-zeros a row (B=8192 on 10^6
# power-law ids, 3.5 a row: 7 ms against 13 ms for an 8-column table); below, index_add is used.
_CSR_MAX_ROWS = 1 << 32
_CSR_MIN_REPEAT = 2


def sample_index(counts: np.ndarray, nnz: int, device: torch.device) -> Tensor:
    """The sample of each non-zero, ``np.repeat(np.arange(b), counts)``, made on ``device``:
    on a GPU the host then neither builds nor sends up 8 bytes a non-zero (the batch's
    preparation is the training thread's work, the bound of a GPU step with a device tier);
    where every sample has as many non-zeros (the field models) nothing goes up at all."""
    b = len(counts)
    every = torch.arange(b, dtype=torch.int64, device=device)
    if b and nnz == b * int(counts[0]):  # (then all alike if none is below the first)
        k = int(counts[0])
        if not (counts < k).any():
            return every.repeat_interleave(k)
    # (output_size: no synchronisation to learn the result's length)
    return every.repeat_interleave(to_device(counts, device), output_size=nnz)


def _order(slots: np.ndarray, rows: int) -> np.ndarray:
    """A stable argsort of ``slots`` (values < ``rows``) by 16-bit radix passes."""
    if rows <= 1 << 16:
        return np.argsort(slots.astype(np.uint16), kind="stable")
    low = np.argsort((slots & 0xFFFF).astype(np.uint16), kind="stable")
    return low[np.argsort((slots[low] >> 16).astype(np.uint16), kind="stable")]


def _csr(
    crow: np.ndarray, col: np.ndarray, val: np.ndarray | None, shape: tuple[int, int]
) -> Tensor:
    v = torch.ones(len(col)) if val is None else torch.from_numpy(np.ascontiguousarray(val))
    with warnings.catch_warnings():
        # torch flags CSR tensors as beta; the two operations used here (build, CSR times
        # dense) are checked against index_add in tests/learners/test_models.py.
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(crow), torch.from_numpy(col), v, shape, check_invariants=False
        )


@dataclass
class SparseInput:
    """One batch as a model sees it: CSR non-zeros mapped onto the pulled rows.

    ``sample[j]`` is the batch row of non-zero ``j``, ``slot[j]`` the index of its feature in the
    pulled unique ids, ``value[j]`` its value (None when every value is 1, as in one-hot data).
    ``rows[name]`` is the pulled ``[U, cols]`` block of a sparse table (``[rows, cols]`` for a
    dense one). ``num_fields`` is set when every sample has exactly that many non-zeros, in field
    order (census: 13), which the field models require. ``rows_t`` (``Mᵀ``) and ``samples_s``
    (``S``) are CSR matrices for the gather's backward and the per-sample sums (CPU only; None on
    CUDA, where index_add is fast).
    """

    batch_size: int
    sample: Tensor
    slot: Tensor
    value: Tensor | None
    rows: dict[str, Tensor]
    num_fields: int | None = None
    rows_t: Tensor | None = None
    samples_s: Tensor | None = None

    @staticmethod
    def from_csr(
        indptr: npt.ArrayLike,
        slots: npt.ArrayLike | Tensor,
        values: npt.ArrayLike,
        rows: dict[str, Tensor],
        num_fields: int | None = None,
        device: torch.device | str | None = None,
    ) -> SparseInput:
        """Build from CSR arrays (numpy or torch) whose ids were already mapped to slots.

        ``rows`` may be empty and filled in later (the worker builds the next batch's input
        while that batch's rows are still on their way); ``device`` is then where they go
        (default: the rows' device, else the CPU).
        """
        indptr_n = np.asarray(indptr, dtype=np.int64)
        # Slots already on a device (ids deduplicated there) stay there; on the CPU a tensor's
        # numpy view serves the CSR matrices below.
        slots_d = slots if isinstance(slots, Tensor) and slots.device.type != "cpu" else None
        slots_n = (
            np.zeros(0, dtype=np.int64)
            if slots_d is not None
            else np.asarray(slots.numpy() if isinstance(slots, Tensor) else slots, dtype=np.int64)
        )
        values_n = np.asarray(values, dtype=np.float32)
        b = int(indptr_n.size - 1)
        nnz = int(slots_n.size if slots_d is None else slots_d.numel())
        counts = np.diff(indptr_n)
        if device is not None:
            dev = torch.device(device)
        else:
            dev = next(iter(rows.values())).device if rows else torch.device("cpu")
        if dev.type == "cuda":
            sample = sample_index(counts, nnz, dev)
        else:
            sample = torch.from_numpy(np.repeat(np.arange(b, dtype=np.int64), counts))
        unit = bool(values_n.size == 0 or (values_n == 1.0).all())
        value = None if unit else torch.from_numpy(np.ascontiguousarray(values_n))
        rows_t = samples_s = None
        if dev.type == "cpu" and nnz:
            # The pulled block of a sparse table has one row per distinct id: max slot + 1.
            u = int(slots_n.max()) + 1
            # (no backward under inference mode: no matrix for it)
            if torch.is_grad_enabled() and u <= _CSR_MAX_ROWS and nnz >= _CSR_MIN_REPEAT * u:
                order = _order(slots_n, u)
                crow = np.zeros(u + 1, dtype=np.int64)
                np.cumsum(np.bincount(slots_n, minlength=u), out=crow[1:])
                rows_t = _csr(crow, order, None if unit else values_n[order], (u, nnz))
            if num_fields is None:
                col = np.arange(nnz, dtype=np.int64)
                samples_s = _csr(np.ascontiguousarray(indptr_n - indptr_n[0]), col, None, (b, nnz))
        if dev.type == "cuda":
            # Pinned, asynchronous copies: they overlap the rest of the step's preparation.
            value = None if value is None else to_device(value.numpy(), dev)
            slot = (
                slots_d.to(dev)
                if slots_d is not None
                else to_device(np.ascontiguousarray(slots_n), dev)
            )
        else:
            slot = torch.from_numpy(np.ascontiguousarray(slots_n))
        return SparseInput(
            batch_size=b,
            sample=sample,
            slot=slot,
            value=value,
            rows=rows,
            num_fields=num_fields,
            rows_t=rows_t,
            samples_s=samples_s,
        )

    def weighted_rows(self, table: str) -> Tensor:
        """``x_j · row(slot_j)`` for every non-zero: ``[nnz, cols]``."""
        rows = self.rows[table]
        mt = (
            self.rows_t
            if self.rows_t is not None and rows.shape[0] == self.rows_t.shape[0]
            else None
        )
        return _GatherRows.apply(rows, self.slot, self.value, mt)

    def per_sample(self, e: Tensor) -> Tensor:
        """``Σ_j e_j`` over each sample's non-zeros: ``[nnz, cols]`` → ``[B, cols]``."""
        if self.num_fields is not None:
            return e.view(self.batch_size, self.num_fields, e.shape[1]).sum(dim=1)
        if self.samples_s is not None:
            return _SegmentSum.apply(e, self.sample, self.samples_s)
        out = torch.zeros(self.batch_size, e.shape[1], dtype=e.dtype, device=e.device)
        return out.index_add(0, self.sample, e)

    def linear(self, table: str, bias: str | None = None) -> Tensor:
        """``Σ_j x_j·row(slot_j)`` per sample (+ bias row): ``[B, cols]``."""
        out = self.per_sample(self.weighted_rows(table))
        if bias is not None:
            out = out + self.rows[bias][0]
        return out

    def field_embeddings(self, table: str) -> Tensor:
        """``x_f·v_f`` per sample and field: ``[B, F, k]`` (requires ``num_fields``)."""
        if self.num_fields is None:
            raise ValueError(
                "this model needs exactly ml.fm.field.num non-zeros per sample "
                "(one id per field, as in the census dummy file); set ml.fm.field.num"
            )
        e = self.weighted_rows(table)
        return e.view(self.batch_size, self.num_fields, e.shape[1])
