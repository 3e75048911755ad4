"""The data plane: a shard's ``step`` over a direct TCP connection instead of a Ray actor call.

A Ray actor call has a fixed cost whatever its payload (submission, scheduling, the reply
through the core worker) that is several times a shard's work for a step and far above a
loopback TCP round trip (figures in docs/benchmarks-ps.md). Like Angel's own PS (Netty RPC
between workers and servers), the hot path therefore bypasses the actor framework: each shard
actor also listens on a TCP port (opened on request, see
:meth:`angelps.server.ShardServer.serve`), and a client (:mod:`angelps.transport`) sends its
``step`` calls there. Ray still places, names, restarts and controls the shards (save, load,
stats and recovery go through actor calls).

Frames (little-endian): ``u32 header length, u64 body length``, a JSON header, then the body:
the raw bytes of the numpy arrays the header lists, in order. No pickle crosses the wire.

* request: ``{"w": worker, "c": clock, "lr": lr, "r": recovering, "push": [[table, n, cols,
  dtype], ...] | null, "pull": [[table, n], ...] | null}``; the body holds, per push, the
  ``n`` int64 keys then the ``[n, cols]`` gradients, and per pull its ``n`` int64 keys
  (``n = -1``: all rows of a dense table, no keys);
* reply: ``{"ok": true, "b": backed_up, "rows": [[table, n, cols, dtype], ...] | null}`` and
  the rows, or ``{"ok": false, "kind": ..., "msg": ..., "args": [...]}``.

A connection starts with the job's token (sent by the client, checked by the shard), so only
clients the driver handed the token to can talk to a shard. Calls on one connection are served
one after another, in order: the per-caller ordering that BSP's fused push-pull relies on, as
with Ray's actor calls.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "MAX_HEADER",
    "PREFIX",
    "TOKEN_BYTES",
    "decode_reply",
    "decode_request",
    "encode_error",
    "encode_reply",
    "encode_request",
    "recv_exact",
]

PREFIX = struct.Struct("<IQ")
TOKEN_BYTES = 32
# A header lists a few tables; anything longer means the stream is out of step.
MAX_HEADER = 1 << 20


def encode_request(
    worker: int,
    clock: int,
    pushes: Mapping[str, tuple[np.ndarray, np.ndarray]] | None,
    lr: float,
    pulls: Mapping[str, np.ndarray | None] | None,
    recovering: bool = False,
) -> list[bytes | memoryview]:
    """The frame of one ``step`` call, as buffers for ``sendmsg`` (arrays are not copied)."""
    bufs: list[bytes | memoryview] = []
    push_h = None
    if pushes is not None:
        push_h = []
        for name, (keys, grads) in pushes.items():
            k = np.ascontiguousarray(keys, dtype=np.int64)
            g = np.ascontiguousarray(grads)
            push_h.append([name, int(k.size), int(g.shape[1]) if g.ndim == 2 else 1, g.dtype.str])
            bufs += [k.data, g.data]
    pull_h = None
    if pulls is not None:
        pull_h = []
        for name, wanted in pulls.items():
            if wanted is None:
                pull_h.append([name, -1])
                continue
            pk = np.ascontiguousarray(wanted, dtype=np.int64)
            pull_h.append([name, int(pk.size)])
            bufs.append(pk.data)
    header = json.dumps(
        {"w": worker, "c": clock, "lr": lr, "r": recovering, "push": push_h, "pull": pull_h}
    ).encode()
    body_len = sum(memoryview(b).nbytes for b in bufs)  # (len() of a typed view counts items)
    return [PREFIX.pack(len(header), body_len), header, *bufs]


def decode_request(header: bytes, body: bytes) -> dict[str, Any]:
    """The arguments of ``ShardServer.step`` from a request frame (arrays are views of body)."""
    h = json.loads(header)
    off = 0
    pushes: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    if h["push"] is not None:
        pushes = {}
        for name, n, cols, dtype in h["push"]:
            keys = np.frombuffer(body, dtype=np.int64, count=n, offset=off)
            off += 8 * n
            dt = np.dtype(dtype)
            grads = np.frombuffer(body, dtype=dt, count=n * cols, offset=off).reshape(n, cols)
            off += dt.itemsize * n * cols
            pushes[name] = (keys, grads)
    pulls: dict[str, np.ndarray | None] | None = None
    if h["pull"] is not None:
        pulls = {}
        for name, n in h["pull"]:
            if n < 0:
                pulls[name] = None
                continue
            pulls[name] = np.frombuffer(body, dtype=np.int64, count=n, offset=off)
            off += 8 * n
    return {
        "worker": int(h["w"]),
        "clock": int(h["c"]),
        "pushes": pushes,
        "lr": float(h["lr"]),
        "pulls": pulls,
        "recovering": bool(h["r"]),
    }


def encode_reply(rows: Mapping[str, np.ndarray] | None, backed_up: int) -> list[bytes]:
    """The frame of a successful ``step``: its rows (or none) and the backup clock."""
    bufs: list[bytes] = []
    rows_h = None
    if rows is not None:
        rows_h = []
        for name, r in rows.items():
            a = np.ascontiguousarray(r)
            rows_h.append([name, int(a.shape[0]), int(a.shape[1]), a.dtype.str])
            bufs.append(a.tobytes())
    header = json.dumps({"ok": True, "b": backed_up, "rows": rows_h}).encode()
    return [PREFIX.pack(len(header), sum(len(b) for b in bufs)), header, *bufs]


def encode_error(kind: str, msg: str, args: list[Any]) -> list[bytes]:
    """The frame of a failed ``step``: the exception's type name, message and arguments."""
    header = json.dumps({"ok": False, "kind": kind, "msg": msg, "args": args}).encode()
    return [PREFIX.pack(len(header), 0), header]


def decode_reply(header: bytes, body: bytearray) -> tuple[bool, Any]:
    """``(True, (rows or None, backed_up))`` or ``(False, (kind, msg, args))``."""
    h = json.loads(header)
    if not h["ok"]:
        return False, (h["kind"], h["msg"], h["args"])
    rows = None
    if h["rows"] is not None:
        rows = {}
        off = 0
        for name, n, cols, dtype in h["rows"]:
            dt = np.dtype(dtype)
            rows[name] = np.frombuffer(body, dtype=dt, count=n * cols, offset=off).reshape(n, cols)
            off += dt.itemsize * n * cols
    return True, (rows, int(h["b"]))


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes from a blocking socket (ConnectionError if it closes first)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the shard closed the connection")
        got += k
    return buf
