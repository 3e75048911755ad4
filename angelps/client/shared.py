"""Shared memory between a client and a shard on one node: the data plane's bodies without the
socket (angelps/client/wire.py).

On one node, a socket moves every byte twice through the kernel (the sender's copy in, the
receiver's copy out), and the shard's asyncio stream copies it twice more before the numpy
work starts: for a step's pushes and pulls and a device tier's swaps (megabytes a step, both
ways) those copies compete with the worker's own computation for the memory system
(docs/benchmarks-train.md, "Closing the gap on the CPU"). So a client whose shard turns out to
be on its own node hands it a memory segment (:class:`Arena`, a file in ``/dev/shm`` the shard
maps and the client then removes; angelps/client/transport.py offers a larger one when a call
does not fit), and a call's body travels there: the client writes its request body into a
region of the segment and allocates the region its reply will fill; the socket carries only
the headers, which name the regions.

Invariants: only the client allocates (:class:`Arena`, thread-safe: a tier's write-back
thread and its main thread send concurrently); a request's region is freed when its reply
arrives (the shard has read it: the shard keeps no view of a request's body after answering
it, and copies a push it keeps), a reply's region when the last array over it is gone
(:meth:`Arena.take`); a call that finds no room travels on the socket as before. The segment
is owner-only (0600), its memory reserved when it is made, named with 128 random bits, and
opened by the shard only under that name's pattern, as a regular file of this user's, not
through a link.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import stat
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["ALIGN", "SHM_DIR", "Arena", "Segment", "shared_dir"]

#: Where segments live (a RAM-backed file system; none on other systems: sockets only).
SHM_DIR = "/dev/shm"
#: Regions start at multiples of this (a cache line: rows copied in and out are aligned).
ALIGN = 64
_NAME = re.compile(r"angelps-[0-9a-f]{32}")
#: The largest segment a shard maps (a client never asks for more).
MAX_SEGMENT = 1 << 30


def shared_dir() -> str | None:
    """The directory segments are created in, or None where there is none to use."""
    if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK):
        return SHM_DIR
    return None


class Segment:
    """A memory-mapped file of ``size`` bytes in :data:`SHM_DIR`, named :attr:`name`."""

    def __init__(self, name: str, mm: mmap.mmap) -> None:
        self.name = name
        self.mm = mm
        self.size = len(mm)
        self.buf = np.frombuffer(mm, dtype=np.uint8)

    @classmethod
    def create(cls, size: int) -> Segment:
        """A new segment (owner-only); the caller unlinks it once the shard has mapped it."""
        folder = shared_dir()
        if folder is None:
            raise OSError(f"no shared-memory directory ({SHM_DIR})")
        name = f"angelps-{secrets.token_hex(16)}"
        path = os.path.join(folder, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Reserved now, not as pages are first written: a /dev/shm too small for it (a
            # container's default is 64 MB) fails here (the socket is used), where a sparse
            # file would kill the process that writes past the room left (SIGBUS).
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except OSError:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(name, mm)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        """The shard's side: map the client's segment ``name`` of ``size`` bytes. OSError
        (FileNotFoundError where the client is on another node) or ValueError (a name or file
        that is not a segment of this user's)."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"not a segment name: {str(name)[:80]!r}")
        if not isinstance(size, int) or not 0 < size <= MAX_SEGMENT:
            raise ValueError(f"a segment of {size!r} bytes (at most {MAX_SEGMENT})")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != size:
                raise ValueError(f"segment {name} is not a {size}-byte file of this user's")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, mm)

    def unlink(self) -> None:
        """Remove the segment's name (the mappings stay valid until closed)."""
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass

    def view(self, off: Any, n: Any) -> np.ndarray:
        """Bytes ``[off, off + n)`` (ValueError outside the segment: a peer's offsets)."""
        if not (_is_int(off) and _is_int(n) and 0 <= off and 0 <= n and off + n <= self.size):
            raise ValueError(f"a region [{off}, +{n}) outside a {self.size}-byte segment")
        return self.buf[off : off + n]

    def close(self) -> None:
        """Unmap now (the shard's side, between calls), else when the last array over the
        segment is gone."""
        self.buf = np.empty(0, np.uint8)
        try:
            self.mm.close()
        except BufferError:
            pass


class Arena:
    """A client's :class:`Segment` and the regions allocated in it (first fit, aligned to
    :data:`ALIGN`; thread-safe)."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self._lock = threading.Lock()
        self._free: list[list[int]] = [[0, segment.size]]  # [offset, size], by offset
        self._used: dict[int, int] = {}
        self._in_use = 0
        #: The most bytes allocated at once, and the calls that found no room (sent on the
        #: socket instead): a segment too small for a job shows here.
        self.peak = 0
        self.full = 0

    @property
    def in_use(self) -> int:
        """Bytes allocated now."""
        return self._in_use

    def alloc(self, n: int) -> int | None:
        """The offset of a new region of ``n`` bytes, or None where there is no room."""
        size = max(ALIGN, -(-n // ALIGN) * ALIGN)
        with self._lock:
            for i, (off, room) in enumerate(self._free):
                if room >= size:
                    if room == size:
                        del self._free[i]
                    else:
                        self._free[i] = [off + size, room - size]
                    self._used[off] = size
                    self._in_use += size
                    self.peak = max(self.peak, self._in_use)
                    return off
            self.full += 1
        return None

    def free(self, off: int) -> None:
        """Return the region at ``off`` (merged with its free neighbours)."""
        with self._lock:
            size = self._used.pop(off)
            self._in_use -= size
            free = self._free
            i = 0
            while i < len(free) and free[i][0] < off:
                i += 1
            free.insert(i, [off, size])
            if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
                free[i][1] += free.pop(i + 1)[1]
            if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
                free[i - 1][1] += free.pop(i)[1]

    def write(self, off: int, bufs: list[memoryview]) -> int:
        """Copy ``bufs`` one after another into the region at ``off``; the bytes written."""
        pos = off
        for b in bufs:
            n = b.nbytes
            self.segment.buf[pos : pos + n] = np.frombuffer(b, dtype=np.uint8)
            pos += n
        return pos - off

    def take(self, off: int, n: int) -> memoryview:
        """Bytes ``[off, off + n)`` of the region at ``off``, as a buffer that frees the region
        once it, and every array read from it (``np.frombuffer``), is gone."""
        # (a memoryview: numpy would skip an intermediate array as the base of its views)
        region = self.segment.view(off, n).view()
        weakref.finalize(region, self.free, off)
        return memoryview(region)  # type: ignore[arg-type]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
