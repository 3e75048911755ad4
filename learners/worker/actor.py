"""The worker's Ray actor as the driver sees it: a shell that loads no torch.

:class:`learners.worker.group.WorkerGroup` creates W of these and calls every
:class:`~learners.worker.train_worker.TrainWorker` method by name through :meth:`WorkerActor.call`. The
shell builds the real worker in the actor's own process, the only place that imports torch:
the driver of a job never loads it, which leaves the 1.5-3 s of CPU that import costs to the
workers starting beside it (tests/test_layering.py pins it).
"""

from __future__ import annotations

from typing import Any

import ray

from angelps.malloc import keep_freed_memory

__all__ = ["WorkerActor", "remote_worker_class"]


class WorkerActor:
    """One worker actor: ``TrainWorker(*args)`` built in the actor's process."""

    def __init__(self, *args: Any) -> None:
        from learners.worker.train_worker import TrainWorker  # torch: in the actor's process only

        keep_freed_memory()  # (its steps free megabytes each: angelps/malloc.py)
        self._worker = TrainWorker(*args)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``TrainWorker.<method>(*args, **kwargs)``: its answer, or its error as raised."""
        return getattr(self._worker, method)(*args, **kwargs)


def remote_worker_class(num_cpus: float = 1, num_gpus: float = 0) -> Any:
    """:class:`WorkerActor` as a Ray actor class with the worker's resources."""
    # No runtime_env: an actor with one of its own cannot use the worker processes Ray starts
    # in advance (a fresh process, seconds of start-up). Threads are set inside the actor
    # (torch.set_num_threads in TrainWorker.__init__; Ray sets OMP_NUM_THREADS to the CPUs
    # of an actor when unset).
    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(WorkerActor)
