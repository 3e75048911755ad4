"""How the C heap of a long-running process (a shard, a worker) keeps the memory it frees.

Each step allocates and frees megabytes of temporaries (decoded bodies, gathers, optimizer
updates, placed rows). With glibc's defaults, a block above the (adaptive) mmap threshold is
mapped and unmapped each time and the heap's top is returned to the system as soon as it is
free, so every step faults the same pages in again: 400-1,400 minor faults a shard call of
55,000 rows, 250 a device tier's step on the worker (bench/shared_memory.py, and
``/proc/<pid>/stat`` during ``bench/train_throughput.py``). :func:`keep_freed_memory` has
malloc serve blocks below 32 MiB from the heap and keep up to 256 MiB free at its top.
:func:`available_bytes` says how much more memory the machine can give (a shard's background
backup asks before it copies its rows; a worker sizes its device tier on the host by it).
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["available_bytes", "keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Tune glibc's malloc for this process as above (before its steps); whether it could
    (False off Linux, or with another C library)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    # (each call fixes the threshold it sets: glibc stops adapting them)
    ok = mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # its largest: blocks below come from the heap
    ok &= mallopt(_M_TRIM_THRESHOLD, 256 << 20)
    ok &= mallopt(_M_TOP_PAD, 64 << 20)  # asked of the system at a time as the heap grows
    return bool(ok)


def available_bytes() -> int:
    """The host memory available to new allocations: ``MemAvailable`` in /proc/meminfo (free
    memory plus the caches the kernel can drop), or the free pages where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
