"""The training workers as one group of Ray actors: start them, call a method on all of them.

As Ray Train's ``worker_group``: :meth:`WorkerGroup.execute` calls one method on every actor and
waits for all the answers (in worker order); :meth:`WorkerGroup.execute_async` returns the
futures instead; :meth:`WorkerGroup.execute_single` asks one worker. The driver never loops over
actor handles itself.

Invariant: actor ``i`` is worker ``i`` of ``len(group)`` (its data part and its PS client
handle ``PSClient.for_worker(i)``).

Errors: a worker that cannot read its data part keeps the error and raises it from its first
call (``data_summary``; see :mod:`learners.worker.data_part`). Ray hands such an error back wrapped in a
``RayTaskError``; every call here raises a bad-input error (``DataError``, ``ConfigError``,
``FileNotFoundError``) as itself, chained to the wrapper (its text holds the worker's
traceback, shown with ANGELPS_DEBUG=1), so the command line prints its one line and exits 2.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from angelconf.config import ConfigError
from angelps import PSClient
from angelps.client.tier_swap import TierLost
from learners.data import DataError, DataOptions
from learners.job.loop_options import TrainPlan
from learners.job.placement import Layout
from learners.job.terminate import retake_sigterm
from learners.worker.actor import remote_worker_class

__all__ = ["WorkerDied", "WorkerGroup", "gather", "get"]

_BAD_INPUT = (DataError, ConfigError, FileNotFoundError)

# How long a failed call's peers are given to say they died: a worker killed mid-step resets
# its peers' collective (gloo: "Connection reset by peer") and that error can reach the driver
# before Ray's word that the killed one is dead; a death is a restart, an error is not.
DEATH_GRACE_S = 5.0


def get(refs: list[ray.ObjectRef], workers: Sequence[int] | None = None) -> list[Any]:
    """The answers of calls to ``workers`` (default 0, 1, ...), with a worker's bad-input
    error raised as itself (not wrapped); a dead worker raises ``WorkerDied`` at once
    (:func:`gather`)."""
    try:
        return gather(refs, workers)
    except RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, _BAD_INPUT):
            raise cause from e
        raise


class WorkerDied(RuntimeError):
    """Worker ``index``'s actor died (Ray's reason in the message)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"worker {index} died: {reason}")
        self.index = index
        self.reason = reason


def _reason(e: RayActorError) -> str:
    """Ray's one-line reason for an actor's death."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    why = next((ln for ln in lines if ln.startswith("The actor is dead")), "")
    if not why:
        why = lines[0] if lines else type(e).__name__
    return why.split(". ")[0].rstrip(".")


def gather(refs: Sequence[ray.ObjectRef], workers: Sequence[int] | None = None) -> list[Any]:
    """The answers of calls to the workers (``workers``: their indices, default 0, 1, ...), in
    order; a failed call raises as soon as it fails, not when every other call is done (the
    others may wait for the failed worker: its BSP push, its all-reduce). A dead worker raises
    :class:`WorkerDied` naming it."""
    pending = list(refs)
    who = list(workers) if workers is not None else list(range(len(pending)))
    index = dict(zip(pending, who, strict=True))
    while len(pending) > 1:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done)  # ready: returns at once, or raises the call's error
        except RayActorError as e:
            raise WorkerDied(index[done[0]], _reason(e)) from e
        except RayTaskError as e:
            _tier_lost(e, index[done[0]])
            if not isinstance(getattr(e, "cause", None), _BAD_INPUT):
                died = _died_meanwhile(pending, index)
                if died is not None:
                    raise died from e
            raise
    try:
        return list(ray.get(list(refs)))
    except RayActorError as e:
        raise WorkerDied(index[pending[0]] if pending else who[0], _reason(e)) from e
    except RayTaskError as e:
        _tier_lost(e, index[pending[0]] if pending else (who[0] if who else 0))
        raise


def _died_meanwhile(
    pending: list[ray.ObjectRef], index: dict[ray.ObjectRef, int]
) -> WorkerDied | None:
    """The first of the ``pending`` calls whose worker turns out dead within
    :data:`DEATH_GRACE_S` (as :class:`WorkerDied`), or None: returns as soon as every pending
    call has answered, so a call that failed on its own is raised without waiting long."""
    deadline = time.monotonic() + DEATH_GRACE_S
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not done:
            return None
        try:
            ray.get(done)
        except RayActorError as e:
            return WorkerDied(index[done[0]], _reason(e))
        except Exception:  # another failure: the first one is raised
            continue
    return None


def _tier_lost(e: RayTaskError, worker: int) -> None:
    """A device tier that lost its write-backs (a shard restarted from an older backup) is
    handled as a lost worker: the job restarts from its last checkpoint."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, TierLost):
        # (its first argument: Ray's str() of a remote error is the whole remote traceback)
        raise WorkerDied(worker, str(cause.args[0]) if cause.args else "TierLost") from e


class WorkerGroup:
    """``plan.workers`` :class:`~learners.worker.train_worker.TrainWorker` actors (each reads its data part),
    called by method name (:class:`learners.worker.actor.WorkerActor`: the driver loads no torch)."""

    def __init__(
        self,
        plan: TrainPlan,
        data: DataOptions,
        read_data: bool = True,
        layout: Layout | None = None,
    ) -> None:
        """``layout``: where each worker goes (custom resources, placement group bundle)."""
        retake_sigterm()  # Ray is up and took SIGTERM over: a kill unwinds the driver again
        cls = remote_worker_class(plan.worker_cpus, plan.worker_gpus)
        n = plan.workers
        self.layout = layout
        # Every actor is created before any answer is awaited: they start in parallel.
        self.actors: list[Any] = [
            cls.options(**(layout.worker(i) if layout else {})).remote(plan, data, i, n, read_data)
            for i in range(n)
        ]

    def __len__(self) -> int:
        return len(self.actors)

    def execute_async(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Call ``method`` on every worker; the futures of the answers, in worker order."""
        return [a.call.remote(method, *args, **kwargs) for a in self.actors]

    def execute(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker and wait: the answers, in worker order."""
        return get(self.execute_async(method, *args, **kwargs))

    def execute_single(self, index: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on worker ``index`` and wait for its answer."""
        return get([self.actors[index].call.remote(method, *args, **kwargs)], [index])[0]

    def execute_some(self, indices: Sequence[int], method: str, *args: Any) -> list[Any]:
        """Call ``method`` on the workers ``indices`` and wait: their answers, in that order."""
        return get([self.actors[i].call.remote(method, *args) for i in indices], list(indices))

    def execute_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Call ``method`` on worker ``i`` with ``args[i]`` (one tuple per worker) and wait."""
        if len(args) != len(self.actors):
            raise ValueError(f"{method}: {len(args)} argument tuples for {len(self)} workers")
        return get([a.call.remote(method, *xs) for a, xs in zip(self.actors, args, strict=True)])

    def attach_ps(self, ps: PSClient) -> None:
        """Hand worker ``i`` its PS client handle ``ps.for_worker(i)`` (fresh clocks, and the
        shards' process ids: a device tier's check that none restarted under it)."""
        ps.learn_pids()
        self.execute_each("set_ps", [(ps.for_worker(i),) for i in range(len(self))])

    def join_process_group(self) -> None:
        """Join the workers' gloo process group (for the dense all-reduce), hosted by worker 0."""
        if len(self) > 1:
            addr, port = self.execute_single(0, "free_port")
            self.execute("setup_dist", addr, port)

    def shutdown(self) -> None:
        """Leave the process group and stop every actor (errors of dead actors are ignored)."""
        done = [a.call.remote("shutdown") for a in self.actors]
        # Bounded: a worker still waiting for a dead peer (BSP, all-reduce) is killed below;
        # ray.wait does not raise, so a dead actor's error hides nothing.
        ray.wait(done, num_returns=len(done), timeout=10)
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.actors = []
