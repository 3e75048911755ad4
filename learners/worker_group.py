"""The training workers as one group of Ray actors: start them, call a method on all of them.

As Ray Train's ``worker_group``: :meth:`WorkerGroup.execute` calls one method on every actor and
waits for all the answers (in worker order); :meth:`WorkerGroup.execute_async` returns the
futures instead; :meth:`WorkerGroup.execute_single` asks one worker. The driver never loops over
actor handles itself.

Invariant: actor ``i`` is worker ``i`` of ``len(group)`` (its data part and its PS client
handle ``PSClient.for_worker(i)``).

Errors: a worker that cannot read its data part keeps the error and raises it from its first
call (``data_summary``; see :mod:`learners.data_part`). Ray hands such an error back wrapped in a
``RayTaskError``; every call here raises a bad-input error (``DataError``, ``ConfigError``,
``FileNotFoundError``) as itself, chained to the wrapper (its text holds the worker's
traceback, shown with ANGELPS_DEBUG=1), so the command line prints its one line and exits 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayTaskError

from angelconf.config import ConfigError
from angelps import PSClient
from learners.data import DataError, DataOptions
from learners.failover import gather
from learners.placement import Layout
from learners.plan import TrainPlan
from learners.terminate import retake_sigterm
from learners.worker_actor import remote_worker_class

__all__ = ["WorkerGroup", "get"]

_BAD_INPUT = (DataError, ConfigError, FileNotFoundError)


def get(refs: list[ray.ObjectRef], workers: Sequence[int] | None = None) -> list[Any]:
    """The answers of calls to ``workers`` (default 0, 1, ...), with a worker's bad-input
    error raised as itself (not wrapped); a dead worker raises ``WorkerDied`` at once
    (:func:`learners.failover.gather`)."""
    try:
        return gather(refs, workers)
    except RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, _BAD_INPUT):
            raise cause from e
        raise


class WorkerGroup:
    """``plan.workers`` :class:`~learners.worker.TrainWorker` actors (each reads its data part),
    called by method name (:class:`learners.worker_actor.WorkerActor`: the driver loads no torch)."""

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

    def execute_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Call ``method`` on worker ``i`` with ``args[i]`` (one tuple per worker) and wait."""
        if len(args) != len(self.actors):
            raise ValueError(f"{method}: {len(args)} argument tuples for {len(self)} workers")
        return get([a.call.remote(method, *xs) for a, xs in zip(self.actors, args, strict=True)])

    def attach_ps(self, ps: PSClient) -> None:
        """Hand worker ``i`` its PS client handle ``ps.for_worker(i)`` (fresh clocks)."""
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
