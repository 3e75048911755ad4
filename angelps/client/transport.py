"""How a client process reaches the shards: the client side of the data plane.

Every per-step ``step`` call goes either over this process's TCP connection to the shard
(:class:`Channel`, frames of :mod:`angelps.client.wire`; ``angel.ps.transport=socket``), whatever its
size (a large call streams in bounded frames), or as a Ray actor call (``ray``, or when no
connection can be opened: the fallback). Control calls (save, load, stats, recovery) always
use Ray and do not pass through here.

Each connection has a reader thread that reads replies as they arrive, so a client sending a
large call never waits on a shard that waits for it to read a large reply, and the replies of
all shards are received while the worker computes.

A worker with a device tier opens a second connection to each shard for the tier's swaps
(:meth:`Transport.swap`): the shard serves a swap in pieces and answers the first
connection's step calls between them, instead of after the whole swap.

Invariants: a caller's step calls to one shard are served in the order sent, whatever their
path (before changing path, the calls in flight on the other path are waited for), and so are
its swaps (on their own connection, else with the step calls); a reply is read once and kept
by its :class:`SockRef`, so recovery may ask for it again; connections belong to the process
that opened them (never pickled).
"""

from __future__ import annotations

import socket
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from angelconf.printable import printable, uncoloured
from angelps.client import wire
from angelps.client.channel import (
    FIRST_SEGMENT,
    SHARE_FROM,
    Channel,
    ChannelDown,
    Reply,
    SockRef,
)
from angelps.options import ClientOptions
from angelps.server.shard import NotReplayed, SaveLost
from angelps.step_call import Pulls, Pushes, StepCall
from angelps.table import TableSpec

__all__ = [
    "FIRST_SEGMENT",
    "SHARE_FROM",
    "WATCH_S",
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
    "raise_failed",
    "remote_error",
    "reply_bytes",
    "settled",
]

#: A call in flight: a Ray ObjectRef of a ``step`` reply, or a socket reply.
Ref: TypeAlias = "ray.ObjectRef[Reply] | SockRef"


#: How long a wait for one reply lasts before the other calls are looked at for a failure.
#: A worker whose call to one shard waits for another worker (BSP) must still see at once
#: that its call to another shard failed: the other worker may be waiting for its replay
#: to that shard (docs/checkpoints.md, "Recovery from a dead shard").
WATCH_S = 0.2


def get_refs(refs: Sequence[Ref]) -> list[Reply]:
    """Values of Ray ObjectRefs and socket replies (one ``ray.get`` for all the Ray ones).
    Raises the error of the first call known to have failed, without waiting for the
    replies of the others (looked at every :data:`WATCH_S` of a wait)."""
    for r in refs:
        if isinstance(r, SockRef):
            while not r.wait(WATCH_S):
                raise_failed(refs)
    ray_refs = [r for r in refs if not isinstance(r, SockRef)]
    got: Iterator[Reply] = iter(())
    while ray_refs:
        try:
            got = iter(ray.get(ray_refs, timeout=WATCH_S))
            break
        except GetTimeoutError:
            raise_failed(refs)
    return [r.get() if isinstance(r, SockRef) else next(got) for r in refs]


def settled(ref: Ref, timeout_s: float = 0.0) -> bool:
    """Whether ``ref``'s reply came, or its call failed, within ``timeout_s``."""
    if isinstance(ref, SockRef):
        return ref.wait(timeout_s)
    ready, _ = ray.wait([ref], timeout=timeout_s)
    return bool(ready)


def raise_failed(refs: Sequence[Ref]) -> None:
    """Raise the error of the first of ``refs`` known to have failed (none waited for)."""
    for r in refs:
        if isinstance(r, SockRef):
            if r.failed():
                r.get()
        elif settled(r):
            ray.get(r)  # (a value here is a served call: nothing to raise)


class Transport:
    """This process's way to each shard of one job: a :class:`Channel` opened on first use,
    or Ray actor calls. Pickles as a fresh one (connections belong to a process)."""

    def __init__(self, handles: Sequence[ActorHandle], options: ClientOptions) -> None:
        self.handles = list(handles)
        self.options = options
        # None: not opened yet; False: this shard is reached through Ray actor calls.
        self.chans: list[Channel | bool | None] = [None] * len(self.handles)
        # A second connection to each shard for a device tier's swaps (as chans; False: the
        # first carries them).
        self.swap_chans: list[Channel | bool | None] = [None] * len(self.handles)
        # Ray calls to each shard not known to be served yet (the fallback after a broken send).
        self.ray_refs: list[list[ray.ObjectRef[Any]]] = [[] for _ in self.handles]
        # Held while a connection is opened (reentrant: a swap's opens the first one too).
        self._opening = threading.RLock()
        #: Bytes of the step calls made so far (request and reply, as :func:`call_bytes`).
        self.moved = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["chans"] = [None] * len(self.handles)
        state["swap_chans"] = [None] * len(self.handles)
        state["ray_refs"] = [[] for _ in self.handles]
        del state["_opening"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._opening = threading.RLock()

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
        """A device tier's swap with ``shard`` (angelps/client/tier_swap.py): over a second
        connection to it, for swaps only (:meth:`_swap_channel`: served in order with this
        process's other swaps, in pieces between which the shard answers the ``step`` calls
        of the first), else as :meth:`call` sends a step (in order with them); a
        :class:`SockRef` of a reply whose ``pid`` is set (its body in memory shared with a
        shard on this node, ``reply_bytes`` the rows it reads), or a Ray call's ``(pid,
        rows)``. Not counted in ``moved``: the tier counts its own bytes."""
        secret = self.options.shard.token

        def send(ch: Channel) -> SockRef:
            return ch.send_shared(*wire.swap_parts(writes, reads), reply_bytes, self._limit)

        chan = self._swap_channel(shard)
        if chan is not None:
            try:
                return send(chan)
            except ChannelDown:
                pass  # the shard died: the call below fails too and the tier learns of it
        return self._send(
            shard, send, lambda: self.handles[shard].swap.remote(writes, reads, secret=secret)
        )

    def _swap_channel(self, shard: int) -> Channel | None:
        """This process's connection for swaps with ``shard``, opened beside the first once
        that one is (a tier's swap took 8-9 ms of an H200 node's shard; on the first
        connection the worker's step call waited behind it). None where there is no first
        connection (Ray calls) or no second can be opened (the shard's connection cap): the
        first carries the swaps then."""
        ch = self.swap_chans[shard]
        if isinstance(ch, Channel) and not ch.dead:
            return ch
        if ch is False:
            return None
        # (a tier swaps from its update thread and its training thread: one connection opened)
        with self._opening:
            ch = self.swap_chans[shard]
            if isinstance(ch, Channel) and not ch.dead:
                return ch
            if self._channel(shard) is None:
                return None
            try:
                sock = self._connect(shard)
            except RayActorError:
                return None  # (restarting: as :meth:`_open`)
            except (OSError, GetTimeoutError, RayTaskError):
                self.swap_chans[shard] = False
                return None
            chan = self.swap_chans[shard] = Channel(sock)
            return chan

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
        """Drop the connections to ``shard`` (it restarted): the next call opens new ones,
        even where the process before could not be reached (the new one may be elsewhere)."""
        for chans in (self.chans, self.swap_chans):
            ch = chans[shard]
            if isinstance(ch, Channel):
                ch.close()
            chans[shard] = None

    def close(self) -> None:
        for ch in (*self.chans, *self.swap_chans):
            if isinstance(ch, Channel):
                ch.close()
        self.chans = [None] * len(self.handles)
        self.swap_chans = [None] * len(self.handles)

    def _channel(self, shard: int) -> Channel | None:
        """This process's connection to ``shard`` (opened on first use), or None for Ray calls."""
        ch = self.chans[shard]
        if isinstance(ch, Channel) and not ch.dead:
            return ch
        if ch is False or self.options.transport != "socket":
            return None
        with self._opening:
            ch = self.chans[shard]
            if isinstance(ch, Channel) and not ch.dead:  # (opened by another thread meanwhile)
                return ch
            if ch is False:
                return None
            # (else none yet, or broken: the shard restarted, connect to the new one)
            return self._open(shard)

    def _open(self, shard: int) -> Channel | None:
        try:
            sock = self._connect(shard)
        except RayActorError:
            # Restarting (or dead): this call goes by Ray and fails, the recovery reconnects
            # and the next call opens a connection to the new process. Not a reason to give
            # the connection up for good (the job's calls to it all went by Ray after a
            # restart before).
            return None
        except (OSError, GetTimeoutError, RayTaskError) as e:
            # Unreachable from here (a firewall, a loopback-only shard on another node): the
            # shard still answers Ray actor calls, only slower.
            # A Ray error's text is the remote traceback (coloured): its last line says why.
            why = printable(uncoloured((str(e).strip().splitlines() or [""])[-1]))
            warnings.warn(
                f"angelps: no direct connection to parameter shard {shard} ({why}); using Ray "
                f"actor calls for it (angel.ps.transport=socket)",
                RuntimeWarning,
                stacklevel=5,  # (the caller of call() or swap())
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
    if isinstance(cause, (ValueError, TimeoutError, KeyError, NotReplayed, SaveLost)):
        return cause
    return e
