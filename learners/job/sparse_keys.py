"""Where sparse tables live (``angel.sparse.placement``): its keys and :class:`SparseOptions`.

A key module: it imports only the standard library and ``angelconf.config``. The placement of a
job's tables is decided by learners/job/sparse_placement.py; the tables the workers hold are
learners/worker/held_tables.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from angelconf.config import ConfigError, Key, format_value, interval, positive
from angelconf.options import key_field, read_keys

__all__ = ["KEYS", "SparseOptions", "unused_placement_keys"]

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

TABLE_CAPACITY = Key(
    "angel.worker.table.capacity",
    "str",
    "auto",
    "angel.sparse.placement=worker: how much of its share of each sparse table a worker keeps "
    "on its device; the rest lives on the shard actors (host memory) and is fetched when a "
    "batch reads it (a device tier, learners/worker/device_tier.py; training is exact "
    "whatever the size). A number of rows per table (e.g. 1000000), a size for all the tables "
    "together (e.g. 512MB, 2GB), or auto: the tables are held whole when their share fits "
    "angel.worker.table.memory.fraction of the device's free memory, else tiered in it. "
    "Tables of unknown id range are always tiered.",
    check=lambda v: None if _capacity(str(v)) is not None else _CAPACITY_FORMS,
)
TABLE_MEMORY_FRACTION = Key(
    "angel.worker.table.memory.fraction",
    "float",
    0.5,
    "angel.worker.table.capacity=auto: the share of a worker's free device memory (free host "
    "memory split between the workers, on CPU workers) that the tables it holds may take.",
    check=interval(0.0, 1.0, low_open=True),
)
TABLE_EVICTION = Key(
    "angel.worker.table.eviction",
    "str",
    "lru",
    "A device tier that is full evicts the rows read longest ago (lru) or the rows whose ids "
    "were seen least often (lfu); rows of the update in progress are never evicted.",
    choices=("lru", "lfu"),
)
TABLE_ADMIT = Key(
    "angel.worker.table.admit.count",
    "int",
    1,
    "A device tier keeps a missed row in preference to others only once its id was seen this "
    "many times (a hashed count); rows below it are still read and updated on the device, "
    "and are the first evicted. 1: every row is kept alike.",
    check=positive,
)

KEYS = [
    SPARSE_PLACEMENT,
    SPARSE_WORKER_MEMORY,
    TABLE_CAPACITY,
    TABLE_MEMORY_FRACTION,
    TABLE_EVICTION,
    TABLE_ADMIT,
]

_CAPACITY_FORMS = "auto, a number of rows (e.g. 1000000) or a size (e.g. 512MB, 2GB)"
_UNITS = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}


def _capacity(text: str) -> tuple[str, int] | None:
    """``angel.worker.table.capacity`` as ("auto", 0), ("rows", n) or ("bytes", n); None when
    it is none of them."""
    t = text.strip().lower().replace(" ", "").replace("ib", "b")
    if t == "auto":
        return ("auto", 0)
    if t.isdigit():
        return ("rows", int(t)) if int(t) > 0 else None
    for unit in sorted(_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            num = t[: -len(unit)]
            try:
                n = float(num)
            except ValueError:
                return None
            return ("bytes", int(n * _UNITS[unit])) if n > 0 else None
    return None


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
    #: angel.worker.table.capacity: ("auto", 0), ("rows", n) or ("bytes", n)
    capacity: tuple[str, int] = key_field(TABLE_CAPACITY, convert=lambda v: _capacity(str(v)))
    #: auto: the share of the device's free memory the held tables may take
    fraction: float = key_field(TABLE_MEMORY_FRACTION)
    #: a full device tier's eviction (lru, lfu) and its admission count
    eviction: str = key_field(TABLE_EVICTION)
    admit: int = key_field(TABLE_ADMIT)

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


def unused_placement_keys(conf: Mapping[str, Any]) -> list[str]:
    """One line for each key of the tables on the workers set in a job whose sparse tables
    stay on the shards (``angel.sparse.placement=ps``, the default): a device tier's budget
    set without the placement that makes one trains with every row on the shards, unsaid
    otherwise. ``angel.sparse.worker.memory.mb`` is ``auto``'s alone."""
    is_set, source = getattr(conf, "is_set", None), getattr(conf, "source", None)
    if is_set is None or source is None:
        return []
    placement = str(conf.get(SPARSE_PLACEMENT.name, SPARSE_PLACEMENT.default))
    keys = [TABLE_CAPACITY, TABLE_MEMORY_FRACTION, TABLE_EVICTION, TABLE_ADMIT]
    conflict = _worker_conflict(conf) if placement == "auto" else ""
    if placement == "ps" or conflict:
        keys.insert(0, SPARSE_WORKER_MEMORY)
    elif placement == "worker":
        keys = [SPARSE_WORKER_MEMORY]
    else:
        return []
    out = []
    for key in keys:
        if key.name in conf and is_set(key.name):
            out.append(
                f"{key.name}={format_value(conf[key.name])} ({source(key.name)}): set but not used with "
                f"{SPARSE_PLACEMENT.name}={placement}"
                + (
                    " (the sparse tables stay on the shards): set angel.sparse.placement=worker "
                    "or auto for tables on the workers"
                    if placement == "ps"
                    # (auto keeps them on the shards where a key needs them there: SSP, ...)
                    else f" (it keeps the sparse tables on the shards: {conflict})"
                    if conflict
                    else " (it sizes auto's choice only)"
                )
            )
    return out
