"""The row and gradient exchanges of tables held by several workers: all-to-all collectives
over the process group the workers join for the dense all-reduce (gloo between CPU workers,
NCCL between CUDA workers that own a whole GPU; the same calls).

A read (:meth:`Exchange.fetch`): each worker groups its batch's unique ids by owner (the table's
partitioner with ``W`` owners), and three all-to-alls follow: the counts, the ids, and the rows
that each owner gathers for the ids it received. An update (:meth:`Exchange.push`): each worker
sends its row gradients (already × 1/W) to their owners (ids and counts again, unless the
update's ids are those of its one read), and each owner sums a row's gradients from all the
workers and applies the table's optimizer once. Every worker makes the same calls in the same
order: each is a collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from angelps.rates import Step
from learners.worker.device import to_device


class HeldTable(Protocol):
    """What an exchange needs of a table an owner holds (learners/worker/held_tables.py):
    stated here, so that the exchange does not import the tables that use it."""

    cols: int
    part: Any
    spec: Any

    def gather(self, keys: Tensor) -> Tensor: ...

    def update(self, keys: Tensor, grads: Tensor, step: Step) -> None: ...


__all__ = ["AHEAD", "Exchange"]

#: The routes made ahead kept for a group of tables: the next read's and the one after it.
AHEAD = 2


class _Route:
    """Where the ids of one read went: this worker's ids in owner order, the counts sent to
    and received from each worker, and the ids it received (to serve as their owner)."""

    def __init__(
        self,
        ids: np.ndarray,
        order: Tensor | None,
        send: list[int],
        recv: list[int],
        recv_ids: Tensor,
    ) -> None:
        self.ids = ids
        self.order = order
        self.send = send
        self.recv = recv
        self.recv_ids = recv_ids


class Exchange:
    """All-to-all exchanges between ``num_workers`` workers whose tensors live on ``device``."""

    def __init__(self, num_workers: int, device: torch.device, backend: str) -> None:
        self.num_workers = num_workers
        self.device = device
        # gloo moves host tensors: CUDA tensors (workers sharing a GPU) make the round trip.
        self.via_host = device.type == "cuda" and backend != "nccl"
        self._last: _Route | None = None
        #: routes of the next reads, made ahead (device tiers' prefetch), by their tables, in
        #: the order of the reads (the next one, and the one after where it was peeked at)
        self._ahead: dict[tuple[str, ...], list[_Route]] = {}

    def _a2a(self, t: Tensor, out_splits: list[int], in_splits: list[int]) -> Tensor:
        src = (t.cpu() if self.via_host else t).contiguous()
        out = torch.empty((sum(out_splits), *t.shape[1:]), dtype=t.dtype, device=src.device)
        dist.all_to_all_single(out, src, out_splits, in_splits)
        return out.to(self.device) if self.via_host else out

    def _route(self, ids: np.ndarray, part: object) -> tuple[_Route, int]:
        """Send ``ids`` (unique) to their owners; the route and the bytes sent."""
        order, offsets = part.split(ids)  # type: ignore[attr-defined]
        send = np.diff(offsets).astype(np.int64)
        ones = [1] * self.num_workers
        recv = self._a2a(to_device(send, self.device), ones, ones).cpu().tolist()
        grouped = ids if order is None else ids[order]
        recv_ids = self._a2a(to_device(grouped, self.device), recv, send.tolist())
        order_t = None if order is None else to_device(order, self.device)
        route = _Route(ids, order_t, send.tolist(), recv, recv_ids)
        return route, int(send.nbytes + grouped.nbytes)

    def route_ahead(
        self, ids: np.ndarray, tables: Sequence[HeldTable], after: bool = False
    ) -> tuple[np.ndarray, int]:
        """Send a coming read's unique ``ids`` of ``tables`` to their owners now (every
        worker at once, as for a read): the next read's (routes kept before are dropped), or
        with ``after`` the read after it (kept behind the next one's: at most :data:`AHEAD`);
        the ids this worker will serve (sorted, unique) and the bytes sent. The
        :meth:`fetch` of those ids, in that order, reuses the route."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        route, sent = self._route(ids, tables[0].part)
        key = tuple(t.spec.name for t in tables)
        kept = self._ahead.get(key, []) if after else []
        self._ahead[key] = [*kept, route][-AHEAD:]
        return np.unique(route.recv_ids.cpu().numpy()), sent

    def fetch(
        self, ids: np.ndarray, tables: Sequence[HeldTable], ahead: bool = False
    ) -> tuple[list[Tensor], int]:
        """The rows of unique ``ids`` of ``tables`` (routed alike) from their owners, in the
        order of ``ids``; and the bytes this worker sent. ``ahead``: these are the ids of
        the next read :meth:`route_ahead` routed (every worker says so alike), whose route is
        used; otherwise the routes made ahead are dropped."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        key = tuple(t.spec.name for t in tables)
        kept = self._ahead.pop(key, [])
        route = kept.pop(0) if ahead and kept else None
        if route is not None:
            if len(route.ids) != len(ids) or not np.array_equal(route.ids, ids):
                raise RuntimeError("a read routed ahead was asked for other ids")
            if kept:  # (the read after this one, routed too: kept for it)
                self._ahead[key] = kept
            sent = 0
        else:
            route, sent = self._route(ids, tables[0].part)
        self._last = route
        block = torch.cat([t.gather(route.recv_ids) for t in tables], dim=1)
        got = self._a2a(block, route.send, route.recv)
        sent += int(block.numel() * block.element_size())
        if route.order is not None:
            out = torch.empty_like(got)
            out[route.order] = got
            got = out
        return list(torch.split(got, [t.cols for t in tables], dim=1)), sent

    def push(
        self,
        grads: Sequence[tuple[Tensor, Tensor] | None],
        tables: Sequence[HeldTable],
        scale: float,
        lr: Step,
        reuse: bool,
    ) -> int:
        """Send each table's (ids, gradient) × ``scale`` to the owners; each owner sums a
        row's gradients over the workers and updates it once at step size ``lr``. ``reuse``:
        the ids are those of the last :meth:`fetch` (one micro-batch per update, the same on
        every worker), so their route is reused. The bytes this worker sent."""
        live = [(t, g) for t, g in zip(tables, grads, strict=True) if g is not None]
        if not live:  # (frozen tables: the same on every worker)
            return 0
        ids = live[0][1][0]
        sent = 0
        route = self._last
        if not reuse or route is None:
            route, sent = self._route(ids.cpu().numpy(), tables[0].part)
        g = torch.cat([gr * scale for _, (_, gr) in live], dim=1)
        if route.order is not None:
            g = g.index_select(0, route.order)
        got = self._a2a(g, route.recv, route.send)
        sent += int(g.numel() * g.element_size())
        uniq, inv = torch.unique(route.recv_ids, sorted=True, return_inverse=True)
        total = torch.zeros((len(uniq), got.shape[1]), dtype=got.dtype, device=got.device)
        total.index_add_(0, inv, got)
        a = 0
        for t, _ in live:
            t.update(uniq, total[:, a : a + t.cols], lr)
            a += t.cols
        self._last = None
        return sent
