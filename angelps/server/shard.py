"""One parameter shard as a plain class (:class:`ParameterShard`, testable without Ray).

A shard holds, for every table, the rows the partitioner assigns to it plus their optimizer
state (:mod:`angelps.storage.table_rows`), and the clocks of the workers (:mod:`angelps.server.consistency`).
:class:`angelps.server.shard_server.ShardServer` wraps it in a Ray actor that adds the clock waiting, the
TCP data plane and backups.

Invariants: every push not already checked by the client (:mod:`angelps.push_checks`: a call
from the network, a direct use of this class) is validated completely (tables, key ranges,
ownership, shapes, dtypes, finiteness) before any row is touched, so a rejected push leaves the
shard unchanged; a worker's pushes are applied in clock order; under BSP the pushes of one clock
from all workers are summed and applied as one optimizer update.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from angelps.checkpoint.files import (
    CheckpointError,
    file_entry,
    iter_table_file,
    table_file,
    table_rel,
    table_shards,
    write_table_chunks,
)
from angelps.dedup import dedup, segment_sum, strictly_increasing
from angelps.options import (
    ADMISSION_MIN_COUNT,
    EVICTION_TTL_UPDATES,
    NAN_POLICIES,
    NAN_POLICY,
    PARTITIONER,
    PARTITIONERS,
    STALENESS,
    one_of,
)
from angelps.partition import Partitioner
from angelps.push_checks import check_keys, check_lr, check_push
from angelps.rates import Step, rate_of
from angelps.server.consistency import ClockTable
from angelps.server.shard_swap import swap
from angelps.storage.row_threads import auto_threads, row_threads
from angelps.storage.table_rows import FrozenTable, Table, new_table
from angelps.table import TableSpec, check_unique_names, table_named

__all__ = [
    "NotReplayed",
    "ParameterShard",
    "SaveLost",
    "SaveStopped",
    "ShardImage",
    "ShardRestarted",
]


class ParameterShard:
    """Shard ``shard_id`` of ``num_shards``: the rows it owns of every table, and the clocks.

    ``push`` applies (or, under BSP with several workers, buffers) one worker's gradients for
    one clock; ``pull`` returns rows. Clock waiting is the actor's job: the plain class asserts
    that a push arrives in clock order and serves pulls immediately.
    """

    def __init__(
        self,
        shard_id: int,
        num_shards: int,
        tables: Sequence[TableSpec],
        partitioner: str = PARTITIONER.default,
        num_workers: int = 1,
        staleness: int = STALENESS.default,
        nan_policy: str = NAN_POLICY.default,
        device: str | None = None,
        admission_min_count: int = ADMISSION_MIN_COUNT.default,
        eviction_ttl_updates: int = EVICTION_TTL_UPDATES.default,
        swap_threads: int = 1,
    ) -> None:
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard id {shard_id} is out of range for {num_shards} shards")
        check_unique_names(tables)
        self.shard_id = shard_id
        self.num_shards = num_shards
        self.partitioner = one_of(PARTITIONER.name, partitioner, PARTITIONERS)
        self.nan_policy = one_of(NAN_POLICY.name, nan_policy, NAN_POLICIES)
        self.specs = {t.name: t for t in tables}
        # None: rows in host numpy arrays; a torch device ("cuda", "cuda:1", "cpu"): rows and
        # optimizer state as torch tensors there.
        if device is not None:
            import torch  # only for rows on a torch device: a CPU shard starts without it

            dev = torch.device(device)
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(
                    f"shard {shard_id}: device {device!r} requested (angel.ps.gpus > 0) but "
                    f"CUDA is not available on this node"
                )
        self.device = device
        self.min_count = _count_option(ADMISSION_MIN_COUNT.name, admission_min_count)
        self.ttl = _count_option(EVICTION_TTL_UPDATES.name, eviction_ttl_updates)
        #: the threads a device tier's swap runs on (``angel.ps.swap.threads``; 0: from the
        #: node's cores): None for one
        self.swap_par = row_threads(swap_threads or auto_threads()) if device is None else None
        self.clocks: ClockTable = ClockTable(num_workers, staleness)
        #: Tables left out of backups: the device tiers' (their owner writes rows back outside
        #: the clocks, so a restart from a backup restarts the job from its checkpoint anyway:
        #: learners/worker/tier_link.py); set by the client (``mark_tiers``) or a restore.
        self.unbacked: set[str] = set()
        self.reset(self.clocks)

    def reset(self, clocks: ClockTable | None = None) -> None:
        """Back to freshly initialised tables and zero clocks (before a restore)."""
        if clocks is None:
            clocks = ClockTable(self.clocks.num_workers, self.clocks.staleness)
        self.tables = {t.name: self._new_table(t) for t in self.specs.values()}
        self.clocks = clocks
        # BSP with several workers: clock -> table -> list of (keys, grads); clock -> lr.
        self._pending: dict[int, dict[str, list[tuple[np.ndarray, np.ndarray]]]] = {}
        self._pending_lr: dict[int, Step] = {}
        self.skipped: dict[str, int] = {name: 0 for name in self.specs}
        self.updates = 0  # optimizer updates applied (per table push)

    def _new_table(self, spec: TableSpec) -> Table:
        part = Partitioner(spec, self.num_shards, self.partitioner)
        return new_table(spec, part, self.shard_id, self.device, self.min_count, self.ttl)

    # --- validation ----------------------------------------------------------------------------

    def _table(self, name: str) -> Table:
        return table_named(self.tables, name)

    def _validate(
        self, updates: Mapping[str, tuple[Any, Any]]
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Checked, deduplicated (keys strictly increasing, duplicate grads summed) updates;
        tables with non-finite gradients dropped (policy skip) or rejected (policy error)."""
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, (keys, grads) in updates.items():
            t = self._table(name)
            checked = check_push(t.spec, keys, grads, self.nan_policy, t.check_owned)
            if checked is None:
                self.skipped[name] += 1
                continue
            k, g = checked
            if not strictly_increasing(k):
                uniq, inv = dedup(k)
                g = segment_sum(inv, g, len(uniq), t.dtype)
                k = uniq
            out[name] = (k, g)
        return out

    def _check_pull(self, requests: Mapping[str, Any]) -> dict[str, np.ndarray | None]:
        """Checked keys of every table of a pull, before any is read."""
        out: dict[str, np.ndarray | None] = {}
        for name, keys in requests.items():
            t = self._table(name)
            if keys is None:
                out[name] = None
                continue
            k = check_keys(t.spec, keys)
            t.check_owned(k)
            out[name] = k
        return out

    # --- operations ----------------------------------------------------------------------------

    @property
    def keeps_pushes(self) -> bool:
        """Whether a push may be kept after :meth:`push` returns (BSP with several workers:
        until the last worker's push of its clock arrives)."""
        return bool(self.clocks.bsp and self.clocks.num_workers > 1)

    def push(
        self,
        worker: int,
        clock: int,
        updates: Mapping[str, tuple[Any, Any]],
        lr: Step,
        checked: bool = False,
    ) -> None:
        """Apply worker ``worker``'s gradients for ``clock`` (see :mod:`angelps.server.consistency`).
        ``lr``: the step size, or the per-table step sizes and momentum (:mod:`angelps.rates`).
        ``checked``: the client validated ``updates`` and ``lr`` already
        (:attr:`angelps.step_call.StepCall.checked`): they are used as they are.

        Under BSP the pushes of one clock are summed over the workers and applied as one
        optimizer update (with the step size of the first push of that clock) when the last
        worker's push arrives; under SSP/ASP each push is applied at once.
        """
        clocks = self.clocks
        clocks.check_worker(worker)
        if not clocks.can_push(worker, clock):
            raise ValueError(
                f"shard {self.shard_id}: worker {worker} pushed clock {clock} but its next "
                f"clock is {clocks.pushed[worker]}"
            )
        if not checked:
            lr = check_lr(lr)
            updates = self._validate(updates)
        if not clocks.bsp or clocks.num_workers == 1:
            for name, (k, g) in updates.items():
                self.tables[name].update(k, g, *rate_of(lr, name))
                self.updates += 1
            clocks.record_push(worker)
            if clocks.bsp:
                clocks.mark_applied()
            return
        bucket = self._pending.setdefault(clock, {})
        self._pending_lr.setdefault(clock, lr)
        for name, kg in updates.items():
            bucket.setdefault(name, []).append(kg)
        clocks.record_push(worker)
        while clocks.complete_clock():
            c = clocks.applied
            self._apply_merged(self._pending.pop(c, {}), self._pending_lr.pop(c, lr))
            clocks.mark_applied()

    def _apply_merged(
        self, bucket: Mapping[str, list[tuple[np.ndarray, np.ndarray]]], lr: Step
    ) -> None:
        for name, parts in bucket.items():
            t = self.tables[name]
            if len(parts) == 1:
                k, g = parts[0]
            else:
                keys = np.concatenate([p[0] for p in parts])
                grads = np.concatenate([p[1] for p in parts])
                k, inv = dedup(keys)
                g = segment_sum(inv, grads, len(k), t.dtype)
            t.update(k, g, *rate_of(lr, name))
            self.updates += 1

    def pull(self, requests: Mapping[str, Any], checked: bool = False) -> dict[str, np.ndarray]:
        """Rows of the requested keys, per table, in the order of the keys. ``None`` as the
        keys of a dense table means this shard's whole block. ``checked``: the client
        validated the keys already (int64, in range, held here)."""
        if not checked:
            requests = self._check_pull(requests)
        out: dict[str, np.ndarray] = {}
        for name, req in requests.items():
            t = self.tables[name]
            if req is None or strictly_increasing(req):
                out[name] = t.read(req)
            else:
                uniq, inv = dedup(req)
                out[name] = t.read(uniq)[inv]
        return out

    def export(self, name: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(keys, rows, optimizer state) of one table, keys sorted (checkpoints)."""
        return self._table(name).export()

    def assign(
        self, name: str, keys: np.ndarray, w: np.ndarray, state: Mapping[str, np.ndarray]
    ) -> None:
        """Overwrite rows and state of ``keys`` (checkpoint restore); keys must be owned here."""
        t = self._table(name)
        k = check_keys(t.spec, keys)
        t.check_owned(k)
        t.assign(k, w, state)

    def swap(
        self,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        """A worker's device tier (learners/worker/device_tier.py): write back whole rows
        (``writes``: table -> (unique keys, rows with their optimizer slots)), then return the
        whole rows of ``reads`` (table -> unique keys; rows missing are created). Everything
        is checked before any row is written."""
        return swap(self._table, writes, reads, self.swap_par)

    def evict(self) -> dict[str, int]:
        """Remove the rows that expiry (``angel.ps.eviction.ttl.updates``) says are stale, and
        forget admitted keys' counts; returns the rows removed per table. Run at every save."""
        return {name: t.evict() for name, t in self.tables.items()}

    def save(self, root: str) -> dict[str, Any]:
        """Write this shard's rows and optimizer state of every table under ``root`` (in
        chunks of rows: no second copy of a table), after expiry; returns its manifest info:
        rows per table, rows evicted now, clocks, and ``files`` (each file's SHA-256, rows and
        bytes, for the manifest)."""
        return self.image().save(root)

    def image(self, copy: bool = False, backup: bool = False) -> ShardImage:
        """What a save writes, after expiry: the tables themselves, or (``copy``) copies of
        them as they are now, for a write in the background while this shard goes on (one
        more copy of the rows in use, their state and keys, while the image is kept);
        ``backup``: without the device tiers' tables (:attr:`unbacked`)."""
        evicted = self.evict()
        tables = {n: t.freeze() if copy else t for n, t in self._kept(backup).items()}
        return ShardImage(self.shard_id, tables, evicted, self.clocks.to_dict())

    def snapshot_nbytes(self, backup: bool = False) -> int:
        """Bytes an :meth:`image` copy takes (before expiry)."""
        return sum(t.frozen_nbytes() for t in self._kept(backup).values())

    def _kept(self, backup: bool) -> dict[str, Table]:
        """Every table, or those a backup holds."""
        if not backup:
            return self.tables
        return {n: t for n, t in self.tables.items() if n not in self.unbacked}

    def load(self, root: str, manifest: Mapping[str, Any]) -> dict[str, int]:
        """Replace this shard's content with the rows that the current layout routes here
        from the checkpoint at ``root`` (saved with any number of shards); clocks restart at 0.
        Files are read in chunks of rows, each checked against the manifest
        (``checkpoint.iter_table_file``). Returns the rows restored per table. A backup's
        tables that it does not hold (its ``unbacked``) stay empty."""
        self.reset()
        self._pending.clear()
        self._pending_lr.clear()
        restored = {}
        for name, t in self.tables.items():
            n = 0
            if name in manifest.get("unbacked", ()):
                restored[name] = 0
                continue
            # (a table the workers held has one file per worker: its own count)
            saved_shards = table_shards(manifest, name)
            same_layout = (
                saved_shards == self.num_shards and manifest["partitioner"] == self.partitioner
            )
            sources = [self.shard_id] if same_layout else range(saved_shards)
            entries = {j: file_entry(manifest, name, j) for j in sources}
            if same_layout and entries[self.shard_id] is not None:
                t.reserve(int(entries[self.shard_id]["rows"]))  # type: ignore[index]
            for j in sources:
                path = table_file(root, name, j)
                for keys, w, state in iter_table_file(path, entries[j]):
                    n += self._load_chunk(t, path, keys, w, state, same_layout)
            restored[name] = n
        return restored

    def _load_chunk(
        self,
        t: Table,
        path: str,
        keys: np.ndarray,
        w: np.ndarray,
        state: dict[str, np.ndarray],
        same_layout: bool,
    ) -> int:
        """Restore one chunk of a table file (the rows this shard owns); rows restored."""
        if not same_layout:
            mine = t.part.owns(self.shard_id, keys)
            keys, w = keys[mine], w[mine]
            state = {k: v[mine] for k, v in state.items()}
        missing = set(t.slots) - set(state)
        if missing or w.shape[1:] != (t.spec.cols,):
            raise CheckpointError(
                f"checkpoint file {path} does not match table {t.spec.name!r} "
                f"(state slots {sorted(state)}, width {w.shape[1:]})"
            )
        if len(keys):
            t.assign(keys, w.astype(t.dtype, copy=False), state)
        return len(keys)

    def backup_meta(self) -> dict[str, Any]:
        """Clocks and counters for a backup. Under BSP, pushes buffered for an incomplete clock
        are not in the rows, so the backup records each worker at the last applied clock: the
        clients replay those pushes after a restart."""
        pushed = list(self.clocks.pushed)
        if self.clocks.bsp:
            pushed = [min(p, self.clocks.applied) for p in pushed]
        return {
            "num_shards": self.num_shards,
            "partitioner": self.partitioner,
            "clocks": {"pushed": pushed, "applied": self.clocks.applied},
            "updates": self.updates,
            "skipped": dict(self.skipped),
            "unbacked": sorted(self.unbacked),
        }

    def restore_state(self, meta: Mapping[str, Any]) -> None:
        """Clocks and counters from :meth:`backup_meta` (after :meth:`load`)."""
        self.clocks.pushed = [int(p) for p in meta["clocks"]["pushed"]]
        self.clocks.applied = int(meta["clocks"]["applied"])
        self.updates = int(meta.get("updates", 0))
        self.skipped.update({k: int(v) for k, v in meta.get("skipped", {}).items()})

    def stats(self) -> dict[str, Any]:
        """Rows held, memory (bytes per table and per row), updates applied, skipped
        (non-finite) pushes, rows evicted by expiry, admission counts, clocks."""
        tables = self.tables.values()
        nbytes = {t.spec.name: t.nbytes() for t in tables}
        return {
            "shard": self.shard_id,
            "rows": {t.spec.name: t.num_rows() for t in tables},
            "bytes": nbytes,
            "bytes_per_row": {
                t.spec.name: nbytes[t.spec.name] / max(t.num_rows(), 1) for t in tables
            },
            "index": {t.spec.name: t.index_kind for t in tables},
            "updates": self.updates,
            "skipped": dict(self.skipped),
            "evicted": {t.spec.name: t.evicted for t in tables},
            "admission": {
                t.spec.name: {
                    "dropped": t.admission.dropped,
                    "admitted": t.admission.admitted,
                    "pending": t.admission.pending(),
                }
                for t in tables
                if t.admission is not None
            },
            "clocks": self.clocks.to_dict(),
        }


class ShardImage:
    """What a save writes of one shard: its tables (live, or copies from
    :meth:`ParameterShard.image`), the rows expiry removed before, and the clocks."""

    def __init__(
        self,
        shard_id: int,
        tables: Mapping[str, Table | FrozenTable],
        evicted: Mapping[str, int],
        clocks: Mapping[str, Any],
    ) -> None:
        self.shard_id, self.tables = shard_id, tables
        self.evicted, self.clocks = dict(evicted), clocks
        #: Set from another thread to stop a save between two chunks (:class:`SaveStopped`).
        self.stop = threading.Event()

    def save(self, root: str) -> dict[str, Any]:
        """Write every table's file under ``root``; the manifest info of
        :meth:`ParameterShard.save`."""
        rows, files = {}, {}
        for name, t in self.tables.items():
            chunks = self._unless_stopped(t.export_chunks())
            entry = write_table_chunks(table_file(root, name, self.shard_id), chunks)
            rows[name] = entry["rows"]
            files[table_rel(name, self.shard_id)] = entry
        return {
            "shard": self.shard_id,
            "rows": rows,
            "evicted": self.evicted,
            "clocks": dict(self.clocks),
            "files": files,
        }

    def _unless_stopped(self, chunks: Iterator[Any]) -> Iterator[Any]:
        for chunk in chunks:
            if self.stop.is_set():
                raise SaveStopped(f"shard {self.shard_id}: save stopped")
            yield chunk


class SaveStopped(Exception):
    """A :class:`ShardImage` save stopped on request (the job is shutting down)."""


def _count_option(key: str, value: Any) -> int:
    """A whole number >= 0 for ``key`` (admission count, expiry), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{key}={value!r} is not valid: expected an integer >= 0 (0: off)")
    return int(value)


class NotReplayed(RuntimeError):
    """Raised to a save asked of a restarted shard before every worker replayed its pushes
    since the backup it restored: a checkpoint then would silently lack them."""

    def __init__(self, shard: int, workers: Sequence[int], clocks: Sequence[int]) -> None:
        at = ", ".join(f"worker {w} at clock {c}" for w, c in zip(workers, clocks, strict=True))
        super().__init__(
            f"parameter shard {shard} was restarted and restored its backup ({at}); those "
            f"workers have not replayed their pushes since, so a checkpoint now would lack them "
            f"and none is written: each worker's client replays them at its next step or "
            f"PSClient.catch_up(), then save again"
        )
        self.shard = shard
        self.workers = list(workers)
        self.clocks = list(clocks)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NotReplayed, (self.shard, self.workers, self.clocks))


class SaveLost(RuntimeError):
    """Raised to the client that waits for a checkpoint's files (``saved``) from a shard that
    Ray restarted after the save began: the process writing its part is gone."""

    def __init__(self, shard: int) -> None:
        super().__init__(
            f"parameter shard {shard} was restarted while it wrote its part of the checkpoint: "
            f"that checkpoint is lost (the one before stays)"
        )
        self.shard = shard

    def __reduce__(self) -> tuple[Any, ...]:
        return (SaveLost, (self.shard,))


class ShardRestarted(Exception):
    """Raised to a worker whose calls run ahead of a restarted shard: the shard restored its
    backup at ``clock`` for this worker, so the worker must replay its pushes from there."""

    def __init__(self, shard: int, worker: int, clock: int) -> None:
        super().__init__(
            f"shard {shard} was restarted and restored its backup at clock {clock} of worker "
            f"{worker}; the client replays its pushes from that clock"
        )
        self.shard = shard
        self.worker = worker
        self.clock = clock

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardRestarted, (self.shard, self.worker, self.clock))
