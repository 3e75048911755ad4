"""The data plane's server half in a shard actor (:class:`DataPlane`, a part of
:class:`angelps.server.shard_server.ShardServer`): a TCP server on the actor's event loop,
guarded by the job's token, that reads each connection's calls (frames of
:mod:`angelps.client.wire`, bodies possibly in memory shared with the client) in order and
answers each: a step, a device tier's swap (answered once its rows are read, its write-backs
done before the connection's next call), or a shared segment to map.

Invariants: a data-plane peer cannot take the shard down: at most ``angel.ps.max.connections``
connections are open (the rest are closed at once and counted), a connection that has not
sent the token within ``angel.ps.token.timeout.ms`` is closed, a frame longer than
:class:`~angelps.client.wire.FrameLimits` allows closes its connection before anything is
read, a malformed one is answered with an error, and replies a peer does not read stop its
connection (not the shard) once :data:`MAX_UNREAD` bytes wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray

from angelps.client import wire
from angelps.client.shared import ShardSegment, decode_map, is_map, shared_regions
from angelps.server.shard import ParameterShard, ShardRestarted
from angelps.server.shard_swap import answer, write_back
from angelps.step_call import StepCall, StepResult

__all__ = ["AUTHENTICATED", "MAX_UNREAD", "DataPlane"]

#: Reply bytes a connection may leave unread before the shard stops reading its next calls.
MAX_UNREAD = 16 * wire.MAX_FRAME_BYTES
#: What the data plane passes as the secret of a call it has authenticated already: an object,
#: so no Ray caller can present it (an argument sent through Ray arrives as a copy).
AUTHENTICATED = object()


class DataPlane:
    """The TCP half of a shard actor, with a device tier's swaps on a thread of their own
    (served by the actor's Ray method too); the actor provides the step calls it serves."""

    shard: ParameterShard
    _token: bytes
    _server: asyncio.Server | None
    _limits: wire.FrameLimits
    _token_timeout_s: float
    _max_connections: int
    _conns: dict[str, int]
    #: calls served and the seconds of their rows' work (the shard's stats)
    _served: dict[str, Any]
    _swap_lock: asyncio.Lock | None
    #: the tables of the swap holding the lock (empty: none)
    _swap_tables: frozenset[str]
    #: the thread swaps run on (made at the first)
    _swap_thread: ThreadPoolExecutor | None

    async def step(self, call: StepCall, secret: Any = "") -> StepResult:
        raise NotImplementedError

    async def _swap_reads(
        self,
        writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        reads: Mapping[str, np.ndarray],
        lent: bool = False,
        outs: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[dict[str, np.ndarray], Callable[[], Awaitable[None]]]:
        """A swap's rows read, and the rest of it to await: the write-backs of rows it does
        not read, which may follow the reads (:func:`split_writes`), which the data plane
        awaits once it has sent the rows. Both run on the swaps' thread, off the event loop,
        which serves other calls meanwhile (:meth:`_swap_clear`). The swap holds its lock
        until the rest is done. ``lent``: the write-backs' arrays are the caller's again once
        it has the answer (a body in memory shared with the client): copied first where
        written after. ``outs``: where to gather the rows (:meth:`_reply_rows`)."""
        lock = self._swapping()
        await lock.acquire()
        par = self.shard.swap_par
        self._swap_tables = frozenset(writes) | frozenset(reads)
        try:
            table = self.shard._table
            rows, later = await self._off_loop(answer, table, writes, reads, lent, par, outs)
        except BaseException:
            self._swap_tables = frozenset()
            lock.release()
            raise

        async def rest() -> None:
            try:
                await self._off_loop(write_back, table, later, par)
            finally:
                self._swap_tables = frozenset()
                lock.release()
            self._served["swaps"] += 1

        return rows, rest

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the swaps' thread, its seconds counted as the swaps' work. A
        caller cancelled meanwhile still waits for the thread to end (its rows are being
        written: the swap's lock is not released under it), then is cancelled."""
        served = self._served

        def timed() -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                served["swap_s"] += time.perf_counter() - t0

        if self._swap_thread is None:
            self._swap_thread = ThreadPoolExecutor(1, thread_name_prefix="angelps-swap")
        done = asyncio.get_running_loop().run_in_executor(self._swap_thread, timed)
        cancelled = False
        while True:
            try:
                result = await asyncio.shield(done)
                break
            except asyncio.CancelledError:
                if done.done():
                    raise
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        return result

    async def _swap_clear(self, names: Iterable[str], backup: bool = False) -> None:
        """Wait for a swap in progress if it holds any of the tables ``names`` (or any table
        at all, for ``backup``: a backup or a save expires rows in every table). A caller
        touches its tables right after this, with no await in between, so no swap starts
        under it."""
        lock = self._swap_lock
        while lock is not None and lock.locked():
            if not backup and self._swap_tables.isdisjoint(names):
                return
            async with lock:  # (the swap's end; queued swaps come after this caller)
                pass

    def _reply_rows(
        self, reads: Mapping[str, np.ndarray], region: tuple[Any, int, int] | None
    ) -> dict[str, np.ndarray] | None:
        """Arrays over a swap's reply region in memory shared with the client, laid out as
        :func:`wire.encode_reply` lays out rows there, for the swap to gather its rows into
        (no copy of them into the region after); None without a region, for a table this
        shard does not hold (the swap fails on it), or rows that do not fit."""
        if region is None:
            return None
        segment, off, size = region
        tables = self.shard.tables
        if any(name not in tables for name in reads):
            return None
        shapes = [
            (name, len(k), tables[name].width, tables[name].dtype) for name, k in reads.items()
        ]
        total = sum(n * width * dtype.itemsize for _, n, width, dtype in shapes)
        if total > size:
            return None
        buf = segment.view(off, total)
        outs, pos = {}, 0
        for name, n, width, dtype in shapes:
            nbytes = n * width * dtype.itemsize
            outs[name] = buf[pos : pos + nbytes].view(dtype).reshape(n, width)
            pos += nbytes
        return outs

    def _swapping(self) -> asyncio.Lock:
        """The lock a swap holds until its write-backs are done (made on the actor's loop)."""
        if self._swap_lock is None:
            self._swap_lock = asyncio.Lock()
        return self._swap_lock

    async def serve(self, host: str) -> tuple[str, int]:
        """Listen for ``step`` calls over TCP on ``host`` (angelps.client.wire); returns the address.

        Idempotent: every client of the job connects to the same server. The server runs on
        the actor's event loop, so its calls interleave with actor calls exactly as actor
        calls interleave with each other (one at a time, waiting only for clocks).
        """
        if not self._token:
            raise ValueError("this shard has no data-plane token (launched without one)")
        if self._server is None:
            if not host:  # a cluster: this node's address, reachable from other nodes
                host = ray.util.get_node_ip_address()
            self._server = await asyncio.start_server(self._serve_connection, host, 0)
        addr = self._server.sockets[0].getsockname()
        return str(addr[0]), int(addr[1])

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One client's connection: the token, then its calls in order, each answered."""
        conns = self._conns
        if conns["open"] >= self._max_connections:
            conns["refused"] += 1
            writer.transport.abort()
            return
        conns["open"] += 1
        try:
            if await self._authenticate(reader):
                writer.write(wire.ACK)
                await self._serve_calls(reader, writer)
            else:
                conns["dropped"] += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            conns["open"] -= 1
            writer.close()

    async def _authenticate(self, reader: asyncio.StreamReader) -> bool:
        """The job's token within the deadline (a constant-time comparison)."""
        try:
            token = await asyncio.wait_for(
                reader.readexactly(wire.TOKEN_BYTES), self._token_timeout_s
            )
        except (asyncio.TimeoutError, asyncio.IncompleteReadError):
            return False
        return bool(self._token) and hmac.compare_digest(token, self._token[: wire.TOKEN_BYTES])

    async def _serve_calls(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Calls until the peer goes away or announces a frame over the limits."""
        shared = ShardSegment()
        try:
            await self._serve_loop(reader, writer, shared)
        finally:
            shared.close()

    async def _serve_loop(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, shared: ShardSegment
    ) -> None:
        while True:
            try:
                call = await self._read_call(reader)
            except asyncio.IncompleteReadError:
                return  # the client went away
            if call is None:
                self._conns["dropped"] += 1
                return  # not a frame of ours: drop the connection, read no more of it
            header, body = call
            # No drain() per reply: the client may be sending its next call while this reply
            # waits to be read; blocking here would stop reading and deadlock both. Only a
            # peer that leaves MAX_UNREAD bytes unread waits (and only on its connection).
            frames, rest = await self._answer_first(header, body, shared)
            writer.writelines(frames)
            if rest is not None:  # (a swap's write-backs, once its rows are on their way)
                try:
                    await rest()
                except Exception:
                    # Answered, but not all written back: this connection ends, so that the
                    # tier's next call fails (it restarts from its checkpoint), never silently.
                    self._conns["dropped"] += 1
                    return
            if writer.transport.get_write_buffer_size() > MAX_UNREAD:
                await writer.drain()

    async def _read_call(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
        """One call's header and body (its frames joined), or None for a frame over the limits
        (checked before each frame is read; a body is kept only as its frames arrive)."""
        limits = self._limits
        hlen, blen = wire.PREFIX.unpack(await reader.readexactly(wire.PREFIX.size))
        if hlen > limits.max_header or blen > limits.max_frame:
            return None
        header = await reader.readexactly(hlen)
        try:
            total = wire.stream_length(header, blen)
        except ValueError:
            return None
        if total > limits.max_body:
            return None
        chunks = [await reader.readexactly(blen) if blen else b""]
        got = blen
        while got < total:
            hlen, blen = wire.PREFIX.unpack(await reader.readexactly(wire.PREFIX.size))
            if hlen != 0 or not 0 < blen <= min(limits.max_frame, total - got):
                return None
            chunks.append(await reader.readexactly(blen))
            got += blen
        return header, chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _answer(
        self, header: bytes, body: bytes, shared: ShardSegment
    ) -> Sequence[bytes | memoryview]:
        """The reply frame of one request frame: its rows, or its error (the call done)."""
        frames, rest = await self._answer_first(header, body, shared)
        if rest is not None:
            await rest()
        return frames

    async def _answer_first(
        self, header: bytes, body: bytes, shared: ShardSegment
    ) -> tuple[Sequence[bytes | memoryview], Callable[[], Awaitable[None]] | None]:
        """The reply frame of one request frame (its rows, or its error), and what is left of
        the call to await once the reply is sent (a swap's write-backs: :meth:`_swap_reads`),
        or None."""
        rest = None
        try:
            into, out = shared_regions(header)
            data: wire.Body = body
            if into is not None:
                if body:
                    raise ValueError("a call with a body both in the frame and shared")
                data = shared.segment().view(into[0], into[1])
            region = None
            if out is not None:
                seg = shared.segment()
                seg.view(out[0], out[1])  # (ValueError outside the segment)
                region = (seg, out[0], out[1])
            if wire.is_swap(header):  # a device tier's (checked by check_swap)
                writes, reads = wire.decode_swap(header, data)
                outs = self._reply_rows(reads, region)
                # (a body in shared memory that its client frees once answered is copied
                # where read after the answer; a swap's client keeps it until the next reply)
                lent = into is not None and not wire.swap_keeps_body(header)
                rows, rest = await self._swap_reads(writes, reads, lent, outs)
                try:
                    result = StepResult(rows, 0, os.getpid())
                    return wire.encode_reply(result, region, placed=outs is not None), rest
                except BaseException:
                    await rest()
                    raise
            if is_map(header):
                shared.attach(*decode_map(header))
                return wire.encode_reply(StepResult(None, 0)), None
            # (a decoded call is never marked checked: the shard validates it)
            call = wire.decode_request(header, data)
            if into is not None and call.pushes and self.shard.keeps_pushes:
                # Its region is the client's again once this is answered: a push kept until
                # the other workers' pushes of its clock arrive is copied first.
                pushes = {n: (k.copy(), g.copy()) for n, (k, g) in call.pushes.items()}
                call = dataclasses.replace(call, pushes=pushes)
            return wire.encode_reply(await self.step(call, secret=AUTHENTICATED), region), None
        except ShardRestarted as e:
            err = wire.encode_error("ShardRestarted", str(e), [e.shard, e.worker, e.clock])
        except (ValueError, TimeoutError, KeyError) as e:
            err = wire.encode_error(type(e).__name__, str(e), [])
        except Exception as e:  # reported to the caller, not lost in the actor's log
            err = wire.encode_error("RuntimeError", f"{type(e).__name__}: {e}", [])
        return err, None
