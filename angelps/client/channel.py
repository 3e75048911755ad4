"""One TCP connection from a client process to a shard (the data plane,
:mod:`angelps.client.wire`): :class:`Channel` sends calls at once and a reader thread reads
their replies in order, so several calls can be in flight; a call's body and reply may live
in a segment of memory shared with a shard on the same node. :mod:`angelps.client.transport`
chooses a connection (or a Ray call) for each call.

Invariants: a connection's calls are served by the shard in the order sent, and their replies
read in that order; a reply is read once and kept by its :class:`SockRef`, so recovery may ask
for it again; a connection belongs to the process that opened it (never pickled).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any, TypeAlias

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
from angelps.server.shard import ShardRestarted
from angelps.step_call import StepResult

__all__ = ["FIRST_SEGMENT", "SHARE_FROM", "Channel", "ChannelDown", "Reply", "SockRef"]

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
        # a swap's request region kept past its reply, freed at the next reply (Regions.keep)
        self._kept: Regions | None = None
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
            regions = Regions(arena, req, out, keep=bool(head.get("keep")))
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

    def wait_reply(self, seq: int, timeout_s: float) -> bool:
        """Whether call ``seq``'s reply came (or the connection broke) within ``timeout_s``."""
        with self._cond:
            return self._cond.wait_for(lambda: seq in self.replies or self.dead, timeout_s)

    def failed(self, seq: int) -> bool:
        """Whether call ``seq`` is known to have failed (its reply is an error, or the
        connection broke before it came), without waiting."""
        with self._cond:
            got = self.replies.get(seq)
            return self.dead if got is None else not got[0]

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
                    # (the shard has served the call before this one whole: a region it
                    # still read from after answering is free now)
                    self._free_kept()
                    if regions is not None:
                        if regions.keep and regions.req is not None:
                            kept = Regions(regions.arena, regions.req, None)
                            regions.req = None
                            with self._cond:
                                self._kept = kept
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

    def _free_kept(self) -> None:
        with self._cond:
            kept, self._kept = self._kept, None
        if kept is not None:
            kept.free_request()

    def _die(self, why: str) -> None:
        with self._cond:
            if not self.dead:
                self.dead = True
                self._why = why
            self._cond.notify_all()
        self._free_kept()

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

    def wait(self, timeout_s: float) -> bool:
        """Whether the reply is here (or the call failed) within ``timeout_s``."""
        return self.settled or self.channel.wait_reply(self.seq, timeout_s)

    def failed(self) -> bool:
        """Whether :meth:`get` would raise, known without waiting."""
        return self.error is not None if self.settled else self.channel.failed(self.seq)

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
