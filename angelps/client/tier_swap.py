"""A device tier's exchange with the shard actors (learners/worker/device_tier.py): one call
per shard (over the data plane's connection, else a Ray call) writes back evicted rows and
reads missed ones, whole (weights and optimizer slots), outside the clocks: the tier's owner is
the only writer of the rows it holds."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from ray import ObjectRef
from ray.exceptions import RayActorError, RayTaskError

from angelps.client.transport import ChannelDown, Transport, get_refs, remote_error
from angelps.optim import slot_columns
from angelps.partition import Partitioner
from angelps.step_call import StepResult
from angelps.table import TableSpec

__all__ = ["SwapFuture", "TierLost", "TierSwaps", "row_width", "swap_async"]


class TierLost(RuntimeError):
    """A shard restarted from a backup that may predate rows a device tier wrote back to it:
    the job cannot go on exactly, and restarts from its last checkpoint (as for a lost
    worker)."""


def row_width(spec: TableSpec) -> int:
    """Columns of a whole row of ``spec`` on a shard: weights, then optimizer slots."""
    return slot_columns(spec.optimizer, spec.cols)[1]


class Client(Protocol):
    """What a swap needs of :class:`angelps.client.ps_client.PSClient`."""

    specs: dict[str, TableSpec]
    parts: dict[str, Partitioner]
    num_shards: int

    def swap_call(
        self,
        shard: int,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
    ) -> Any: ...

    def swap_answers(self, refs: Sequence[Any]) -> list[tuple[int, dict[str, np.ndarray]]]: ...


class SwapFuture:
    """The rows of a :meth:`PSClient.swap_async` (``.result()``: table -> whole rows in the
    order of the keys read) and the process id of every shard that answered."""

    def __init__(
        self,
        client: Client,
        refs: Mapping[int, Any],
        routed: Mapping[str, tuple[np.ndarray | None, np.ndarray]],
        counts: Mapping[str, int],
    ) -> None:
        self._client = client
        self._refs = dict(refs)
        self._routed = dict(routed)
        self._counts = dict(counts)
        self._out: dict[str, np.ndarray] | None = None
        # (a staged read and the update thread placing its misses both wait for the rows)
        self._lock = threading.Lock()
        #: shard -> the process id that served this swap (set by :meth:`result`)
        self.pids: dict[int, int] = {}
        #: every part sent over a data plane connection, served in order with the process's
        #: later swaps to its shard (write-backs included), not as a Ray call
        self.ordered = not any(isinstance(r, ObjectRef) for r in self._refs.values())

    def result(self) -> dict[str, np.ndarray]:
        with self._lock:
            return self._result()

    def _result(self) -> dict[str, np.ndarray]:
        if self._out is not None:
            return self._out
        shards = list(self._refs)
        try:
            answers = self._client.swap_answers([self._refs[s] for s in shards])
        except (RayActorError, ChannelDown) as e:
            # The rows written back in this call, or since the shard's last backup, may be
            # gone with it.
            raise TierLost(
                f"a shard died during a device tier's exchange with shards {shards} "
                f"({type(e).__name__})"
            ) from e
        self.pids = {s: a[0] for s, a in zip(shards, answers, strict=True)}
        got = {s: a[1] for s, a in zip(shards, answers, strict=True)}
        out: dict[str, np.ndarray] = {}
        for name, (order, _offsets) in self._routed.items():
            parts = [got[s][name] for s in shards if name in got[s]]
            width = row_width(self._client.specs[name])
            dtype = np.dtype(self._client.specs[name].dtype)
            if len(parts) == 1 and order is None:
                block = parts[0]
            elif order is None:
                block = np.concatenate(parts) if parts else np.zeros((0, width), dtype)
            else:  # each shard's rows put back in the keys' order, as whole rows
                block = np.empty((self._counts[name], width), dtype)
                _, offsets = self._routed[name]
                at = [s for s in range(len(offsets) - 1) if offsets[s] < offsets[s + 1]]
                for s, part in zip(at, parts, strict=True):
                    rows = _opaque(np.ascontiguousarray(part, dtype=dtype))
                    np.put(_opaque(block), order[offsets[s] : offsets[s + 1]], rows)
            assert len(block) == self._counts[name]
            out[name] = block
        self._out = out
        return out


def swap_async(
    client: Client,
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
    every: bool = False,
) -> SwapFuture:
    """A device tier's exchange with the shards (learners/worker/device_tier.py): write
    back whole rows (``writes``: table -> (unique keys, ``[k, width]`` rows with their
    optimizer slots)), then read the whole rows of ``reads`` (table -> unique keys; rows
    missing are created). One call per shard that has something to do, outside the clocks
    (the tier's owner is the only writer of those rows), over the data plane's connection
    where there is one (served in order with this process's other calls to that shard), else
    as a Ray actor call: a shard is an async actor, whose Ray calls may run in any order, so
    a caller that reads rows it wrote back in an earlier swap waits for that swap first.
    ``every``: call every shard, even those with nothing to do (a checkpoint's flush)."""
    per: dict[int, tuple[dict[str, Any], dict[str, np.ndarray]]] = {}
    if every:  # (every shard answers, with its process id: none restarted unseen)
        per = {s: ({}, {}) for s in range(client.num_shards)}
    split = _Splits(client)
    for name, (keys, block) in writes.items():
        order, _, parts = split(name, keys)
        for s, (idx, k) in parts.items():
            per.setdefault(s, ({}, {}))[0][name] = (k, _rows_at(block, idx))
    routed: dict[str, tuple[np.ndarray | None, np.ndarray]] = {}
    for name, keys in reads.items():
        order, offsets, parts = split(name, keys)
        routed[name] = (order, offsets)
        for s, (_, k) in parts.items():
            per.setdefault(s, ({}, {}))[1][name] = k
    refs = {s: client.swap_call(s, w, r) for s, (w, r) in sorted(per.items())}
    return SwapFuture(client, refs, routed, {n: len(k) for n, k in reads.items()})


def _opaque(a: np.ndarray) -> np.ndarray:
    """A contiguous 2-D array as a 1-D array of opaque rows: a row gathered or put as one
    element, several times faster than numpy's 2-D fancy indexing."""
    return a.view(np.dtype((np.void, a.shape[1] * a.dtype.itemsize))).reshape(-1)


def _rows_at(block: np.ndarray, idx: slice | np.ndarray) -> np.ndarray:
    """``block[idx]``: a view for a slice, else the rows gathered whole."""
    if isinstance(idx, slice) or not block.flags.c_contiguous or block.shape[1] == 0:
        return block[idx]
    return _opaque(block).take(idx).view(block.dtype).reshape(len(idx), block.shape[1])


#: A swap's keys of one table grouped by shard (:class:`_Splits`)
_Split = tuple[np.ndarray | None, np.ndarray, dict[int, tuple[Any, np.ndarray]]]


class _Splits:
    """The keys of a swap's tables grouped by shard, each array once: the tables of a tier's
    book write back and read the same ids (one array for all of them), and grouping them is a
    hash and a sort of every key (1-3 ms a swap of 33k ids with 2 shards or more, in the
    update thread, measured before this grouped them once)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._done: list[tuple[np.ndarray, tuple[Any, ...], _Split]] = []

    def __call__(self, name: str, keys: np.ndarray) -> _Split:
        """``(order, offsets, {shard: (its positions in keys, its keys)})`` of table
        ``name``'s ``keys`` (shards with none left out)."""
        part = self.client.parts[name]
        # (the same grouping wherever the partition does: kind, shards, and for range the rows)
        how = (part.kind, part.num_shards, part.spec.rows if part.kind == "range" else None)
        for k, h, got in self._done:
            if k is keys and h == how:
                return got
        order, offsets = part.split(keys)
        parts: dict[int, tuple[Any, np.ndarray]] = {}
        for s in range(self.client.num_shards):
            a, b = int(offsets[s]), int(offsets[s + 1])
            if a < b:
                idx = slice(a, b) if order is None else order[a:b]
                parts[s] = (idx, keys[idx])
        got = (order, offsets, parts)
        self._done.append((keys, how, got))
        return got


class TierSwaps:
    """A device tier's swaps, as :class:`angelps.client.ps_client.PSClient` makes them: over
    its transport (the data plane's connection to each shard, or Ray calls)."""

    specs: dict[str, TableSpec]
    parts: dict[str, Partitioner]
    num_shards: int
    net: Transport

    def swap_async(
        self,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
        every: bool = False,
    ) -> SwapFuture:
        """A device tier's exchange with the shards: write back whole rows, then read whole
        rows (:func:`swap_async`)."""
        return swap_async(self, writes, reads, every)

    def swap_call(
        self,
        shard: int,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
    ) -> Any:
        """One shard's part of :meth:`swap_async` (a reply to wait for with
        :meth:`swap_answers`)."""
        reply = 0
        for name, keys in reads.items():
            spec = self.specs[name]
            reply += len(keys) * row_width(spec) * np.dtype(spec.dtype).itemsize
        return self.net.swap(shard, writes, reads, reply)

    def swap_answers(self, refs: Sequence[Any]) -> list[tuple[int, dict[str, np.ndarray]]]:
        """``(process id, rows)`` of each shard's swap (:meth:`swap_call`)."""
        try:
            got = get_refs(refs)
        except RayTaskError as e:
            raise remote_error(e) from None
        out = []
        for a in got:
            if isinstance(a, StepResult):  # (over the data plane)
                assert a.pid is not None and a.rows is not None
                out.append((a.pid, a.rows))
            else:
                out.append(a)
        return out
