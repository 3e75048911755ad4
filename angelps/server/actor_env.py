"""What a shard actor reads of its process: the open-file limit that caps its data-plane
connections, and whether Ray restarted it."""

from __future__ import annotations

import warnings

import ray

try:
    import resource
except ImportError:  # not a Unix: no open-file limit to read
    resource = None  # type: ignore[assignment]

__all__ = ["connection_cap", "was_restarted"]


def connection_cap(wanted: int) -> int:
    """``angel.ps.max.connections``, but never above half this process's open-file limit
    (the shard needs the rest: Ray's own sockets, backup files)."""
    if resource is None:
        return wanted
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft // 2))


def was_restarted() -> bool:
    """True inside a Ray actor that Ray has restarted after a failure."""
    if not ray.is_initialized():  # plain use; ray.get_runtime_context() would start a Ray
        return False
    try:
        # Ray's own property reads its deprecated actor_id; the warning would reach the
        # driver's console through the actor's log.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # outside Ray (plain use): never a restart
        return False
