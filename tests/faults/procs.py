"""Processes of the fault tests: the tree below a process (this test's own Ray, or the private Ray
of a job the test started), found through /proc: never another process on the machine."""

from __future__ import annotations

import os
import time

__all__ = ["alive", "descendants", "identity"]


def _parents() -> dict[int, int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parent


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    parent = _parents()
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks): a process, not a reused number; None once it is gone
    (a zombie counts as gone: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):
        return None
    return pid, int(fields[19])


def alive(procs: list[tuple[int, int]], wait_s: float = 0.0) -> list[tuple[int, int]]:
    """Those of ``procs`` (from :func:`identity`) still running, after waiting up to ``wait_s``
    seconds for them to end."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [p for p in procs if identity(p[0]) == p]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
