"""Failover of a training job, on by default: where its shard backups go, and what happens when
one of its workers dies.

A dead **shard** is angelps's business (:mod:`angelps.client.recovery`): Ray restarts it, it restores
its latest backup and the workers' clients replay the pushes made since. The learner only
chooses where the backups go: without ``angel.ps.backup.path``, a private directory (0700) under
the job's log directory, ``<angel.log.path>/ps-backup/<job>-<id>/``, removed at shutdown
(:func:`backup_options`, :func:`remove_backup_root`); with a log path on object storage, under
its local staging root. ``angel.ps.backup.path`` may be a URL (:mod:`angelps.checkpoint.remote_backup`):
the backups then survive a lost node without a shared file system.

A dead **worker** (its process killed, crashed, or its node lost) restarts the job from its
last checkpoint: every worker and shard is stopped and started again (each worker reloads its
data part), the checkpoint in ``angel.save.model.path`` (by default the run folder's
``<run>/model``) is restored exactly as ``--resume`` does, and training goes on from the epoch
after it; without a checkpoint yet (``angel.save.model=false``, or a death during the first
epoch) it starts again from the beginning (from
``angel.load.model.path`` when set). Why not have only the dead worker rejoin at the current
clock: under BSP the dead worker may have pushed the current clock to some shards and not to
others (so some shards have applied the update and the gradient it needs is gone), its
prefetched rows and RNG stream are lost, and the dense layers' process group must be rebuilt
anyway; a restart from the checkpoint is exact (BSP, same seed: the job ends with the weights
and metrics of an uninterrupted run) and costs at most the epoch in progress.

Invariant: a restart is said on the console (which worker died, why, where the job restarts
from), and there are at most ``angel.worker.max.restarts`` of them in a job; the next death
fails the job with one line saying so. A death in an attempt in which Ray killed any of the
job's processes because their node ran low on memory is not restarted: the job stops at once
with :class:`learners.job.memory_kills.NodeOutOfMemory`, which says what was killed and what to
change (a restart would run the same steps into the same limit).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray

from angelconf.options import keyed, read_keys
from angelps import PSOptions
from angelps.checkpoint import files as checkpoint
from angelps.server.launch import NAMESPACE, actor_name
from learners.data.problems import printable
from learners.job import saved_model
from learners.job.loop_options import MAX_WORKER_RESTARTS
from learners.job.memory_kills import memory_kills, now_ms, out_of_memory
from learners.runs.folders import BACKUP_DIR, log_root
from learners.worker.group import WorkerDied

__all__ = [
    "BACKUP_DIR",
    "WorkerFailover",
    "backup_options",
    "kill_workers",
    "remove_backup_root",
]


def backup_options(ps: PSOptions, log_dir: str) -> PSOptions:
    """``ps`` with its backups under the job's own path: ``<log_dir>/ps-backup`` when backups
    are on and ``angel.ps.backup.path`` is not set (an absolute path: shards resolve it in
    their own working directory)."""
    if ps.backup_interval <= 0 or ps.backup_path:
        return ps
    # A log path on object storage: the backups go under its local staging root instead.
    return replace(ps, backup_path=str(Path(log_root(log_dir)).resolve() / BACKUP_DIR))


def remove_backup_root(ps: PSOptions, log_dir: str) -> None:
    """Remove ``<log_dir>/ps-backup`` once empty (each launch already removed its own
    directory at shutdown); kept when it still holds something, e.g. another job's backups."""
    if ps.backup_path == str(Path(log_root(log_dir)).resolve() / BACKUP_DIR):
        try:
            os.rmdir(ps.backup_path)
        except OSError:
            pass


@dataclass(frozen=True)
class FailoverOptions:
    """How many times a job may restart itself after a worker died."""

    max_restarts: int = field(metadata=keyed(MAX_WORKER_RESTARTS))

    @classmethod
    def from_config(cls, conf: Any) -> FailoverOptions:
        """angel.worker.max.restarts of ``conf`` (a Config or a mapping)."""
        return cls(**read_keys(cls, conf))


class WorkerFailover:
    """The restarts of one training job after worker deaths (at most ``max_restarts``)."""

    def __init__(self, options: FailoverOptions, save_path: str | None) -> None:
        self.options = options
        self.save_path = save_path
        self.restarts = 0
        self.since_ms = now_ms()  # (the attempt's start: the memory kills that count)

    def restart(self, loop: Any, died: WorkerDied, log: Any, progress: Any) -> Any:
        """Stop every worker and shard of the training ``loop``'s actors, start them again and
        restore the last checkpoint (or start over); the new progress (``loop.prepare``'s),
        keeping the training time and samples counted so far. Raises ``died`` (with the count) when the
        restarts ``angel.worker.max.restarts`` allows are used up."""
        limit = self.options.max_restarts
        kills = memory_kills(self.since_ms)
        if kills:
            kill_workers(loop.actors)
            what = f"worker {died.index} died ({died.reason})"
            raise out_of_memory(what, kills, names(loop.actors), self.save_path) from died
        if self.restarts >= limit:
            kill_workers(loop.actors)  # the live ones may wait for the dead one: do not ask them
            raise WorkerDied(
                died.index,
                f"{died.reason}; the job has restarted {self.restarts} time(s), as many as "
                f"{MAX_WORKER_RESTARTS.name}={limit} allows",
            ) from died
        self.restarts += 1
        resume = self._checkpoint()
        where = (
            f"from the checkpoint {self.save_path} (epoch {resume} done)"
            if resume is not None
            else "from the beginning (no checkpoint yet"
            + ("" if self.save_path else ": angel.save.model=false saves none")
            + ")"
        )
        print(
            printable(
                f"angelps: warning: worker {died.index} died ({died.reason}); restarting the "
                f"workers and parameter shards {where}, restart {self.restarts} of "
                f"{MAX_WORKER_RESTARTS.name}={limit}"
            ),
            file=sys.stderr,
            flush=True,
        )
        _stop(loop.actors)
        self.since_ms = now_ms()
        fresh = loop.prepare(resume is not None, log)
        fresh.samples, fresh.train_s = progress.samples, progress.train_s
        return fresh

    def _checkpoint(self) -> int | None:
        """Epochs done by the checkpoint a restart resumes from (None: no checkpoint)."""
        if not self.save_path:
            return None
        try:
            checkpoint.resolve(self.save_path, fallback=True)
        except checkpoint.CheckpointError:
            return None  # none written yet (a death in the first epoch)
        # Every file checked; a damaged latest falls back to <path>.prev, as --resume does.
        return int(saved_model.resume_point(self.save_path)["learner"]["next_epoch"])


def names(actors: Any) -> dict[int, str]:
    """The job's parameter shards by the pid their client last knew (a killed process named)."""
    ps = getattr(actors, "ps", None)
    pids = getattr(ps, "shard_pids", None) or {}
    return {pid: f"parameter shard {shard}" for shard, pid in pids.items()}


def kill_workers(actors: Any) -> None:
    """Kill every worker actor of the job's ``actors`` (learners.job.actors.JobActors) at once."""
    workers, actors.workers = actors.workers, None
    if workers is not None:
        for a in workers.actors:
            ray.kill(a)
        workers.actors = []


def _stop(actors: Any) -> None:
    """Kill the workers (without asking them: the live ones may be blocked waiting for the dead
    one) and the shards, and wait until the shards' names are free for the new launch."""
    kill_workers(actors)
    ps, actors.ps = actors.ps, None
    if ps is None:
        return
    job, n = actors.ps_options.job, ps.num_shards
    ps.shutdown()
    deadline = time.monotonic() + 60.0
    for i in range(n):
        while time.monotonic() < deadline:
            try:
                ray.get_actor(actor_name(job, i), namespace=NAMESPACE)
            except ValueError:
                break  # the name is free
            time.sleep(0.1)
