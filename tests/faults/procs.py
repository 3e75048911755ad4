"""Processes of the fault tests: the tree below a process (this test's own Ray, or the private Ray
of a job the test started), or the session a job was started in, found through /proc: never
another process on the machine."""

from __future__ import annotations

import ipaddress
import os
import time

__all__ = ["alive", "descendants", "identity", "listening", "session"]


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) of ``/proc/<pid>/stat``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # pid (comm) state ppid pgrp session ...: the name may hold spaces and parentheses.
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def _all() -> dict[int, tuple[str, list[str]]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            found[int(entry)] = stat
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    parent = {p: int(fields[1]) for p, (_, fields) in _all().items()}
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def session(sid: int, name: str = "") -> list[int]:
    """The processes of session ``sid`` (those named ``name`` when given): what a job started
    with ``start_new_session`` left, orphans too (their parent is no longer the job)."""
    return [
        p
        for p, (comm, fields) in _all().items()
        if int(fields[3]) == sid and (not name or comm == name)
    ]


def identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks): a process, not a reused number; None once it is gone
    (a zombie counts as gone: it runs nothing)."""
    stat = _stat(pid)
    if stat is None or stat[1][0] in ("Z", "X"):
        return None
    return pid, int(stat[1][19])


def alive(procs: list[tuple[int, int]], wait_s: float = 0.0) -> list[tuple[int, int]]:
    """Those of ``procs`` (from :func:`identity`) still running, after waiting up to ``wait_s``
    seconds for them to end."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [p for p in procs if identity(p[0]) == p]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def _listening_inodes() -> dict[str, tuple[str, int]]:
    """inode -> (address, port) of every TCP socket in LISTEN state (IPv4 and IPv6)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A":  # TCP_LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            # The kernel prints each 32-bit word in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.ip_address(words)
            found[inode] = (str(addr), int(hexport, 16))
    return found


def listening(pids: list[int]) -> list[tuple[int, str, str, int]]:
    """(pid, command name, address, port) of every TCP socket that ``pids`` listen on."""
    inodes = _listening_inodes()
    out = []
    for pid in pids:
        stat = _stat(pid)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and (hit := inodes.get(target[8:-1])):
                out.append((pid, stat[0] if stat else "?", *hit))
    return sorted(set(out))
