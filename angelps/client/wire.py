"""The data plane: a shard's ``step`` (a :class:`~angelps.step_call.StepCall` and its
:class:`~angelps.step_call.StepResult`) over a direct TCP connection instead of a Ray actor call.

A Ray actor call has a fixed cost whatever its payload (submission, scheduling, the reply
through the core worker) that is several times a shard's work for a step and far above a
loopback TCP round trip (figures in docs/benchmarks-ps.md). Like Angel's own PS (Netty RPC
between workers and servers), the hot path therefore bypasses the actor framework: each shard
actor also listens on a TCP port (opened on request, see
:meth:`angelps.server.shard_server.ShardServer.serve`), and a client (:mod:`angelps.client.transport`) sends its
``step`` calls there. Ray still places, names, restarts and controls the shards (save, load,
stats and recovery go through actor calls).

Frames (little-endian): ``u32 header length, u64 body length``, a JSON header, then the body:
the raw bytes of the numpy arrays the header lists, in order. No pickle crosses the wire. A call
of any size streams in bounded frames: a body longer than :data:`MAX_FRAME_BYTES` is split, the
first frame's header says the whole body's length (``"n"``) and continuation frames (header
length 0) carry the rest, each at most :data:`MAX_FRAME_BYTES` (:func:`frames`).

* request: ``{"w": worker, "c": clock, "lr": lr (a number, or ``[lr, momentum, {table: [lr,
  momentum]}]``: :meth:`angelps.rates.StepRates.to_json`), "r": recovering, "push": [[table, n, cols,
  dtype], ...] | null, "pull": [[table, n], ...] | null}`` and optionally ``"pc"``: the clock
  the pull is served at (default: the clock after the push; a prefetch names a later one); the
  body holds, per push, the ``n`` int64 keys then the ``[n, cols]`` gradients, and per pull
  its ``n`` int64 keys (``n = -1``: all rows of a dense table, no keys);
* a device tier's swap (:func:`encode_swap`): ``{"swap": 1, "wr": [[table, n, width, dtype],
  ...], "rd": [[table, n], ...]}``; the body holds, per write, the ``n`` int64 keys then the
  ``[n, width]`` whole rows (weights and optimizer slots), and per read its ``n`` int64 keys;
* reply: ``{"ok": true, "b": backed_up, "rows": [[table, n, cols, dtype], ...] | null}`` (a
  swap's also ``"pid"``: the shard's process id; the first push after a restart that had
  nothing to replay also ``"r"``: the clock its backup held) and the rows, or ``{"ok": false, "kind": ...,
  "msg": ..., "args": [...]}``.

A connection starts with the job's token (sent by the client, checked by the shard in constant
time), which the shard acknowledges with the byte :data:`ACK`, so only clients the driver handed
the token to can talk to a shard. Calls on one connection are served one after another, in
order: the per-caller ordering that BSP's fused push-pull relies on, as with Ray's actor calls.

Invariants (a hostile peer): the two lengths of a frame are checked against
:class:`FrameLimits` (derived from the shard's tables, :data:`MAX_FRAME_BYTES` and
:data:`MAX_CALL_BYTES`) before anything is allocated, and a streamed body is kept only as its
frames arrive (never allocated from an announced length); :func:`decode_request` accepts only a header of the shape above whose
arrays exactly fill the body, and raises ValueError for anything else.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from angelps.optim import slot_columns
from angelps.rates import StepRates
from angelps.step_call import Pulls, Pushes, StepCall, StepResult

__all__ = [
    "ACK",
    "DTYPES",
    "MAX_CALL_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_HEADER",
    "PREFIX",
    "TOKEN_BYTES",
    "Body",
    "FrameLimits",
    "byte_view",
    "decode_reply",
    "decode_request",
    "decode_swap",
    "encode_error",
    "encode_reply",
    "encode_request",
    "encode_swap",
    "frames",
    "is_swap",
    "recv_call",
    "recv_exact",
    "request_parts",
    "send_buffers",
    "stream_length",
    "swap_keeps_body",
    "swap_parts",
]

#: A frame's body: what arrived on the socket, or a region of a shared segment.
Body: TypeAlias = "bytes | bytearray | memoryview | np.ndarray"

PREFIX = struct.Struct("<IQ")
TOKEN_BYTES = 32
#: The shard's answer to a good token: the connection is accepted.
ACK = b"\x01"
#: A reply's header lists a few tables; a client drops a stream announcing a longer one.
MAX_HEADER = 1 << 20
#: The longest body of one frame: longer calls stream in several frames.
MAX_FRAME_BYTES = 1 << 22
#: The longest body of one call (all its frames) to a shard with an unbounded table (rows=-1);
#: bounded tables give a shard a tighter limit (:class:`FrameLimits`).
MAX_CALL_BYTES = 1 << 36
#: The gradient dtypes a push may carry (little-endian float32 and float64).
DTYPES = ("<f4", "<f8")
_ROW_BYTES = 8  # the widest value a push may carry (float64)


@dataclass(frozen=True)
class FrameLimits:
    """The longest header, frame body and call body of a legal request to one shard, from its
    tables: a shard drops a connection whose frame announces more, before reading it."""

    max_header: int
    max_body: int

    @property
    def max_frame(self) -> int:
        """The longest body of one frame."""
        return min(self.max_body, MAX_FRAME_BYTES)

    @classmethod
    def of(cls, tables: Sequence[Any], num_shards: int) -> FrameLimits:
        """From the shard's :class:`~angelps.table.TableSpec` list: every table pushed (keys
        and float64 gradients) and pulled (keys) at once, with as many distinct keys as one
        shard can hold (a dense block, a sparse index range; unbounded for ``rows=-1``),
        capped by :data:`MAX_CALL_BYTES` (and streamed in frames of at most
        :data:`MAX_FRAME_BYTES`)."""
        header = 1024 + sum(2 * len(json.dumps(t.name)) + 192 for t in tables)
        body = 0
        for t in tables:
            if t.rows < 0:
                return cls(header, MAX_CALL_BYTES)
            n = t.rows if t.sparse else -(-t.rows // num_shards)
            # (a device tier's write-back carries whole rows: weights and optimizer slots)
            width = slot_columns(t.optimizer, t.cols)[1]
            body += n * (8 + width * _ROW_BYTES) + n * 8
        return cls(header, min(body, MAX_CALL_BYTES))


def encode_request(call: StepCall) -> list[bytes | memoryview]:
    """The frames of one ``step`` call, as buffers for ``sendmsg`` (arrays are not copied).
    ``call.checked`` is not sent: the shard checks every call it decodes."""
    return frames(*request_parts(call))


def request_parts(call: StepCall) -> tuple[dict[str, Any], list[bytes | memoryview]]:
    """A ``step`` call's header and its body's buffers (views of the arrays)."""
    bufs: list[bytes | memoryview] = []
    push_h = None
    if call.pushes is not None:
        push_h = []
        for name, (keys, grads) in call.pushes.items():
            k = np.ascontiguousarray(keys, dtype=np.int64)
            g = np.ascontiguousarray(grads)
            push_h.append([name, int(k.size), int(g.shape[1]) if g.ndim == 2 else 1, g.dtype.str])
            bufs += [k.data, g.data]
    pull_h = None
    if call.pulls is not None:
        pull_h = []
        for name, wanted in call.pulls.items():
            if wanted is None:
                pull_h.append([name, -1])
                continue
            pk = np.ascontiguousarray(wanted, dtype=np.int64)
            pull_h.append([name, int(pk.size)])
            bufs.append(pk.data)
    step = call.step
    head: dict[str, Any] = {
        "w": call.worker,
        "c": call.clock,
        "lr": step.to_json() if isinstance(step, StepRates) else step,
        "r": call.recovering,
        "push": push_h,
        "pull": pull_h,
    }
    if call.pull_clock is not None:
        head["pc"] = call.pull_clock
    return head, bufs


def frames(head: dict[str, Any], bufs: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """``head`` (JSON) and the body ``bufs`` as frames: one when the body fits in
    :data:`MAX_FRAME_BYTES`, else the first frame's header gets ``"n"`` (the whole body's
    length) and continuation frames (header length 0) follow. Buffers are sliced, not copied."""
    views = [byte_view(b) for b in bufs]
    total = sum(v.nbytes for v in views)
    if total > MAX_FRAME_BYTES:
        head = dict(head, n=total)
    header = json.dumps(head).encode()
    out: list[bytes | memoryview] = [PREFIX.pack(len(header), min(total, MAX_FRAME_BYTES)), header]
    room = MAX_FRAME_BYTES  # bytes left in the current frame
    left = total
    for v in views:
        while v.nbytes:
            if room == 0:
                room = min(left, MAX_FRAME_BYTES)
                out.append(PREFIX.pack(0, room))
            take = min(room, v.nbytes)
            out.append(v[:take])
            v = v[take:]
            room -= take
            left -= take
    return out


def stream_length(header: bytes, first: int) -> int:
    """The whole body length of a call whose first frame has ``header`` and a ``first``-byte
    body: its ``"n"`` (ValueError if that is not an integer >= ``first``), else ``first``.
    A header that is not JSON is left to :func:`decode_request` (its body is the one frame)."""
    try:
        h = json.loads(header)
    except (ValueError, UnicodeDecodeError):
        return first
    n = h.get("n", first) if isinstance(h, dict) else first
    if not _is_int(n) or n < first:
        raise ValueError(f"a frame announcing a {n!r}-byte call after a {first}-byte frame")
    return int(n)


def decode_request(header: bytes, body: Body) -> StepCall:
    """The call of a request frame (arrays are views of body), not marked checked: the shard
    validates its pushes and pulls against its tables (:mod:`angelps.push_checks`).

    ValueError for anything but a request of the documented shape whose arrays exactly fill
    ``body`` (garbage, unknown fields' types, a dtype other than :data:`DTYPES`, lengths that
    do not match the body)."""
    try:
        h = json.loads(header)
        worker, clock, lr, recovering = h["w"], h["c"], h["lr"], h["r"]
        push_h, pull_h = h["push"], h["pull"]
        pull_clock = h.get("pc")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError("malformed request header (not an angelps frame)") from None
    if not (_is_int(worker) and _is_int(clock) and clock >= 0):
        raise ValueError("malformed request header: worker and clock must be integers >= 0")
    if isinstance(lr, list):
        try:
            lr = StepRates.from_json(lr)
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed request header: lr: {e}") from None
    elif not isinstance(lr, (int, float)) or isinstance(lr, bool):
        raise ValueError("malformed request header: lr must be a number or step rates")
    if not isinstance(recovering, bool):
        raise ValueError("malformed request header: r must be a boolean")
    if pull_clock is not None and not (_is_int(pull_clock) and pull_clock >= 0):
        raise ValueError("malformed request header: pc must be an integer >= 0")
    off = 0
    pushes: Pushes | None = None
    if push_h is not None:
        pushes, off = _keyed_blocks(push_h, body, off, "push")
    pulls: Pulls | None = None
    if pull_h is not None:
        pulls = {}
        for name, n in _entries(pull_h, 2):
            if not (_is_int(n) and n >= -1):
                raise ValueError(f"malformed pull of table {name!r}: {n!r} keys")
            if n < 0:
                pulls[name] = None
                continue
            _check_fits(off, 8 * n, len(body))
            pulls[name] = np.frombuffer(body, dtype=np.int64, count=n, offset=off)
            off += 8 * n
    if off != len(body):
        raise ValueError(f"malformed request: its arrays hold {off} bytes, the body {len(body)}")
    return StepCall(
        worker,
        clock,
        pushes,
        lr if isinstance(lr, StepRates) else float(lr),
        pulls,
        recovering,
        pull_clock,
    )


def encode_swap(
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]], reads: Mapping[str, np.ndarray]
) -> list[bytes | memoryview]:
    """The frames of a device tier's swap (:meth:`angelps.server.shard.ParameterShard.swap`):
    write back ``writes`` (table -> (keys, whole rows)), then read the whole rows of
    ``reads`` (table -> keys). Arrays are not copied."""
    return frames(*swap_parts(writes, reads))


def swap_parts(
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]], reads: Mapping[str, np.ndarray]
) -> tuple[dict[str, Any], list[bytes | memoryview]]:
    """A swap's header and its body's buffers (views of the arrays)."""
    bufs: list[bytes | memoryview] = []
    wr = []
    for name, (keys, block) in writes.items():
        k = np.ascontiguousarray(keys, dtype=np.int64)
        b = np.ascontiguousarray(block)
        wr.append([name, int(k.size), int(b.shape[1]), b.dtype.str])
        bufs += [k.data, b.data]
    rd = []
    for name, keys in reads.items():
        k = np.ascontiguousarray(keys, dtype=np.int64)
        rd.append([name, int(k.size)])
        bufs.append(k.data)
    # "keep": a body in memory shared with the shard stays the shard's to read until the
    # connection's next reply (the shard writes back rows from it after answering)
    return {"swap": 1, "keep": 1, "wr": wr, "rd": rd}, bufs


def is_swap(header: bytes) -> bool:
    """A swap's header (:func:`encode_swap` writes its ``"swap"`` key first)."""
    return header.startswith(b'{"swap"')


def swap_keeps_body(header: bytes) -> bool:
    """Whether a swap's client keeps a body in shared memory until its connection's next
    reply (:func:`swap_parts`), so the shard may read it after answering without a copy."""
    try:
        return bool(json.loads(header).get("keep"))
    except (ValueError, AttributeError, UnicodeDecodeError):
        return False


def decode_swap(
    header: bytes, body: Body
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    """The writes and reads of a swap frame (arrays are views of ``body``); ValueError for
    anything but a swap of the documented shape whose arrays exactly fill ``body``. The shard
    checks the keys and the rows' shapes and dtypes against its tables."""
    try:
        h = json.loads(header)
        wr, rd = h["wr"], h["rd"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError("malformed swap header (not an angelps frame)") from None
    writes, off = _keyed_blocks(wr, body, 0, "write-back")
    reads: dict[str, np.ndarray] = {}
    for name, n in _entries(rd, 2):
        if not (_is_int(n) and n >= 0):
            raise ValueError(f"malformed read of table {name!r}: {n!r} keys")
        _check_fits(off, 8 * n, len(body))
        reads[name] = np.frombuffer(body, dtype=np.int64, count=n, offset=off)
        off += 8 * n
    if off != len(body):
        raise ValueError(f"malformed swap: its arrays hold {off} bytes, the body {len(body)}")
    return writes, reads


def _keyed_blocks(
    entries: Any, body: Body, off: int, what: str
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """A header's ``[table, n, cols, dtype]`` entries read from ``body`` at ``off``: per
    table its ``n`` int64 keys, then an ``[n, cols]`` block of that dtype (a push's
    gradients, a write-back's whole rows); and the offset after them. ValueError names
    ``what`` and the table for an entry of the wrong shape or past the body's end."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, n, cols, dtype in _entries(entries, 4):
        if not (_is_int(n) and n >= 0 and _is_int(cols) and cols >= 1 and dtype in DTYPES):
            raise ValueError(f"malformed {what} of table {name!r}: {[n, cols, dtype]}")
        dt = np.dtype(dtype)
        need = n * (8 + cols * dt.itemsize)
        _check_fits(off, need, len(body))
        keys = np.frombuffer(body, dtype=np.int64, count=n, offset=off)
        block = np.frombuffer(body, dtype=dt, count=n * cols, offset=off + 8 * n)
        out[name] = (keys, block.reshape(n, cols))
        off += need
    return out, off


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entries(entries: Any, width: int) -> list[list[Any]]:
    """A header's push or pull list: lists of ``width`` items, each naming a table once."""
    if not isinstance(entries, list):
        raise ValueError("malformed request header: push and pull must be lists or null")
    seen: set[str] = set()
    for e in entries:
        if not (isinstance(e, list) and len(e) == width and isinstance(e[0], str)):
            raise ValueError(f"malformed request header entry: {str(e)[:80]}")
        if e[0] in seen:
            raise ValueError(f"malformed request: table {e[0]!r} listed twice")
        seen.add(e[0])
    return entries


def _check_fits(off: int, need: int, size: int) -> None:
    if off + need > size:
        raise ValueError(f"malformed request: its arrays need more than the body's {size} bytes")


def encode_reply(
    result: StepResult, region: tuple[Any, int, int] | None = None, placed: bool = False
) -> list[bytes | memoryview]:
    """The frames of a successful ``step``: its rows (or none) and the backup clock. With
    ``region`` (a shared segment, an offset and a size: a swap's ``"out"``) rows that fit are
    copied there and the header says where (``"at": [offset, bytes]``); ``placed``: the rows
    are there already (arrays over the region, one after another from its start)."""
    arrays = {n: np.ascontiguousarray(r) for n, r in (result.rows or {}).items()}
    bufs: list[bytes | memoryview] = [a.data for a in arrays.values()]
    rows_h = [[n, int(a.shape[0]), int(a.shape[1]), a.dtype.str] for n, a in arrays.items()]
    head: dict[str, Any] = {"ok": True, "b": result.backed_up}
    head["rows"] = None if result.rows is None else rows_h
    if result.pid is not None:
        head["pid"] = result.pid
    if result.restored is not None:
        head["r"] = result.restored
    if region is not None:
        segment, off, size = region
        views = [byte_view(b) for b in bufs]
        total = sum(v.nbytes for v in views)
        if total <= size:
            if not placed:
                segment.write(off, views)
            head["at"] = [off, total]
            bufs = []
    return frames(head, bufs)


def encode_error(kind: str, msg: str, args: list[Any]) -> list[bytes]:
    """The frame of a failed ``step``: the exception's type name, message and arguments."""
    header = json.dumps({"ok": False, "kind": kind, "msg": msg, "args": args}).encode()
    return [PREFIX.pack(len(header), 0), header]


def decode_reply(
    header: bytes,
    body: bytearray | memoryview,
    placed: Callable[[int, int], memoryview] | None = None,
) -> tuple[bool, Any]:
    """``(True, StepResult)`` or ``(False, (kind, msg, args))``. A reply whose rows the shard
    wrote to the shared segment (``"at": [offset, bytes]``) is read from ``placed(offset,
    bytes)`` (ValueError without it)."""
    h = json.loads(header)
    if not h["ok"]:
        return False, (h["kind"], h["msg"], h["args"])
    at = h.get("at")
    if at is not None:
        if placed is None:
            raise ValueError("a reply in a shared segment this connection does not have")
        body = placed(int(at[0]), int(at[1]))
    rows = None
    if h["rows"] is not None:
        rows, off = {}, 0
        for name, n, cols, dtype in h["rows"]:
            dt = np.dtype(dtype)
            rows[name] = np.frombuffer(body, dtype=dt, count=n * cols, offset=off).reshape(n, cols)
            off += dt.itemsize * n * cols
    pid, restored = h.get("pid"), h.get("r")
    return True, StepResult(
        rows,
        int(h["b"]),
        None if pid is None else int(pid),
        None if restored is None else int(restored),
    )


def recv_call(
    sock: socket.socket, max_header: int, max_frame: int = MAX_FRAME_BYTES
) -> tuple[bytes, bytearray]:
    """The header and whole body of one streamed reply from a blocking socket (its frames
    joined into one buffer, allocated as the first frame announces: the peer is the shard this
    client authenticated to). ConnectionError on a header over ``max_header`` bytes."""
    hlen, blen = PREFIX.unpack(recv_exact(sock, PREFIX.size))
    if hlen > max_header or blen > max_frame:
        raise ConnectionError(f"not an angelps reply (a {hlen}-byte header, {blen}-byte body)")
    header = bytes(recv_exact(sock, hlen))
    try:
        total = stream_length(header, blen)
    except ValueError as e:
        raise ConnectionError(str(e)) from None
    body = bytearray(total)
    view = memoryview(body)
    _recv_into(sock, view[:blen])
    got = blen
    while got < total:
        hlen, blen = PREFIX.unpack(recv_exact(sock, PREFIX.size))
        if hlen != 0 or blen > min(max_frame, total - got) or blen == 0:
            raise ConnectionError("a broken continuation frame in a reply")
        _recv_into(sock, view[got : got + blen])
        got += blen
    return header, body


def send_buffers(sock: socket.socket, bufs: Sequence[bytes | memoryview]) -> None:
    """Send every buffer in order with ``sendmsg`` (no join: large arrays are not copied)."""
    views = [byte_view(b) for b in bufs]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i : i + 256])
        while sent:
            n = views[i].nbytes
            if sent >= n:
                sent -= n
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0
        while i < len(views) and views[i].nbytes == 0:
            i += 1


def byte_view(b: bytes | memoryview) -> memoryview:
    """``b`` as a flat view of bytes (an empty array's view cannot be cast)."""
    v = memoryview(b)
    return v.cast("B") if v.nbytes else memoryview(b"")


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from a blocking socket (ConnectionError if it closes first)."""
    got = 0
    while got < view.nbytes:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the shard closed the connection")
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes from a blocking socket (ConnectionError if it closes first)."""
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return buf
