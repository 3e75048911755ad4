"""How a worker gets its rows: the prefetch depth and the worker-side row cache (keys and
:class:`FeedOptions`).

A key module: standard library and ``angelconf.config`` only, so config-only verbs check these keys
without torch or Ray. The cache itself is learners/worker/cache.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from angelconf.config import ConfigError, Key, at_least
from angelconf.options import key_field, keyed, read_keys

__all__ = ["KEYS", "FeedOptions"]

_STALENESS = "angel.staleness"  # declared in angelps.options

PREFETCH_DEPTH = Key(
    "angel.worker.prefetch.depth",
    "int",
    1,
    "Batches whose rows a worker keeps in flight while it computes: 1 (BSP: the next batch's "
    "rows come with this update's push); under SSP at most angel.staleness.",
    check=at_least(1, "an integer"),
)
CACHE_ENABLE = Key(
    "angel.worker.cache.enable",
    "bool",
    False,
    "Keep hot rows and their clocks on each worker (HET): BSP serves only rows proven current, "
    "SSP rows at most angel.staleness clocks old (docs/ps.md).",
)
CACHE_CAPACITY = Key(
    "angel.worker.cache.capacity",
    "str",
    "262144",
    "Rows the worker cache holds: a row count (262144), or bytes with a unit (64MB, 1GiB); "
    "at most the worker's memory.",
)
CACHE_ADMIT = Key(
    "angel.worker.cache.admit.frequency",
    "int",
    2,
    "A row enters the worker cache on its n-th sighting (frequency admission).",
    check=at_least(1, "an integer"),
)
DEDUP = Key(
    "angel.worker.dedup",
    "str",
    "auto",
    "Where a batch's ids are deduplicated when the workers hold every sparse table "
    "(angel.sparse.placement=worker, 1 worker): host (numpy), device (torch.unique where the "
    "rows are, so ids never come back to the host) or auto (device on a CUDA worker, host on "
    "the CPU, where numpy is faster). Both give the same rows and slots.",
    choices=("auto", "host", "device"),
)
PROFILE_UPDATES = Key(
    "angel.worker.profile.updates",
    "int",
    0,
    "Profile this many optimizer updates of each worker's training thread with torch's "
    "profiler (0: none): operators, their CPU time and the CUDA runtime's calls per update, "
    "written to angel.log.path as profile-worker<k>.txt and .json (learners/worker/step_profile.py).",
    check=at_least(0, "an integer"),
)
PROFILE_SKIP = Key(
    "angel.worker.profile.skip",
    "int",
    50,
    "Updates of each worker before the profile of angel.worker.profile.updates starts (its "
    "first updates warm the allocators and caches).",
    check=at_least(0, "an integer"),
)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_MAX_CACHE_ROWS = 2**31 - 1  # slots are int32

KEYS = [
    PREFETCH_DEPTH,
    CACHE_ENABLE,
    CACHE_CAPACITY,
    CACHE_ADMIT,
    DEDUP,
    PROFILE_UPDATES,
    PROFILE_SKIP,
]


@dataclass(frozen=True)
class FeedOptions:
    """How a worker gets its rows: prefetch depth and the worker cache (learners/worker/cache.py)."""

    prefetch_depth: int = field(metadata=keyed(PREFETCH_DEPTH))
    staleness: int
    cache: bool = field(metadata=keyed(CACHE_ENABLE))
    #: the cache's capacity: rows, or bytes when ``capacity_bytes``
    capacity: int
    capacity_bytes: bool
    admit: int = field(metadata=keyed(CACHE_ADMIT))
    #: where held tables' ids are deduplicated: auto, host or device (DEDUP)
    dedup: str = key_field(DEDUP)
    #: updates of the training thread profiled (0: none), after the first ``profile_skip``
    profile_updates: int = key_field(PROFILE_UPDATES)
    profile_skip: int = key_field(PROFILE_SKIP)

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> FeedOptions:
        """Checked against each other: a depth above the staleness under SSP (or above 1
        under BSP) and a capacity of 0, below, or above the machine's memory are errors."""
        staleness = int(conf.get(_STALENESS) or 0)
        values = read_keys(cls, conf)
        depth = values["prefetch_depth"]
        if staleness == 0 and depth > 1:
            raise ConfigError(
                f"{PREFETCH_DEPTH.name}={depth} needs bounded staleness: under BSP "
                f"({_STALENESS}=0) the next batch's rows depend on this update, so the depth "
                f"must be 1 (or set {_STALENESS} >= {depth})"
            )
        if staleness > 0 and depth > staleness:
            raise ConfigError(
                f"{PREFETCH_DEPTH.name}={depth} is above {_STALENESS}={staleness}: under SSP a "
                f"worker may run at most the staleness ahead; valid: 1 .. {staleness}"
            )
        n, in_bytes = _capacity(str(CACHE_CAPACITY.read(conf)))
        return cls(**values, staleness=staleness, capacity=n, capacity_bytes=in_bytes)


def _capacity(text: str) -> tuple[int, bool]:
    """``angel.worker.cache.capacity``: (rows, False) or (bytes, True)."""
    t = text.strip().upper().replace(" ", "")
    unit = next((u for u in sorted(_UNITS, key=len, reverse=True) if t.endswith(u)), "")
    num = t[: len(t) - len(unit)] if unit else t
    valid = "a row count (262144) or bytes with a unit (64MB, 512MiB, 1GB)"
    try:
        value = float(num) * _UNITS[unit] if unit else int(num)
    except ValueError:
        raise ConfigError(f"{CACHE_CAPACITY.name}={text} is not valid: expected {valid}") from None
    if value <= 0:
        raise ConfigError(f"{CACHE_CAPACITY.name}={text} is not valid: expected {valid} > 0")
    if not unit and value > _MAX_CACHE_ROWS:
        raise ConfigError(
            f"{CACHE_CAPACITY.name}={text} is absurd: at most {_MAX_CACHE_ROWS} rows (or give bytes)"
        )
    memory = _host_memory()
    if unit and memory and value > memory:
        raise ConfigError(
            f"{CACHE_CAPACITY.name}={text} is larger than this machine's memory "
            f"({memory / 2**30:.1f} GiB); valid: {valid} below that"
        )
    return int(value), bool(unit)


def _host_memory() -> int:
    """Bytes of physical memory (0 where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0
