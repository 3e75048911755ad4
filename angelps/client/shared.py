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
the headers, which name the regions. Here are the segment and its allocator, a call's regions
(:class:`Regions`, :class:`Placed`), the shard's side of a connection (:class:`ShardSegment`)
and the frames that name them (:func:`encode_shared`, :func:`encode_map`, :func:`shared_regions`).

Invariants: only the client allocates (:class:`Arena`, thread-safe: a tier's write-back
thread and its main thread send concurrently); a request's region is freed when its reply
arrives (the shard has read it: the shard keeps no view of a request's body after answering
it, and copies a push it keeps), a reply's region when the last array over it is gone
(:meth:`Arena.take`); a call that finds no room travels on the socket as before. The segment
is owner-only (0600), its memory reserved when it is made, named with its maker's process id
and 128 random bits, and opened by the shard only under that name's pattern, as a regular file
of this user's, not through a link. A segment whose maker died in the one round trip before
the shard mapped it (its name is removed then) is removed by the next process of this user's
that makes one (:func:`sweep_stale`).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from angelps.client import wire

__all__ = ["ALIGN", "SHM_DIR", "Arena", "Segment", "shared_dir", "sweep_stale"]

#: Where segments live (a RAM-backed file system; none on other systems: sockets only).
SHM_DIR = "/dev/shm"
#: Regions start at multiples of this (a cache line: rows copied in and out are aligned).
ALIGN = 64
_NAME = re.compile(r"angelps-([0-9]{1,10})-[0-9a-f]{32}")
#: The largest segment a shard maps (a client never asks for more).
MAX_SEGMENT = 1 << 30
#: A segment of a process that is gone is removed once it is this old (seconds): its maker
#: removes its name within one round trip, and a process of another pid namespace sharing
#: /dev/shm (whose ids this one cannot see) is not raced.
STALE_S = 60.0
_swept = False


def shared_dir() -> str | None:
    """The directory segments are created in, or None where there is none to use."""
    if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK):
        return SHM_DIR
    return None


def sweep_stale(folder: str = SHM_DIR, now: float | None = None) -> list[str]:
    """Remove this user's segments in ``folder`` whose maker is gone (it died between making
    one and the shard mapping it) and that are :data:`STALE_S` old; the names removed."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None or _alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
            if (
                stat.S_ISREG(st.st_mode)
                and st.st_uid == os.getuid()
                and now - st.st_mtime >= STALE_S
            ):
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue  # (removed meanwhile)
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (or cannot be told: then it is left alone)."""
    if pid <= 1:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # (another user's process, an id out of range)
    return True


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
        global _swept
        if not _swept:  # (once a process)
            _swept = True
            sweep_stale(folder)
        name = f"angelps-{os.getpid()}-{secrets.token_hex(16)}"
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

    def write(self, off: int, bufs: Sequence[memoryview]) -> int:
        """Copy ``bufs`` one after another to the segment from ``off``; the bytes written."""
        pos = off
        for b in bufs:
            n = b.nbytes
            self.buf[pos : pos + n] = np.frombuffer(b, dtype=np.uint8)
            pos += n
        return pos - off

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

    def take(self, off: int, n: int) -> memoryview:
        """Bytes ``[off, off + n)`` of the region at ``off``, as a buffer that frees the region
        once it, and every array read from it (``np.frombuffer``), is gone."""
        # (a memoryview: numpy would skip an intermediate array as the base of its views)
        region = self.segment.view(off, n).view()
        weakref.finalize(region, self.free, off)
        return memoryview(region)  # type: ignore[arg-type]


class Regions:
    """A call's regions in a shared segment: its request's and its reply's (offsets in
    ``arena``, None where it has none). ``keep``: the request's region outlives the reply, up
    to the connection's next reply (a device tier's swap: the shard writes back rows from it
    after answering, before it reads the connection's next call)."""

    __slots__ = ("arena", "keep", "out", "req")

    def __init__(self, arena: Arena, req: int | None, out: int | None, keep: bool = False) -> None:
        self.arena = arena
        self.req = req
        self.out = out
        self.keep = keep

    def free(self, used: int | None) -> None:
        """Free the request's region, and the reply's unless the reply was read from it
        (``used``: then the arrays over it free it)."""
        self.free_request()
        if self.out is not None and used is None:
            self.arena.free(self.out)

    def free_request(self) -> None:
        """Free the request's region (once)."""
        req, self.req = self.req, None
        if req is not None:
            self.arena.free(req)


class Placed:
    """Where a reply's rows written in the shared segment are read: the region allocated for
    that call's reply (a reply naming any other is refused)."""

    def __init__(self, regions: Regions | None) -> None:
        self.regions = regions
        self.used: int | None = None

    def __call__(self, off: int, n: int) -> memoryview:
        r = self.regions
        if r is None or r.out is None or off != r.out:
            raise ValueError(f"a reply in a shared region ({off}) not allocated for it")
        view = r.arena.take(off, n)
        self.used = off
        return view


class ShardSegment:
    """The shard's side: a connection's shared segment, once its client has sent one (the
    bodies of its calls travel there)."""

    def __init__(self) -> None:
        self._segment: Segment | None = None

    def attach(self, name: str, size: int) -> None:
        """Map the client's segment ``name`` in place of the previous one (a client grows
        its segment by sending a larger one: the calls that used the previous one are all
        served, in order, before this)."""
        try:
            segment = Segment.attach(name, size)
        except OSError as e:  # (the client is on another node: it keeps to the socket)
            raise ValueError(f"cannot map shared segment {name}: {e.strerror or e}") from None
        self.close()
        self._segment = segment

    def segment(self) -> Segment:
        if self._segment is None:
            raise ValueError("a call in a shared segment on a connection that has none")
        return self._segment

    def close(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment = None


# --- frames ---------------------------------------------------------------------------------


def encode_shared(
    head: dict[str, Any], bufs: Sequence[bytes | memoryview], arena: Arena, reply_bytes: int
) -> tuple[list[bytes | memoryview], tuple[int | None, int | None]] | None:
    """A call (``head`` and its body ``bufs``: ``wire.request_parts``, ``wire.swap_parts``)
    whose body travels in ``arena``'s shared segment: the body is copied into a new region (``"in": [offset, bytes]``) and a region of ``reply_bytes`` is
    allocated for the reply's rows (``"out": [offset, bytes]``); the frame (a header alone)
    and the two regions' offsets, which the caller frees (the request's when the reply
    arrives). None where the arena has no room (the call then takes the socket)."""
    views = [wire.byte_view(b) for b in bufs]
    total = sum(v.nbytes for v in views)
    req = arena.alloc(total) if total else None
    if total and req is None:
        return None
    out = arena.alloc(reply_bytes) if reply_bytes else None
    if reply_bytes and out is None:
        if req is not None:
            arena.free(req)
        return None
    head = dict(head)
    if req is not None:
        arena.segment.write(req, views)
        head["in"] = [req, total]
    if out is not None:
        head["out"] = [out, reply_bytes]
    header = json.dumps(head).encode()
    return [wire.PREFIX.pack(len(header), 0), header], (req, out)


def encode_map(name: str, size: int) -> list[bytes | memoryview]:
    """The frame asking a shard to map the client's shared segment ``name`` of ``size``
    bytes (angelps/client/shared.py); answered by an empty reply, or an error where the
    shard cannot open it (another node)."""
    return wire.frames({"map": name, "size": size}, [])


def is_map(header: bytes) -> bool:
    """A map request's header (:func:`encode_map` writes its ``"map"`` key first)."""
    return header.startswith(b'{"map"')


def decode_map(header: bytes) -> tuple[str, int]:
    """The segment name and size of a map request (ValueError for anything else)."""
    try:
        h = json.loads(header)
        name, size = h["map"], h["size"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError("malformed map header (not an angelps frame)") from None
    if not isinstance(name, str) or not _is_int(size):
        raise ValueError("malformed map header: a segment name and a size")
    return name, size


def shared_regions(header: bytes) -> tuple[list[int] | None, list[int] | None]:
    """A call's ``"in"`` (its body in the shared segment) and ``"out"`` (where its reply's
    rows go) regions, each ``[offset, bytes]`` or None (ValueError for a malformed one; the
    segment checks that they lie inside it)."""
    if b'"in"' not in header and b'"out"' not in header:  # (most calls: parsed once, later)
        return None, None
    try:
        h = json.loads(header)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("malformed header (not an angelps frame)") from None
    out: list[list[int] | None] = []
    for key in ("in", "out"):
        r = h.get(key) if isinstance(h, dict) else None
        if r is not None and not (isinstance(r, list) and len(r) == 2 and all(map(_is_int, r))):
            raise ValueError(f"malformed header: {key!r} must be [offset, bytes]")
        out.append(r)
    return out[0], out[1]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
