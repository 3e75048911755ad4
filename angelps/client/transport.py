"""How a client process reaches the shards: the client side of the data plane.

Every per-step ``step`` call goes either over this process's TCP connection to the shard
(:class:`Channel`, frames of :mod:`angelps.client.wire`; ``angel.ps.transport=socket``), whatever its
size (a large call streams in bounded frames), or as a Ray actor call (``ray``, or when no
connection can be opened: the fallback). Control calls (save, load, stats, recovery) always
use Ray and do not pass through here.

Each connection has a reader thread that reads replies as they arrive, so a client sending a
large call never waits on a shard that waits for it to read a large reply, and the replies of
all shards are received while the worker computes.

Invariants: a caller's calls to one shard are served in the order sent, whatever their path
(before changing path, the calls in flight on the other path are waited for); a reply is read
once and kept by its :class:`SockRef`, so recovery may ask for it again; connections belong to
the process that opened them (never pickled).
"""

from __future__ import annotations

import socket
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from angelconf.printable import printable, uncoloured
from angelps.client import wire
from angelps.client.shared import (
    ALIGN,
    Arena,
    Placed,
    Regions,
    Segment,
    encode_map,
    encode_shared,
)
from angelps.options import ClientOptions
from angelps.server.shard import ShardRestarted
from angelps.step_call import Pulls, Pushes, StepCall, StepResult
from angelps.table import TableSpec

__all__ = [
    "Channel",
    "ChannelDown",
    "Pulls",
    "Pushes",
    "Ref",
    "Reply",
    "SockRef",
    "Transport",
    "call_bytes",
    "get_refs",
    "remote_error",
    "reply_bytes",
]

#: What a shard's ``step`` returns.
Reply: TypeAlias = StepResult


#: The first segment a connection shares with a shard on its node (angel.ps.shared.mib
#: bounds how far it doubles): a call of a few rows should not reserve tens of MB.
FIRST_SEGMENT = 4 << 20
#: The smallest call (body and reply) that makes a connection share a segment: below it the
#: socket costs about the same (docs/ps.md), and a connection that only carries small calls
#: (a few rows a step) reserves no memory (16 workers and 16 shards on a node would otherwise
#: hold 1 GiB of /dev/shm).
SHARE_FROM = 64 << 10


def _need(bufs: Sequence[bytes | memoryview], reply_bytes: int) -> int:
    """The bytes a call takes in a segment: its body and its reply, each region aligned."""
    return sum(memoryview(b).nbytes for b in bufs) + reply_bytes + 2 * ALIGN


class ChannelDown(Exception):
    """The TCP connection to a shard broke (the shard died): recovered like RayActorError."""


class Channel:
    """A client's TCP connection to one shard (angelps.client.wire): calls are sent at once, and a
    reader thread reads their replies in order, so several calls can be in flight, as with
    Ray's actor calls."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        #: The segment shared with the shard where it is on this node (:meth:`send_shared`).
        self.arena: Arena | None = None
        # seq -> the regions of a call in flight (their arena, its request's, its reply's)
        self._regions: dict[int, Regions] = {}
        self._no_share = False  # the shard cannot map a segment, or /dev/shm has no room
        self.sent = 0
        self.received = 0
        self.replies: dict[int, tuple[bool, Any]] = {}
        self.dead = False
        self._why = ""
        self._cond = threading.Condition()
        # (reentrant: a call that grows the shared segment sends the map call under it)
        self._send_lock = threading.RLock()
        self._reader = threading.Thread(target=self._read_loop, daemon=True, name="angelps-rx")
        self._reader.start()

    def send(
        self,
        frame: Sequence[bytes | memoryview],
        regions: Regions | None = None,
    ) -> SockRef:
        """Send one call; ``regions``: its request's and its reply's in a shared segment
        (freed when the reply arrives, the reply's once nothing reads it any more)."""
        with self._send_lock:
            if self.dead:
                raise ChannelDown("connection already broken")
            if regions is not None:
                self._regions[self.sent] = regions
            try:
                wire.send_buffers(self.sock, frame)
            except OSError as e:
                self._die(str(e))
                raise ChannelDown(str(e)) from None
            ref = SockRef(self, self.sent)
            self.sent += 1
            return ref

    def send_shared(
        self,
        head: dict[str, Any],
        bufs: Sequence[bytes | memoryview],
        reply_bytes: int,
        limit: int,
    ) -> SockRef:
        """A call (``head`` and its body ``bufs``: ``wire.request_parts``,
        ``wire.swap_parts``) with its body in the segment shared with the shard, where it is
        on this node and there is room for the body and the reply (``reply_bytes``: at least
        the reply's rows), else in the frame. The first call of :data:`SHARE_FROM` bytes or
        more offers the shard a segment of :data:`FIRST_SEGMENT` bytes (or the power of two
        that holds it); a call that does not fit grows it (:meth:`_grow`: a new segment,
        regions in the old one stay valid until freed), up to ``limit`` bytes (0: never)."""
        # All under the send lock: a call must reach the shard before any segment that
        # replaces the one it was written to (a copy here costs what a send of the same bytes
        # on the socket did under this lock).
        with self._send_lock:
            arena = self.arena
            if arena is None:
                if not limit or self._no_share:
                    return self.send(wire.frames(head, bufs))
                need = _need(bufs, reply_bytes)
                if need < SHARE_FROM:
                    return self.send(wire.frames(head, bufs))
                arena = self._grow(None, limit, need)
            placed = None
            if arena is not None:
                placed = encode_shared(head, bufs, arena, reply_bytes)
                if placed is None and arena.segment.size < limit:
                    grown = self._grow(arena, limit, _need(bufs, reply_bytes))
                    if grown is not arena and grown is not None:
                        arena = grown
                        placed = encode_shared(head, bufs, arena, reply_bytes)
            if placed is None or arena is None:
                return self.send(wire.frames(head, bufs))
            frame, (req, out) = placed
            regions = Regions(arena, req, out)
            try:
                return self.send(frame, regions)
            except ChannelDown:
                regions.free(None)
                raise

    def _grow(self, seen: Arena | None, limit: int, need: int = 0) -> Arena | None:
        """(Under the send lock.) The arena after ``seen``: a first segment of
        :data:`FIRST_SEGMENT` bytes or one twice as large as ``seen``'s, or the power of two
        that holds ``need`` bytes where that is larger (at most ``limit`` bytes), mapped by
        the shard in place of the previous one (whose calls are all served by then: one
        connection's calls are served in order). ``seen`` where the shard cannot map one
        (another node) or /dev/shm has no room for it, and no segment is offered again. The
        segment's name is removed either way: only the mappings remain."""
        if self._no_share:
            return seen
        size = FIRST_SEGMENT if seen is None else 2 * seen.segment.size
        size = min(limit, max(size, 1 << max(0, need - 1).bit_length()))
        try:
            segment = Segment.create(size)
        except OSError:  # no /dev/shm, or no room left in it
            self._no_share = True
            return seen
        try:
            self.send(encode_map(segment.name, size)).get()
        except (ValueError, ChannelDown):  # another node's shard cannot open it
            self._no_share = True
            segment.close()
            return seen
        finally:
            segment.unlink()
        # (the previous arena is unmapped when the last region in it is freed: calls in
        # flight still read their replies there)
        self.arena = Arena(segment)
        return self.arena

    def result(self, seq: int) -> Reply:
        with self._cond:
            while seq not in self.replies:
                if self.dead:
                    raise ChannelDown(f"connection broken ({self._why})")
                self._cond.wait()
            ok, value = self.replies.pop(seq)
        if ok:
            return value  # type: ignore[no-any-return]
        kind, msg, args = value
        if kind == "ShardRestarted":
            raise ShardRestarted(*args)
        exc = {"ValueError": ValueError, "TimeoutError": TimeoutError, "KeyError": KeyError}
        raise exc.get(kind, RuntimeError)(msg)

    def drain(self) -> None:
        """Wait for the replies of every call sent so far (kept for their refs): after this,
        the shard has served them all (or the connection broke)."""
        with self._cond:
            while self.received < self.sent and not self.dead:
                self._cond.wait()

    def _read_loop(self) -> None:
        """The reader thread: every reply, in order, until the connection closes."""
        while True:
            try:
                header, body = wire.recv_call(self.sock, wire.MAX_HEADER)
                regions = self._regions.pop(self.received, None)
                placed = Placed(regions)
                try:
                    reply = wire.decode_reply(header, body, placed)
                finally:
                    if regions is not None:
                        regions.free(placed.used)
            except (OSError, ValueError) as e:
                self._die(str(e) or type(e).__name__)
                return
            with self._cond:
                self.replies[self.received] = reply
                self.received += 1
                self._cond.notify_all()
            # (not kept while waiting for the next reply: rows in the shared segment are
            # freed when their last reader lets go)
            del reply, body

    def _die(self, why: str) -> None:
        with self._cond:
            if not self.dead:
                self.dead = True
                self._why = why
            self._cond.notify_all()

    def close(self) -> None:
        self._die("closed")
        self.arena = None  # (unmapped when the last region in it is freed)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class SockRef:
    """The reply of one call sent on a :class:`Channel` (what an ObjectRef is for Ray)."""

    __slots__ = ("channel", "error", "seq", "settled", "value")

    def __init__(self, channel: Channel, seq: int) -> None:
        self.channel = channel
        self.seq = seq
        self.settled = False
        self.value: Reply | None = None
        self.error: BaseException | None = None

    def get(self) -> Reply:
        # Kept: recovery asks again for calls whose replies were already read.
        if not self.settled:
            try:
                self.value = self.channel.result(self.seq)
            except Exception as e:
                self.error = e
            self.settled = True
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


#: A call in flight: a Ray ObjectRef of a ``step`` reply, or a socket reply.
Ref: TypeAlias = "ray.ObjectRef[Reply] | SockRef"


def get_refs(refs: Sequence[Ref]) -> list[Reply]:
    """Values of Ray ObjectRefs and socket replies (one ``ray.get`` for all the Ray ones)."""
    ray_refs = [r for r in refs if not isinstance(r, SockRef)]
    got = iter(ray.get(ray_refs)) if ray_refs else iter(())
    return [r.get() if isinstance(r, SockRef) else next(got) for r in refs]


class Transport:
    """This process's way to each shard of one job: a :class:`Channel` opened on first use,
    or Ray actor calls. Pickles as a fresh one (connections belong to a process)."""

    def __init__(self, handles: Sequence[ActorHandle], options: ClientOptions) -> None:
        self.handles = list(handles)
        self.options = options
        # None: not opened yet; False: this shard is reached through Ray actor calls.
        self.chans: list[Channel | bool | None] = [None] * len(self.handles)
        # Ray calls to each shard not known to be served yet (the fallback after a broken send).
        self.ray_refs: list[list[ray.ObjectRef[Any]]] = [[] for _ in self.handles]
        #: Bytes of the step calls made so far (request and reply, as :func:`call_bytes`).
        self.moved = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["chans"] = [None] * len(self.handles)
        state["ray_refs"] = [[] for _ in self.handles]
        return state

    def call(self, shard: int, call: StepCall, nbytes: int, reply_bytes: int = 0) -> Ref:
        """Send one ``step`` call of ``nbytes`` (request and reply, counted in ``moved``) over
        the connection, whatever its size (its body in memory shared with a shard on this
        node, ``reply_bytes`` at most the rows it pulls), or via Ray where the shard cannot be
        reached directly (waiting first for the calls in flight on the other path, so that
        the shard serves them in order)."""
        self.moved += nbytes
        secret = self.options.shard.token  # checked by the shard (server._check_secret)
        return self._send(
            shard,
            lambda ch: ch.send_shared(*wire.request_parts(call), reply_bytes, self._limit),
            lambda: self.handles[shard].step.remote(call, secret=secret),
        )

    def swap(
        self,
        shard: int,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
        reply_bytes: int,
    ) -> Ref | ray.ObjectRef[tuple[int, dict[str, np.ndarray]]]:
        """A device tier's swap with ``shard`` (angelps/client/tier_swap.py), as :meth:`call`
        sends a step: over the connection, in order with this process's ``step`` calls (a
        :class:`SockRef` of a reply whose ``pid`` is set; its body in memory shared with a
        shard on this node, ``reply_bytes`` the rows it reads), or as a Ray call (its ``(pid,
        rows)``). Not counted in ``moved``: the tier counts its own bytes."""
        secret = self.options.shard.token

        return self._send(
            shard,
            lambda ch: ch.send_shared(*wire.swap_parts(writes, reads), reply_bytes, self._limit),
            lambda: self.handles[shard].swap.remote(writes, reads, secret=secret),
        )

    @property
    def _limit(self) -> int:
        """The most bytes a connection shares with its shard (``angel.ps.shared.mib``)."""
        return self.options.shared_bytes

    def _send(
        self,
        shard: int,
        send: Callable[[Channel], SockRef],
        remote: Callable[[], ray.ObjectRef[Any]],
    ) -> Any:
        """``send(channel)`` over the connection to ``shard``, or ``remote()`` (a Ray call) where
        there is none or it just broke; the calls in flight on the other path are waited for
        first, so that the shard serves this process's calls in the order sent."""
        chan = self._channel(shard)
        if chan is not None:
            if self.ray_refs[shard]:
                ray.wait(self.ray_refs[shard], num_returns=len(self.ray_refs[shard]))
                self.ray_refs[shard] = []
            try:
                return send(chan)
            except ChannelDown:
                pass  # the shard died: the Ray call below fails too and recovery takes over
        ch = self.chans[shard]
        if isinstance(ch, Channel):
            ch.drain()
        ref = remote()
        if ch is not False and self.options.transport == "socket":
            pending = self.ray_refs[shard]
            pending.append(ref)
            if len(pending) > 8:  # forget the served ones (and do not keep their replies alive)
                _, self.ray_refs[shard] = ray.wait(pending, num_returns=len(pending), timeout=0)
        return ref

    def reconnect(self, shard: int) -> None:
        """Drop the connection to ``shard`` (it restarted): the next call opens a new one."""
        ch = self.chans[shard]
        if isinstance(ch, Channel):
            ch.close()
            self.chans[shard] = None

    def close(self) -> None:
        for ch in self.chans:
            if isinstance(ch, Channel):
                ch.close()
        self.chans = [None] * len(self.handles)

    def _channel(self, shard: int) -> Channel | None:
        """This process's connection to ``shard`` (opened on first use), or None for Ray calls."""
        ch = self.chans[shard]
        if isinstance(ch, Channel):
            if not ch.dead:
                return ch
            ch = None  # broken (the shard restarted): connect to the new one
        if ch is False or self.options.transport != "socket":
            return None
        try:
            sock = self._connect(shard)
        except (OSError, GetTimeoutError, RayTaskError, RayActorError) as e:
            # Unreachable from here (a firewall, a loopback-only shard on another node): the
            # shard still answers Ray actor calls, only slower.
            # A Ray error's text is the remote traceback (coloured): its last line says why.
            why = printable(uncoloured((str(e).strip().splitlines() or [""])[-1]))
            warnings.warn(
                f"angelps: no direct connection to parameter shard {shard} ({why}); using Ray "
                f"actor calls for it (angel.ps.transport=socket)",
                RuntimeWarning,
                stacklevel=4,
            )
            self.chans[shard] = False
            return None
        chan = Channel(sock)
        self.chans[shard] = chan
        return chan

    def _connect(self, shard: int) -> socket.socket:
        served: ray.ObjectRef[tuple[str, int]] = self.handles[shard].serve.remote(
            self.options.data_host
        )
        host, port = ray.get(served, timeout=self.options.shard.timeout_s)
        sock = socket.create_connection((host, port), timeout=10.0)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(self.options.shard.token.encode())
            # The shard acknowledges the token; a refused connection (its cap reached) ends
            # here, as an unreachable shard: this process then uses Ray calls for it.
            if wire.recv_exact(sock, len(wire.ACK)) != wire.ACK:
                raise ConnectionError("the shard did not accept the connection")
        except OSError as e:
            sock.close()
            raise ConnectionError(
                f"shard {shard} refused the data-plane connection ({e})"
            ) from None
        sock.settimeout(None)
        return sock


def reply_bytes(specs: Mapping[str, TableSpec], num_shards: int, pulls: Pulls | None) -> int:
    """At least the bytes of the rows a ``step`` call's ``pulls`` bring back (a dense
    table's block counted as the shard's share of its rows, plus one)."""
    n = 0
    for name, wanted in (pulls or {}).items():
        spec = specs[name]
        rows = spec.rows // num_shards + 1 if wanted is None else len(wanted)
        n += rows * spec.cols * np.dtype(spec.dtype).itemsize
    return n


def call_bytes(
    specs: Mapping[str, TableSpec], num_shards: int, pushes: Pushes | None, pulls: Pulls | None
) -> int:
    """Bytes a ``step`` call moves (request and reply), roughly (``specs``: TableSpec by name)."""
    n = 0
    for keys, grads in (pushes or {}).values():
        n += int(keys.nbytes) + int(grads.nbytes)
    for name, wanted in (pulls or {}).items():
        spec = specs[name]
        item = np.dtype(spec.dtype).itemsize
        if wanted is None:  # this shard's block of a dense table
            n += (spec.rows // num_shards + 1) * spec.cols * item
        else:
            n += len(wanted) * (8 + spec.cols * item)
    return n


def remote_error(e: RayTaskError) -> BaseException:
    """The user-facing error of a failed remote call: the remote ValueError/TimeoutError itself."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, (ValueError, TimeoutError, KeyError)):
        return cause
    return e
