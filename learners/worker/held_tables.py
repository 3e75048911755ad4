"""Sparse tables held by the workers (``angel.sparse.placement=worker``).

Each of the ``W`` workers owns the rows that the table's partitioner
(:class:`angelps.partition.Partitioner` with ``W`` owners: the shard mapping) assigns it, on its
own device (learners/worker/held_table.py), weights and optimizer slots side by side in one
``[rows, cols + slots]`` tensor as a shard stores them, and updates them with the shards'
optimizer code (:func:`angelps.optim.apply`, its torch path). A row starts at
:func:`angelps.table.init_rows` of its key, as on a shard; a row is *touched* once read (a
shard creates it then), and only touched rows are saved, so a checkpoint holds the rows a
shard would hold.

One step (learners/worker/train_worker.py): every micro-batch reads the rows of its unique ids
(:meth:`HeldTables.rows`); the row gradients of the update's micro-batches are merged (ids
unique, gradients summed: :meth:`HeldTables.add_grad`), then :meth:`HeldTables.apply` sends
them to their owners, each of which sums a row's gradients from all workers and applies the
optimizer once with this update's step size. With one worker nothing is exchanged; with
several, the exchanges are all-to-all collectives (learners/worker/table_exchange.py). This is BSP:
every worker reads rows after every owner applied the previous update. One CPU worker applies
an update in a thread while it prepares the next batch; its next read waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from angelps import TableSpec
from angelps.checkpoint.files import (
    file_entry,
    iter_table_file,
    table_file,
    table_rel,
    table_shards,
    write_table_chunks,
)
from angelps.partition import Partitioner
from angelps.rates import Step
from angelps.storage.table_rows import FrozenTable
from learners.worker.device import to_device
from learners.worker.device_tier import TierBook, TierCounts, TierPolicy, TierTable
from learners.worker.held_table import HeldTable
from learners.worker.table_exchange import Exchange
from learners.worker.tier_rooms import fill, make_room
from learners.worker.tier_routes import Routed, prefetch_routed

__all__ = ["HeldTables", "write_held"]

#: Whether one worker's update thread also places the device tiers' prefetched misses of a
#: read not staged (None: on a GPU only; a staged read's are always placed there). On a GPU
#: that thread only queues the update, so it has room for that host work; on the CPU a read
#: not staged waited for it (tier10 392k against 411k samples/s on the feed suite, 2 cores).
PLACE_AHEAD: bool | None = None


def _ids_on(ids: np.ndarray | Tensor, device: torch.device) -> Tensor:
    """A batch's ids on ``device``: a copy of host ids, or ids deduplicated there already."""
    return ids.to(device) if isinstance(ids, Tensor) else to_device(ids, device)


#: Whether one worker's update thread asks for the misses of the batch after the next before it
#: puts the next one's rows (two swaps in flight): the next one's misses are indexed first, so
#: the ask finds them held. False: it asks once they are placed (tests compare both).
TWO_AHEAD = True


class HeldTables:
    """The tables this worker holds a share of, and the steps' row and gradient exchanges."""

    def __init__(
        self,
        specs: Sequence[TableSpec],
        worker_id: int,
        num_workers: int,
        partitioner: str,
        device: torch.device,
        backend: str = "gloo",
        tiers: Mapping[str, int] | None = None,
        policy: TierPolicy | None = None,
        shards: Callable[[], Any] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.partitioner = partitioner
        self.device = device
        tiers = dict(tiers or {})
        self.tables: dict[str, HeldTable | TierTable] = {}
        # A device tier over the shards (learners/worker/device_tier.py): tables keyed alike
        # (the same id range and capacity, read with the same ids) share one book of slots.
        alike: dict[tuple[int, int], list[TableSpec]] = {}
        for s in specs:
            if s.name in tiers:
                alike.setdefault((s.rows, tiers[s.name]), []).append(s)
        self.books = [
            TierBook(
                group,
                Partitioner(group[0], num_workers, partitioner),
                worker_id,
                device,
                cap,
                policy or TierPolicy(),
                shards,
            )
            for (_, cap), group in alike.items()
        ]
        booked = {n: t for b in self.books for n, t in b.tables.items()}
        for s in specs:
            if s.name in booked:
                self.tables[s.name] = booked[s.name]
            else:
                part = Partitioner(s, num_workers, partitioner)
                self.tables[s.name] = HeldTable(s, part, worker_id, device)
        self.tiers = {n: t for n, t in self.tables.items() if isinstance(t, TierTable)}
        self.whole = {n: t for n, t in self.tables.items() if isinstance(t, HeldTable)}
        self.names = frozenset(self.tables)
        self.exchange = Exchange(num_workers, device, backend) if num_workers > 1 else None
        self._parts: dict[str, list[tuple[np.ndarray | Tensor, Tensor]]] = {}
        self._moved = 0
        # One worker: an update runs in a thread while the next batch is prepared (reads wait
        # for it: BSP). Not with collectives, nor on a GPU without device tiers (its own queue
        # runs the update); with tiers the thread also does their host work (device_tier.py).
        solo = (
            num_workers == 1 and bool(self.tables) and (device.type != "cuda" or bool(self.books))
        )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="held-update") if solo else None
        self._pending: Future[None] | None = None
        self._rooms: list[Future[None]] = []  # (device tiers: learners/worker/device_tier.py)
        self._fills: list[Future[None]] = []  # (the next batch's rows put: two in flight)
        self._ahead_req: Mapping[str, Any] | None = None  # (several workers' prefetch)
        self._routed: Routed | None = None  # (and the read after it, routed with it)
        #: (ask_ahead: the request, the books asked, whether its read is staged)
        self._asked: tuple[Mapping[str, Any], list[TierBook], bool] | None = None
        self._asks: list[tuple[object, Future[Any]]] = []  # (asked in the update thread: req)
        self._staged: Mapping[str, Any] | None = None  # (the read staged: rows)
        self.asked_ahead = 0  # (prefetches whose misses ask_ahead asked for)
        self.asked_two = 0  # (prefetches that asked for the batch after: two swaps in flight)
        self._waited = 0.0  # (seconds settle waited for the device tiers' room and placement)
        self._waited_update = 0.0  # (and for the update before)

    @property
    def bytes_moved(self) -> int:
        """Bytes this worker sent to other workers (ids, rows, gradients) and its device tiers
        exchanged with the shards (ids, rows written back, rows read)."""
        return self._moved + sum(b.bytes_moved for b in self.books)

    def settle(
        self,
        rooms: bool = True,
        asks: bool = True,
        ahead: bool = True,
        fills: bool = True,
        update: bool = True,
    ) -> None:
        """Wait for an update still running (its error, if any, is raised here) and, with
        ``asks`` and ``rooms``, for the device tiers' asks and their room and placement;
        without ``ahead``, not for the ask of a batch not prefetched yet (:attr:`_asked`);
        without ``fills``, not for the rows of the last prefetch put (the update thread puts
        them before it runs the next update); without ``update``, not for the update."""
        if update and self._pending is not None:
            pending, self._pending = self._pending, None
            t0 = time.perf_counter()
            pending.result()
            self._waited_update += time.perf_counter() - t0
        waits: list[Future[Any]] = []
        if asks:
            later = self._asked[0] if self._asked is not None and not ahead else None
            waits = [f for r, f in self._asks if r is not later]
            self._asks = [(r, f) for r, f in self._asks if r is later]
        if rooms:
            waits, self._rooms = waits + self._rooms, []
            if fills:
                waits, self._fills = waits + self._fills, []
        if waits:
            t0 = time.perf_counter()
            for w in waits:
                w.result()
            self._waited += time.perf_counter() - t0
        if rooms and update:  # (every update handed over was applied)
            for b in self.books:
                b.settled()

    def __bool__(self) -> bool:
        return bool(self.tables)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self.tables.values())

    # --- the step ---------------------------------------------------------------------------

    def rows(self, req: Mapping[str, np.ndarray]) -> dict[str, Tensor]:
        """The rows of the held tables named in ``req`` (unique ids each), on the device:
        read here (one worker) or from their owners (several; every worker calls this in
        the same order, as each call is a collective)."""
        names = sorted(n for n in req if n in self.names)  # (the same order everywhere)
        # A read staged by the update thread's ask (prefetch) waits for the update before it
        # only: that thread makes room for its misses and places them meanwhile.
        staged, self._staged = req is self._staged, None
        self.settle(rooms=not staged, ahead=not staged)
        if not staged:
            for b in self.books:
                b.unstage()
        if self.exchange is None:
            return {n: self._read(n, req[n]) for n in names}
        got: dict[str, Tensor] = {}
        # The read a prefetch routed ahead: the same request object on every worker (never a
        # comparison of ids, which could differ between workers and split the collectives).
        ahead, self._ahead_req = req is self._ahead_req, None
        if not ahead:  # (the routes made ahead are dropped: the next prefetch routes anew)
            self._routed = None
        for group in self._groups(names):
            ids = req[group[0]]
            tables = [self.tables[n] for n in group]
            rows, sent = self.exchange.fetch(ids, tables, ahead)
            self._moved += sent
            got |= dict(zip(group, rows, strict=True))
        return got

    def prefetch(
        self, req: Mapping[str, np.ndarray | Tensor], ahead: Mapping[str, Any] | None = None
    ) -> bool:
        """Start fetching the device tiers' misses of the next batch's unique ids. Several
        workers route the ids to their owners now (every worker calls this at the same point
        of a step: it is a collective), and each owner prefetches the ids it will serve.
        ``ahead``: the request of the batch after, asked for now where the next one's was
        asked ahead (:meth:`ask_ahead`; one worker): True if it was; several workers route it
        now (learners/worker/tier_routes.py)."""
        if self.exchange is not None:
            names = sorted(n for n in req if n in self.names)  # (the same order everywhere)
            route = (self.exchange, self._groups(names), self.tables, self.books)
            self._routed, sent = prefetch_routed(*route, req, ahead, self._routed)
            self._moved += sent
            self._ahead_req = req
            return False
        if self.num_workers == 1:
            early, self._asked = self._asked, None
            asked = early is not None and early[0] is req
            if early is not None and asked:
                books, staged = early[1], early[2]  # (looked up and asked for: ask_ahead)
                self.asked_ahead += 1
            else:
                # (the update thread's asks, room and placement first: this lookup changes
                # what they change; the update may go on beside it)
                self.settle(update=False)
                books, staged = self._ask(req), False
            if not books:
                return False
            assert self._pool is not None  # (one worker holding device tiers has one)
            if staged:  # (the update thread asked: it places them, the read need not wait)
                self._staged = req
                if ahead is None or not TWO_AHEAD:
                    self._rooms.append(self._pool.submit(make_room, books, True, True))
                    return False
                # In the update thread's order: room for the next batch's misses, indexed
                # there; the batch after asked for (it finds them held, and need not wait for
                # the swap before it); their rows put as they come, before the next update.
                self._rooms += self._fills  # (waited for by the next update handed over)
                self._rooms.append(self._pool.submit(make_room, books, True, True, False, ahead))
                self.ask_ahead(ahead)
                self._fills = [self._pool.submit(fill, books)]
                self.asked_two += self._asked is not None
                return self._asked is not None
            # The update thread frees the misses' slots after the update in progress (its rows
            # may go then) and places the misses as they come, while this thread prepares the
            # next batch; the next read waits for it (settle). On a GPU the victims' copy down
            # and the placements are queued after the update, in the order of the stream.
            place = self.device.type == "cuda" if PLACE_AHEAD is None else PLACE_AHEAD
            self._rooms.append(self._pool.submit(make_room, books, place, False, True, ahead))
        return False

    def ask_ahead(self, req: Mapping[str, np.ndarray | Tensor]) -> None:
        """One worker, as soon as this update's reads are done: look up the device tiers' ids
        of the update after it (``req``) and ask the shards for its misses now, while this
        update computes, rather than once it is handed over; :meth:`prefetch` of the same
        ``req`` then only frees their slots (and places them, on a GPU). Exact: the misses are
        rows this update does not hold, so it does not change them; its own rows, read and
        pinned, stay."""
        if self.num_workers != 1 or not self.books:
            return
        assert self._pool is not None  # (one worker holding device tiers has one)
        books = [b for b in self.books if any(n in req for n in b.tables)]
        # Asked in the update thread (after the room and placement of the read in progress:
        # they change the index the ask looks up), so that the prefetch after this update
        # stages the next read (:meth:`TierBook.read`), unless a book's tables read ids of
        # their own (a union is asked for): that read waits for the room.
        clocks = [b.clock + 1 for b in books]
        self._asks.append((req, self._pool.submit(self._ask, req, clocks)))
        alike = all(len({id(req[n]) for n in b.tables if n in req}) == 1 for b in books)
        self._asked = (req, books, alike)

    def _ask(
        self, req: Mapping[str, np.ndarray | Tensor], clocks: Sequence[int] | None = None
    ) -> list[TierBook]:
        """Start each device tier's prefetch of ``req`` (``clocks``: the reads' of the books
        asked, given from the update thread); the books asked."""
        books: list[TierBook] = []
        for b in self.books:
            ids = b.ids_in(req)
            if ids is not None:
                b.prefetch(ids, None if clocks is None else clocks[len(books)])
                books.append(b)
        return books

    def train(self, on: bool) -> None:
        """Training (True) or reading only (validation, prediction: device tiers pin no rows)."""
        for b in self.books:
            b.training = on

    def tier_counts(self) -> TierCounts:
        """The device tiers' hits, misses and write-backs since the last call (not waiting for
        the update thread: a settle here, each chunk of steps, stopped the swaps in flight)."""
        total = TierCounts()
        for t in self.tiers.values():
            total.add(t.take_counts())
        waits = [b.link.take_waited() for b in self.books]
        total.wait_shards_s = sum(w for w, _ in waits)
        total.ahead_wait_s = sum(a for _, a in waits)
        total.wait_s = self._waited + total.wait_shards_s
        total.wait_update_s, self._waited, self._waited_update = self._waited_update, 0.0, 0.0
        return total

    def flush_tiers(self) -> int:
        """Write the rows of every device tier back to the shards (before a save)."""
        self.settle()
        return sum(b.flush() for b in self.books)

    def reset_tiers(self) -> None:
        """Empty the device tiers (after a restore: the shards hold the restored rows)."""
        self.settle()
        self._asked = self._staged = None
        self._routed = None  # (several workers: a read routed ahead has no misses asked now)
        for b in self.books:
            b.reset()

    def _read(self, name: str, ids: np.ndarray | Tensor) -> Tensor:
        """One worker's read of its own table ``name`` (a device tier looks its ids up on the
        host index: they are not sent up to the device first)."""
        t = self.tables[name]
        if isinstance(t, TierTable):
            return t.gather(ids)
        return t.gather(_ids_on(ids, self.device))

    def idle(self) -> None:
        """Take part in one :meth:`rows` exchange without asking for rows (a worker whose
        prediction data ran out before its peers')."""
        names = sorted(self.names)
        empty = np.zeros(0, dtype=np.int64)
        self.rows(dict.fromkeys(names, empty))

    def add_grad(self, name: str, ids: np.ndarray | Tensor, grad: Tensor) -> None:
        """One micro-batch's row gradients of a held table (ids unique). One worker's device
        tier keeps host ids on the host (its update looks them up there: ids on a GPU would
        have to come back down, waiting for it)."""
        keep = self.exchange is None and name in self.tiers and not isinstance(ids, Tensor)
        self._parts.setdefault(name, []).append((ids if keep else _ids_on(ids, self.device), grad))

    def merged(self) -> dict[str, tuple[np.ndarray | Tensor, Tensor]]:
        """This update's gradients by table: ids unique, a repeated id's gradients summed."""
        out: dict[str, tuple[np.ndarray | Tensor, Tensor]] = {}
        for name, parts in self._parts.items():
            if len(parts) == 1:
                out[name] = parts[0]
                continue
            ids = torch.cat([_ids_on(p[0], self.device) for p in parts])
            g = torch.cat([p[1] for p in parts])
            uniq, inv = torch.unique(ids, sorted=True, return_inverse=True)
            out[name] = (
                uniq,
                torch.zeros((len(uniq), g.shape[1]), dtype=g.dtype, device=g.device).index_add_(
                    0, inv, g
                ),
            )
        self._parts = {name: [v] for name, v in out.items()}
        return out

    def clear(self) -> None:
        """Drop this update's gradients (a skipped update); the device tiers' rows it read are
        no longer pinned."""
        self._parts = {}
        for b in self.books:
            b.unpin()

    def apply(self, scale: float, lr: Step) -> None:
        """Apply this update: every owner sums its rows' gradients × ``scale`` from all the
        workers and updates them once with step ``lr`` (a step size, or per-table rates)."""
        single = all(len(p) == 1 for p in self._parts.values())
        grads = self.merged()
        self._parts = {}
        # (not the ask made during this update: it changes nothing the update reads, and the
        # update thread runs it first; on a GPU the forward and backward may be queued sooner;
        # nor the rows of the prefetch put after the ask after it: that thread puts them first)
        self.settle(asks=False, fills=False)
        if self.exchange is None:
            for name, (ids, _) in grads.items():
                t = self.tables[name]
                if isinstance(t, TierTable):  # (its slots, found before the update thread runs)
                    t.resolve(ids)
            if self._pool is not None:
                self._pending = self._pool.submit(self._update, grads, scale, lr)
            else:
                self._update(grads, scale, lr)
            for b in self.books:  # (pinned until settled: a prefetch may evict meanwhile)
                b.end_update()
            return
        groups = self._groups(sorted(self.names))
        for group in groups:
            tables = [self.tables[n] for n in group]
            # (several workers keep no host ids: add_grad)
            local = cast("list[tuple[Tensor, Tensor] | None]", [grads.get(n) for n in group])
            # one micro-batch an update (the same on every worker): the ids are the read's
            reuse = single and len(groups) == 1
            self._moved += self.exchange.push(local, tables, scale, lr, reuse)
        for b in self.books:
            b.end_update()
            b.settled()

    def _update(
        self, grads: Mapping[str, tuple[np.ndarray | Tensor, Tensor]], scale: float, lr: Step
    ) -> None:
        for name, (ids, g) in grads.items():
            t = self.tables[name]
            g = g * scale if scale != 1.0 else g
            if isinstance(t, TierTable):
                t.update(ids, g, lr)
            else:
                t.update(_ids_on(ids, self.device), g, lr)

    def _groups(self, names: Sequence[str]) -> list[list[str]]:
        """Tables routed alike (the same row range) exchange together."""
        groups: dict[int, list[str]] = {}
        for n in names:
            groups.setdefault(self.tables[n].spec.rows, []).append(n)
        return list(groups.values())

    # --- checkpoints ------------------------------------------------------------------------

    def save(self, root: str) -> dict[str, Any]:
        """Write this worker's share of every held table as ``<table>/shard-<worker>.parquet``
        under ``root`` (the shards' format); the files' manifest entries."""
        self.settle()
        return write_held(root, self.worker_id, self.whole)

    def freeze(self) -> dict[str, FrozenTable]:
        """Host copies of every held table's rows now (a checkpoint written in the
        background: :func:`write_held` writes them as :meth:`save` writes the tables)."""
        self.settle()
        return {name: t.freeze() for name, t in self.whole.items()}

    def frozen_nbytes(self) -> int:
        """Host bytes :meth:`freeze` copies (the update in flight applied first: it may
        touch rows)."""
        self.settle()
        return sum(t.frozen_nbytes() for t in self.whole.values())

    def load(self, root: str, manifest: Mapping[str, Any]) -> dict[str, int]:
        """Replace every held table's rows with the checkpoint's at ``root`` (written by the
        shards or by workers, any number of them): this worker keeps the rows it owns."""
        self.settle()
        for b in self.books:  # (the shards load a tier's table)
            b.reset()
        restored = {}
        for name, t in self.whole.items():
            t.reset()
            n = 0
            for j in range(table_shards(manifest, name)):
                path = table_file(root, name, j)
                for keys, w, state in iter_table_file(path, file_entry(manifest, name, j)):
                    mine = t.part.owns(self.worker_id, keys)
                    if not mine.all():
                        keys, w = keys[mine], w[mine]
                        state = {k: v[mine] for k, v in state.items()}
                    if len(keys):
                        t.assign(keys, w, state)
                    n += len(keys)
            restored[name] = n
        return restored


def write_held(
    root: str, worker: int, tables: Mapping[str, HeldTable | FrozenTable]
) -> dict[str, Any]:
    """Write ``worker``'s share of each table (live or a copy) as ``<table>/shard-<worker>.parquet``
    under ``root``; the files' manifest entries."""
    files = {}
    for name, t in tables.items():
        entry = write_table_chunks(table_file(root, name, worker), t.export_chunks())
        files[table_rel(name, worker)] = entry
    return files
