"""The worker's view of the parameter server: :class:`PSClient` and its :class:`PSFuture`.

Every operation dedups keys on the worker (duplicate gradients summed), routes them with the
shared :mod:`angelps.partition` module (:mod:`angelps.client.routing`), makes ONE ``step`` call per
shard (all shards are called before waiting for any, :mod:`angelps.client.transport`), and sends numpy
arrays. Pushes do not wait: ``push`` submits the calls and returns; each shard serves one
caller's calls in order and also orders a worker's calls by clock, so the next pull still sees
the push. An error raised by a push that was not waited for surfaces at the client's next
synchronous call (or :meth:`PSClient.flush`). A shard that dies is recovered from its backup
(:mod:`angelps.client.recovery`).

Clock semantics (see :mod:`angelps.server.consistency`): each ``push``/``push_many``/``push_pull``/
``clock`` call is one step of this worker. With ``W`` workers under BSP each worker must push
once per step (``clock()`` when it has nothing to push); the shards apply one update per step
on the sum of the W pushes, so workers pre-scale their gradients by 1/W to push the mean.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import ray
from numpy.typing import ArrayLike
from ray.actor import ActorHandle
from ray.exceptions import RayTaskError

from angelps.checkpoint import files as checkpoint
from angelps.checkpoint.backups import remove_launch
from angelps.client.pending_save import HeldWriter, PendingSave, save_caught_up
from angelps.client.recovery import (
    FAILURES,
    UNAVAILABLE_WAITS,
    Call,
    ReplayLog,
    ask_available,
    is_restart,
)
from angelps.client.routing import Routed, assemble
from angelps.client.tier_swap import TierSwaps
from angelps.client.transport import (
    Reply,
    Transport,
    call_bytes,
    get_refs,
    remote_error,
    reply_bytes,
)
from angelps.options import ClientOptions, PSOptions, ShardOptions
from angelps.partition import Partitioner
from angelps.push_checks import check_keys, check_lr, check_push
from angelps.rates import Step
from angelps.server.launch import launch_shards
from angelps.step_call import Pulls, Pushes, StepCall
from angelps.table import TableSpec, table_named

__all__ = ["HeldWriter", "PSClient", "PSFuture"]

T = TypeVar("T")
U = TypeVar("U")

#: Seconds between the asks of :meth:`PSClient.stats` and :meth:`PSClient.catch_up` while a
#: shard Ray restarts answers "unavailable", up to the client's timeout
#: (angelps.client.recovery.ask_available).
STATS_RETRIES = UNAVAILABLE_WAITS

#: Rows returned by one shard for one call (None for a push alone).
Rows = dict[str, np.ndarray] | None
#: A push of one table: (keys, gradients).
Update = tuple[ArrayLike, ArrayLike]
#: Keys of a pull per table (None: every row of a dense table).
Requests = Mapping[str, ArrayLike | None]


class PSFuture(Generic[T]):
    """The result of an ``*_async`` call: ``.result()`` waits and returns it (None for a push)."""

    def __init__(
        self, client: PSClient, calls: list[Call], finish: Callable[[list[Rows]], T]
    ) -> None:
        self._client = client
        self._calls = calls
        self._finish = finish
        self._done = False
        self._value: T | None = None

    def result(self) -> T:
        if not self._done:
            self._value = self._finish(self._client._wait(self._calls))
            self._done = True
            self._calls = []
        return self._value  # type: ignore[return-value]

    def map(self, f: Callable[[T], U]) -> PSFuture[U]:
        """A future of ``f(result)`` over the same calls."""
        finish = self._finish
        return PSFuture(self._client, self._calls, lambda rows: f(finish(rows)))


class PSClient(TierSwaps):
    """Pull rows from and push gradients to the shard actors of one job.

    Create the shards with :meth:`launch` (on the driver, after ``ray.init``), hand
    :meth:`for_worker` clients to worker actors. The client that launched the shards owns them:
    its :meth:`shutdown` kills them; other clients' ``shutdown`` only flushes.
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        handles: Sequence[ActorHandle],
        options: ClientOptions | None = None,
        worker_id: int = 0,
        owner: bool = False,
    ) -> None:
        if options is None:
            # Bare handles: no data-plane token is known, so every call takes Ray.
            options = ClientOptions(ShardOptions.from_config({}), transport="ray", data_host="")
        self.specs = {t.name: t for t in tables}
        self.handles = list(handles)
        self.num_shards = len(self.handles)
        self.options = options
        self.parts = {
            t.name: Partitioner(t, self.num_shards, options.shard.partitioner) for t in tables
        }
        self.worker_id = worker_id
        self.skipped: dict[str, int] = {name: 0 for name in self.specs}
        self._owner = owner
        self._clock = 0
        #: shard -> the process id serving it after the last load (or when first asked:
        #: :meth:`learn_pids`); a device tier that finds another restarts the job
        self.shard_pids: dict[int, int] = {}
        self._inflight: list[Call] = []
        self.net = Transport(self.handles, options)
        # Pushes since the last backup each shard reported, replayed after a restart.
        self._log = ReplayLog(
            self.handles, worker_id, options.shard.backup_interval > 0, options.shard.timeout_s
        )
        self._log.secret = options.shard.token

    @property
    def num_workers(self) -> int:
        return self.options.shard.num_workers

    @property
    def partitioner(self) -> str:
        return self.options.shard.partitioner

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def launch(
        cls, tables: Sequence[TableSpec], options: PSOptions, num_workers: int = 1
    ) -> PSClient:
        """Create ``options.num_shards`` shard actors named ``<job>-ps-<i>`` in the Ray
        namespace ``angelps`` and return the client of worker 0 (Ray must be initialised)."""
        handles, client_options = launch_shards(tables, options, num_workers)
        return cls(tables, handles, client_options, 0, owner=True)

    def mark_tiers(self, names: Sequence[str]) -> None:
        """Tell the shards which tables workers hold in device tiers: backups leave them out
        (a tier writes rows back outside the clocks, so a shard restarted from a backup makes
        the job restart from its checkpoint: learners/worker/tier_link.py)."""
        token = self.options.shard.token
        self._get([h.mark_tiers.remote(list(names), secret=token) for h in self.handles])

    def learn_pids(self) -> dict[int, int]:
        """:attr:`shard_pids` as the shards answer now (unless a load set them)."""
        if not self.shard_pids:
            self.shard_pids = dict(enumerate(self._get([h.pid.remote() for h in self.handles])))
        return self.shard_pids

    def for_worker(self, worker_id: int) -> PSClient:
        """A picklable client for worker ``worker_id`` (0 .. num_workers-1) to pass to a worker
        actor; it starts at clock 0 and does not own the shards."""
        if not 0 <= worker_id < self.num_workers:
            raise ValueError(
                f"worker id {worker_id} is out of range: num_workers={self.num_workers}"
            )
        client = PSClient(list(self.specs.values()), self.handles, self.options, worker_id)
        client.shard_pids = dict(self.shard_pids)
        return client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_inflight"] = []
        state["_owner"] = False
        return state  # the transport and the log pickle fresh: they belong to this process

    # --- plumbing ------------------------------------------------------------------------------

    def _spec(self, table: str) -> TableSpec:
        return table_named(self.specs, table)

    def _get(self, refs: Sequence[ray.ObjectRef[T]]) -> list[T]:
        """``ray.get`` of control calls (stats, save, load) after the pushes in flight."""
        self._wait([])
        try:
            return ray.get(list(refs))  # type: ignore[no-any-return]
        except RayTaskError as e:
            raise remote_error(e) from None

    def _wait(self, calls: list[Call]) -> list[Rows]:
        """Rows (or None) of ``calls``, after every push still in flight; a shard that died
        and was restarted is recovered (see :mod:`angelps.client.recovery`)."""
        pending = self._inflight
        self._inflight = []
        every = list(calls) + pending
        results: list[Reply]
        try:
            results = get_refs([c.ref for c in every])
        except RayTaskError as e:
            if not is_restart(e):
                raise remote_error(e) from None
            results = self._log.recover(every, self.net, self._clock)
        except FAILURES:
            results = self._log.recover(every, self.net, self._clock)
        for c, r in zip(every, results, strict=True):
            self._log.trim(c.shard, r.backed_up)
            if r.restored is not None:
                self._log.warn(c.shard, r.restored, 0)
        return [r.rows for r in results[: len(calls)]]

    def _route(self, table: str, keys: ArrayLike) -> Routed:
        spec = self._spec(table)
        return Routed(spec, self.parts[table], check_keys(spec, keys))

    def _route_push(self, updates: Mapping[str, Update]) -> list[tuple[Routed, np.ndarray]]:
        """Validate every update first (nothing is sent if one is bad), dedup and sum;
        tables whose gradients are not finite are counted in ``skipped`` (policy skip)."""
        routed: list[tuple[Routed, np.ndarray]] = []
        skipped: list[str] = []
        for table, (keys, grads) in updates.items():
            spec = self._spec(table)
            checked = check_push(spec, keys, grads, self.options.shard.nan_policy)
            if checked is None:
                skipped.append(table)
                continue
            r = Routed(spec, self.parts[table], checked[0])
            routed.append((r, r.sum_grads(checked[1])))
        for table in skipped:
            self.skipped[table] += 1
        return routed

    def _submit(
        self,
        push: list[tuple[Routed, np.ndarray]] | None,
        lr: Step,
        pull: list[Routed],
        pull_dense: Sequence[str] = (),
        ahead: int = 0,
    ) -> list[Call]:
        """One ``step`` call per shard that has something to do (every shard for a push: it is
        this worker's clock tick). ``ahead``: the pull is for the batch of ``ahead`` clocks
        later (a prefetch, SSP/ASP). The calls are marked checked: ``push`` and ``pull`` were
        validated here (:mod:`angelps.push_checks`), so the shards do not check them again."""
        clock = self._clock
        pull_clock = clock + 1 if push is not None else clock
        prefetch = pull_clock + ahead if ahead > 0 else None
        calls: list[Call] = []
        for s in range(self.num_shards):
            pushes: Pushes | None = None
            if push is not None:
                pushes = {
                    r.spec.name: (r.uniq[r.index(s)], g[r.index(s)]) for r, g in push if r.count(s)
                }
            pulls: Pulls = {r.spec.name: r.uniq[r.index(s)] for r in pull if r.count(s)}
            for name in pull_dense:
                pulls[name] = None
            if pushes is None and not pulls:
                continue
            call = StepCall(
                self.worker_id, clock, pushes, lr, pulls or None, False, prefetch, checked=True
            )
            if pushes is not None:
                self._log.record(s, call)
            nbytes = call_bytes(self.specs, self.num_shards, pushes, pulls)
            reply = reply_bytes(self.specs, self.num_shards, pulls)
            # (recovery redoes a lost pull at pull_clock: rows as fresh as a prefetch's, or more)
            ref = self.net.call(s, call, nbytes, reply)
            calls.append(Call(s, ref, pull_clock, pulls or None))
        if push is not None:
            self._clock += 1
        return calls

    def _track(self, calls: list[Call]) -> None:
        """Remember pushes not waited for; apply back-pressure when too many are in flight."""
        self._inflight.extend(calls)
        limit = 4 * self.num_shards
        if len(self._inflight) > limit:
            newest = self._inflight[-limit:]
            self._inflight = self._inflight[:-limit]
            try:
                self._wait([])  # the older ones
            finally:
                self._inflight = newest + self._inflight

    def _assemble(
        self, routed: Sequence[Routed], calls: list[Call], rows: list[Rows]
    ) -> dict[str, np.ndarray]:
        return assemble(routed, [c.shard for c in calls], rows)

    # --- public API ----------------------------------------------------------------------------

    def pull_many_async(self, requests: Requests) -> PSFuture[dict[str, np.ndarray]]:
        """Future of :meth:`pull_many`."""
        whole = [t for t, k in requests.items() if k is None]
        for t in whole:
            if self._spec(t).sparse:
                raise ValueError(f"table {t!r} is sparse: pulling all rows needs a dense table")
        routed = [self._route(t, k) for t, k in requests.items() if k is not None]
        calls = self._submit(None, 0.0, routed, pull_dense=whole)

        def finish(vals: list[Rows]) -> dict[str, np.ndarray]:
            out = self._assemble(routed, calls, vals)
            for t in whole:  # every shard sent its block; calls are in shard order
                out[t] = np.concatenate([v[t] for v in vals if v is not None], axis=0)
            return {t: out[t] for t in requests}

        return PSFuture(self, calls, finish)

    def pull_many(self, requests: Requests) -> dict[str, np.ndarray]:
        """Rows of several tables, one round trip per shard: ``{table: [len(keys), cols]}``.
        ``None`` as the keys of a dense table pulls all its rows."""
        return self.pull_many_async(requests).result()

    def pull_async(self, table: str, keys: ArrayLike) -> PSFuture[np.ndarray]:
        """Future of :meth:`pull`."""
        return self.pull_many_async({table: keys}).map(lambda rows: rows[table])

    def pull(self, table: str, keys: ArrayLike) -> np.ndarray:
        """Rows ``keys`` (int64, 1-D, duplicates allowed) of ``table``: ``[len(keys), cols]``,
        in the order of ``keys``. Sparse rows are created on first pull."""
        return self.pull_async(table, keys).result()

    def pull_dense(self, table: str) -> np.ndarray:
        """All rows of a dense table, ``[rows, cols]`` (each shard sends its block)."""
        spec = self._spec(table)
        if spec.sparse:
            raise ValueError(f"table {table!r} is sparse: pull_dense needs a dense table")
        return self.pull_many({table: None})[table]

    def push_many_async(self, updates: Mapping[str, Update], lr: Step) -> PSFuture[None]:
        """Future of :meth:`push_many` (``result()`` waits until every shard applied it)."""
        lr = check_lr(lr)
        calls = self._submit(self._route_push(updates), lr, [])
        return PSFuture(self, calls, lambda vals: None)

    def push_many(self, updates: Mapping[str, Update], lr: Step) -> None:
        """Push gradients of several tables as one step of this worker, without waiting."""
        lr = check_lr(lr)
        self._track(self._submit(self._route_push(updates), lr, []))

    def push_async(self, table: str, keys: ArrayLike, grads: ArrayLike, lr: Step) -> PSFuture[None]:
        """Future of :meth:`push`."""
        return self.push_many_async({table: (keys, grads)}, lr)

    def push(self, table: str, keys: ArrayLike, grads: ArrayLike, lr: Step) -> None:
        """Push the loss gradient of rows ``keys`` (duplicates summed) with step size ``lr``;
        the shard applies the table's optimizer. Does not wait (see the module docstring)."""
        self.push_many({table: (keys, grads)}, lr)

    def push_pull_async(
        self,
        updates: Mapping[str, Update],
        lr: Step,
        requests: Mapping[str, ArrayLike],
        ahead: int = 0,
    ) -> PSFuture[dict[str, np.ndarray]]:
        """Future of :meth:`push_pull`. ``ahead > 0`` (SSP within its staleness, or ASP): the
        rows are for the step ``ahead`` clocks after the next one, and the shard serves them
        with the waits SSP asks for at that clock (they may miss this worker's own pushes of
        the clocks in between)."""
        lr = check_lr(lr)
        routed_push = self._route_push(updates)
        routed_pull = [self._route(t, k) for t, k in requests.items()]
        calls = self._submit(routed_push, lr, routed_pull, ahead=ahead)
        return PSFuture(self, calls, lambda vals: self._assemble(routed_pull, calls, vals))

    def push_pull(
        self, updates: Mapping[str, Update], lr: Step, requests: Mapping[str, ArrayLike]
    ) -> dict[str, np.ndarray]:
        """Fused step, one call per shard: apply the pushes (this worker's step), then return
        the rows of ``requests`` as seen by the next step."""
        return self.push_pull_async(updates, lr, requests).result()

    def clock(self) -> None:
        """End this worker's step without gradients (so BSP/SSP peers are not kept waiting)."""
        self._track(self._submit([], 0.0, []))

    def flush(self) -> None:
        """Wait until every push of this client has been applied (raises its errors)."""
        self._wait([])

    def backup(self) -> None:
        """Make every shard write its recovery backup now (e.g. at the end of an epoch); asked
        again of a shard Ray restarts, up to the client's timeout."""
        token = self.options.shard.token
        ask = lambda: [h.run_backup.remote(secret=token) for h in self.handles]  # noqa: E731
        ask_available(ask, self._get, self.options.shard.timeout_s, STATS_RETRIES)

    def stats(self) -> list[dict[str, Any]]:
        """Per-shard statistics: rows held, updates applied, skipped pushes, clocks."""
        timeout_s = self.options.shard.timeout_s
        ask = lambda: [h.stats.remote() for h in self.handles]  # noqa: E731
        return ask_available(ask, self._get, timeout_s, STATS_RETRIES)

    def catch_up(self) -> int:
        """Wait for this worker's pushes, then make every shard hold all of them: a shard
        Ray restarted from its backup since the last step gets the pushes it lacks replayed
        (a step would find the restart and do so). Call it on each worker's own client
        before a checkpoint that no step follows: a restarted shard refuses to save until
        every worker has caught up (NotReplayed), rather than write a checkpoint without
        them. :meth:`save` calls it for a client that pushed. Returns the pushes replayed."""
        self.flush()
        return self._log.catch_up(self.net, self._clock, STATS_RETRIES)

    def save(
        self,
        path: str,
        extra: Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
        held: HeldWriter | None = None,
    ) -> None:
        """Checkpoint every shard's rows and optimizer state under directory ``path``, with
        ``extra`` (a JSON-safe dict: scheduler state, data position...) in the manifest and
        ``files`` (name -> bytes: the caller's own files, whose checksums it keeps in
        ``extra``) beside the tables, inside the same atomic commit.
        Atomic and durable: written to a temporary directory (every file fsynced, the manifest
        with every file's SHA-256 last), then renamed into place, the previous checkpoint kept
        as ``<path>.prev`` (see angelps.checkpoint.local_dir). A ``path`` that is a file or a
        directory of other files is refused (CheckpointError) before anything is written.
        ``held``: tables held outside the shards (by the workers), written into the same
        commit by ``held.start(tmp, ...)``, one file per owner each (the manifest's
        ``table_shards``). A client that pushed catches up first (:meth:`catch_up`), and
        again, the save made once more, where a shard dies before anything is committed."""
        save_caught_up(self, path, extra, files, held)

    def save_async(
        self,
        path: str,
        extra: Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
        held: HeldWriter | None = None,
    ) -> PendingSave:
        """:meth:`save` with the files written in the background: returns once every shard
        (and ``held``'s owners) has copied its rows, so training may go on; the result's
        ``result()`` waits for the files and commits (:mod:`angelps.client.pending_save`).
        One at a time: finish (or discard) it before the next save or load."""
        return save_caught_up(self, path, extra, files, held, background=True)

    def load(self, path: str, held: Sequence[TableSpec] = ()) -> dict[str, Any]:
        """Restore the checkpoint at ``path`` into the shards (bit-identical rows and optimizer
        state, whatever the number of shards that saved it) and return its ``extra``.

        Every shard checks the files it reads against the manifest's SHA-256 and row counts: a
        damaged checkpoint is refused (CheckpointError naming the file). Clocks restart at 0 on
        every shard and in this client: create worker clients with :meth:`for_worker` after
        loading."""
        manifest = checkpoint.read_manifest(path)
        # (``held``: the job's tables held by its workers, which load them themselves)
        checkpoint.check_layout(manifest, [*self.specs.values(), *held])
        self.flush()
        root = manifest["root"]
        token = self.options.shard.token
        ask = lambda: [h.load.remote(root, manifest, secret=token) for h in self.handles]  # noqa: E731
        # (a shard Ray is restarting is waited for: a load made again restores the same rows)
        got: list[tuple[int, dict[str, int]]] = ask_available(
            ask, self._get, self.options.shard.timeout_s, STATS_RETRIES
        )
        self.shard_pids = {s: pid for s, (pid, _) in enumerate(got)}
        self._clock = 0
        self._log.clear()  # the shards backed up the loaded model at clock 0
        return dict(manifest.get("extra", {}))

    @property
    def bytes_moved(self) -> int:
        """Bytes of the step calls this client made (requests and replies)."""
        return self.net.moved

    @property
    def step_count(self) -> int:
        """Pushes (steps) made by this client."""
        return self._clock

    def shutdown(self) -> None:
        """Flush; if this client launched the shards, kill them."""
        try:
            self.flush()
        finally:
            self.net.close()
            if self._owner:
                backups, token = self.options.shard.backup_dir, self.options.shard.token
                if backups:  # a backup being written stops first: none lands after removal
                    stop: list[Any] = [h.stop_backups.remote(secret=token) for h in self.handles]
                    ray.wait(stop, num_returns=len(stop), timeout=60)
                for h in self.handles:
                    ray.kill(h, no_restart=True)
                self.handles, self._owner = [], False
                if backups:
                    remove_launch(backups)  # only this launch's directory or prefix
