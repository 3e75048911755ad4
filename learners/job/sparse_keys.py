"""Where sparse tables live (``angel.sparse.placement``): its keys and :class:`SparseOptions`.

A key module: it imports only the standard library and ``angelconf.config``. The placement of a
job's tables is decided by learners/job/sparse_placement.py; the tables the workers hold are
learners/worker/held_tables.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from angelconf.config import ConfigError, Key, positive
from angelconf.options import key_field, read_keys

__all__ = ["KEYS", "SparseOptions"]

SPARSE_PLACEMENT = Key(
    "angel.sparse.placement",
    "str",
    "ps",
    "Where sparse tables (weights, embeddings) live: ps (shard actors), worker (each worker "
    "holds the rows its table partitioner assigns it, on its own device, and updates them "
    "with the table's optimizer; rows and gradients are exchanged between workers with "
    "all-to-all collectives; BSP only) or auto (worker when the job is BSP and the tables fit "
    "angel.sparse.worker.memory.mb, else ps). Dense tables (biases) stay on the shards.",
    choices=("ps", "worker", "auto"),
)
SPARSE_WORKER_MEMORY = Key(
    "angel.sparse.worker.memory.mb",
    "float",
    2048.0,
    "angel.sparse.placement=auto: the MiB of each worker's memory (GPU memory on a CUDA "
    "worker) that the sparse tables it would hold (rows and optimizer state) may take; "
    "tables above it stay on the shards.",
    check=positive,
)

KEYS = [SPARSE_PLACEMENT, SPARSE_WORKER_MEMORY]

#: Keys that other key modules declare, refused with angel.sparse.placement=worker.
_WORKER_REFUSES = (
    ("angel.staleness", "tables on the workers are updated once per step by their owners (BSP)"),
    ("angel.worker.cache.enable", "a worker reads the rows it holds directly; no cache"),
    ("angel.ps.admission.min.count", "admission is a shard feature (not on the workers)"),
    ("angel.ps.eviction.ttl.updates", "expiry is a shard feature (not on the workers)"),
)


def _worker_conflict(conf: Mapping[str, Any]) -> str:
    """Why sparse tables cannot be held by the workers in this job ("" when they can): the
    first key of :data:`_WORKER_REFUSES` set to a value that needs the shards."""
    for name, why in _WORKER_REFUSES:
        v = conf.get(name)
        if name == "angel.worker.cache.enable":
            on = bool(v)
        elif name == "angel.ps.admission.min.count":
            on = int(v or 0) > 1
        else:
            on = int(v or 0) != 0
        if on:
            return f"{name}={str(v).lower() if isinstance(v, bool) else v}: {why}"
    return ""


def _mib_to_bytes(mib: float) -> float:
    return float(mib) * (1 << 20)


@dataclass(frozen=True)
class SparseOptions:
    """angel.sparse.placement, auto's memory budget, and what keeps tables off the workers."""

    #: ps, worker or auto
    placement: str = key_field(SPARSE_PLACEMENT)
    #: auto: bytes of a worker's share of the held tables
    budget: float = key_field(SPARSE_WORKER_MEMORY, convert=_mib_to_bytes)
    #: why the workers cannot hold sparse tables in this job ("" when they can): auto says it
    conflict: str = ""

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> SparseOptions:
        """The options of a job; a ConfigError for ``worker`` with a key that needs shards."""
        values = read_keys(cls, conf)
        value = values["placement"]
        conflict = _worker_conflict(conf)
        if value == "worker" and conflict:
            name = conflict.split("=", 1)[0]
            raise ConfigError(
                f"{SPARSE_PLACEMENT.name}=worker cannot run with {conflict}; set {name} to its "
                f"default, or {SPARSE_PLACEMENT.name}=ps (or auto)"
            )
        return cls(**values, conflict=conflict)
