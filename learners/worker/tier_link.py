"""A device tier's calls to the shards (learners/worker/device_tier.py): the swaps that read
missed rows and write evicted ones back (one call per shard,
:func:`angelps.client.tier_swap.swap_async`), the evicted rows held until the tier's next swap
carries them, the bytes they move, and the check that no shard restarted under the tier (a
shard restored from a backup may have lost rows the tier wrote back)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from angelps.client.tier_swap import SwapFuture, TierLost
from learners.worker.device import to_device

__all__ = ["Ready", "Shards", "TierLink"]

#: The CUDA event after which rows copied down to the host can be read (None: they can now).
Ready = torch.cuda.Event | None
Writes = Mapping[str, tuple[np.ndarray, np.ndarray]]


class Shards(Protocol):
    """What a tier needs of the worker's PS client (angelps.client.ps_client.PSClient)."""

    #: shard -> the process id that served it after the last load (empty: unknown)
    shard_pids: dict[int, int]

    def swap_async(
        self, writes: Writes, reads: Mapping[str, np.ndarray], every: bool = False
    ) -> SwapFuture: ...


def _merged(parts: list[Writes]) -> Writes:
    """The write-backs ``parts`` as one (their keys are disjoint: a row evicted is not held
    again before a swap has carried its write-back)."""
    if len(parts) == 1:
        return parts[0]
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in dict.fromkeys(n for p in parts for n in p):
        got = [p[name] for p in parts if name in p]
        out[name] = (np.concatenate([k for k, _ in got]), np.concatenate([b for _, b in got]))
    return out


#: Swaps over ordered connections that :meth:`TierLink.settle` leaves in flight, at most.
ORDERED_KEPT = 4


class TierLink:
    """The calls of one tier (``label``: its tables, for errors; ``row_bytes``: the bytes of
    a whole row of each of its tables) to the shards (``shards``: a function giving the
    worker's PS client, attached after the tier is made)."""

    def __init__(
        self, label: str, row_bytes: Mapping[str, int], shards: Callable[[], Shards]
    ) -> None:
        self.label = label
        self.row_bytes = dict(row_bytes)
        self.shards = shards
        #: bytes exchanged with the shards: ids and rows sent, rows received
        self.bytes_moved = 0
        #: seconds the training thread waited in the calls it timed (TierCounts.wait_s), and
        #: the update thread in the others (TierCounts.ahead_wait_s)
        self.waited_s = 0.0
        self.ahead_s = 0.0
        self._taken = (0.0, 0.0)  # (at the last take_waited)
        self._pids: dict[int, int] = {}
        #: swaps that wrote rows back, not waited for yet (and swaps dropped)
        self._writes: list[SwapFuture] = []
        #: write-backs not sent yet, with the CUDA event of their copy down
        self._held: list[tuple[Writes, Ready]] = []
        #: the last swap's rows sent up to a device (:meth:`rows_on`)
        self._up: tuple[SwapFuture, dict[str, Tensor]] | None = None
        self._up_lock = threading.Lock()
        #: answers sent up to a device (each once, whoever reads it first)
        self.uploads = 0

    def swap(self, writes: Writes, reads: np.ndarray | None, every: bool = False) -> SwapFuture:
        """Write ``writes`` and the write-backs held (:meth:`write_back`) back, then read the
        whole rows of ``reads`` of every table, in one call per shard (``every``: a call to
        every shard, so that each says who serves it)."""
        self._count(writes, reads)
        held, self._held = self._held, []
        for _, ready in held:
            if ready is not None:  # (on a GPU: copied down after the update that evicted)
                ready.synchronize()
        if held:
            writes = _merged([w for w, _ in held] + ([writes] if writes else []))
        ask = {} if reads is None else dict.fromkeys(self.row_bytes, reads)
        fut = self.shards().swap_async(writes, ask, every)
        if held:  # (a later read may ask for those rows: it waits for this call first)
            self._writes.append(fut)
        return fut

    def rows(self, fut: SwapFuture, timed: bool = False) -> dict[str, np.ndarray]:
        """The rows a swap read, once no shard restarted under it (``timed``: the training
        thread's wait for them counts in :attr:`waited_s`)."""
        t0 = time.perf_counter()
        rows = fut.result()
        self._waited(timed, time.perf_counter() - t0)
        self._check_restarts(fut)
        if self._writes and getattr(fut, "ordered", False):
            with self._up_lock:  # (answered: no later read need wait for it; both threads read)
                self._writes = [w for w in self._writes if w is not fut]
        return rows

    def rows_on(
        self, fut: SwapFuture, device: torch.device | None, timed: bool = False
    ) -> Mapping[str, np.ndarray | Tensor]:
        """:meth:`rows` sent up to ``device`` (None: left on the host) once for both of
        their readers: one worker's update thread placing a prefetch's misses and its
        training thread assembling a staged read's blocks from them (each uploaded them
        before: on a GPU the training thread's copy was 6% of its time, profiled on an H200).
        Whichever comes first sends them up, on the stream both queue on, so the other's use
        is queued after it."""
        rows = self.rows(fut, timed)
        if device is None:
            return rows
        with self._up_lock:
            up = self._up
            if up is None or up[0] is not fut:
                up = self._up = (fut, {n: to_device(a, device) for n, a in rows.items()})
                self.uploads += 1
            return up[1]

    def write_back(self, writes: Writes, ready: Ready = None) -> None:
        """Hold ``writes`` (evicted rows, ``ready``: the CUDA event of their copy down; None:
        on the host) until the tier's next :meth:`swap` carries them: one call per shard a
        step, not two, and a read of those rows finds them written, as the shard writes a
        swap's rows before it reads. Every read from the shards is a swap of this tier's
        (the next batch's misses, reads outside training, a save's flush)."""
        self._count(writes, None)
        self._held.append((writes, ready))

    def forget(self) -> None:
        """Drop the write-backs held (the shards were restored: they have the rows)."""
        self._held = []
        self._up = None

    def drop(self, fut: SwapFuture) -> None:
        """A swap whose rows will not be read: waited for with the write-backs."""
        self._writes.append(fut)

    def settle(self, timed: bool = False, every: bool = False) -> None:
        """Wait for the swaps that wrote rows back (and dropped swaps) still in flight: their
        errors, a shard's restart. A shard is an async actor: over a Ray call it may run calls
        out of order, so a read of rows written back earlier waits for them first. Not for
        swaps sent over the data plane's connections (``every``: those too, the last few
        always): a connection's calls are served in order, a swap's write-backs before the
        next call (angelps/server/data_plane.py), so a swap may be sent before the last one
        is answered (two swaps in flight: learners/worker/held_tables.py)."""
        with self._up_lock:
            writes, self._writes = self._writes, []
            if not every:  # (the ordered ones are checked when read, or here later)
                self._writes = [w for w in writes if getattr(w, "ordered", False)][-ORDERED_KEPT:]
                writes = [w for w in writes if not any(w is k for k in self._writes)]
        t0 = time.perf_counter()
        for fut in writes:
            fut.result()
            self._check_restarts(fut)
        self._waited(timed, time.perf_counter() - t0)

    def _waited(self, timed: bool, seconds: float) -> None:
        # (a call not timed is the update thread's, or one outside training: a save's flush, a
        # read through, the few of them counted with the update thread's)
        if timed:
            self.waited_s += seconds
        else:
            self.ahead_s += seconds

    def take_waited(self) -> tuple[float, float]:
        """:attr:`waited_s` and :attr:`ahead_s` since the last call (each thread adds to its
        own; neither is reset under the other)."""
        now = (self.waited_s, self.ahead_s)
        last, self._taken = self._taken, now
        return now[0] - last[0], now[1] - last[1]

    def _count(self, writes: Writes, reads: np.ndarray | None) -> None:
        for keys, block in writes.values():
            self.bytes_moved += int(keys.nbytes + block.nbytes)
        if reads is not None:
            for row in self.row_bytes.values():
                self.bytes_moved += int(reads.nbytes) + len(reads) * row  # ids out, rows back

    def _check_restarts(self, fut: SwapFuture) -> None:
        """A shard that answers from a new process was restarted from a backup, which does not
        hold this tier's table (:meth:`angelps.client.ps_client.PSClient.mark_tiers`): the
        job restarts from its checkpoint."""
        for shard, pid in fut.pids.items():
            # (the process that loaded the shard's rows, when known: a restart before this
            # tier's first call to it is seen too)
            first = self.shards().shard_pids.get(shard, pid)
            before = self._pids.setdefault(shard, first)
            if before != pid:
                raise TierLost(
                    f"shard {shard} restarted and may have lost rows of table {self.label} "
                    "that this worker's device tier wrote back to it"
                )
