"""Request tracking on the client, and recovery from a shard that died and was restarted.

Each ``step`` call in flight is a :class:`Call` (its shard, its reply's ref, and the pull to
redo). With shard backups on (``angel.ps.backup.interval > 0``), a worker's client keeps a
:class:`ReplayLog`: per shard, the push calls (:class:`~angelps.step_call.StepCall`) it sent
since the last backup that shard reported
(each reply carries the worker's clock held by the shard's latest backup, and the log is
trimmed to it). When a call fails because its shard died, Ray restarts the shard, which
restores its latest backup and refuses the worker's calls (``ShardRestarted``) until the
client has replayed its logged pushes from the restored clock; then the failed pulls are
redone (:meth:`ReplayLog.recover`).

Invariant: updates are redone, never silently dropped: a log that does not reach back to the
restored clock is an error. A shard that dies again during its recovery is recovered again
(it restored its backup once more), as long as Ray restarts it.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from angelps.client.transport import (
    WATCH_S,
    ChannelDown,
    Ref,
    Reply,
    Transport,
    get_refs,
    remote_error,
    settled,
)
from angelps.memory_kills import MemoryKill, memory_kills, now_ms
from angelps.server.shard import NotReplayed, SaveLost, ShardRestarted
from angelps.step_call import Pulls, StepCall, StepResult

__all__ = [
    "FAILURES",
    "RECOVERY_ROUNDS",
    "SHARD_LOST",
    "UNAVAILABLE_WAITS",
    "Call",
    "ReplayLog",
    "ask_available",
    "dead_for_good",
    "is_restart",
]

#: Errors of a call whose shard died (or was restarted): recovered, not raised.
FAILURES = (RayActorError, ShardRestarted, ChannelDown)

#: Errors of a control call (a save) whose shard died, was restarted from a backup without
#: every worker's pushes since (NotReplayed), or was restarted while it wrote its part
#: (SaveLost): nothing was committed; the workers catch up (:meth:`ReplayLog.catch_up`) and
#: the save may be made again.
SHARD_LOST = (RayActorError, NotReplayed, SaveLost)


#: Times a worker's recovery of one shard (its replay, then its pulls redone) is made when the
#: shard dies again during it (Ray restarts it from its backup each time, up to
#: angel.ps.max-attempts).
RECOVERY_ROUNDS = 8

#: Seconds between the asks of :func:`ask_available` (then once more, its error raised).
UNAVAILABLE_WAITS = (0.1, 0.3, 1.0)

T = TypeVar("T")


def ask_available(
    ask: Callable[[], Sequence[ray.ObjectRef[T]]],
    get: Callable[[Sequence[ray.ObjectRef[T]]], list[T]],
    timeout_s: float,
    waits: Sequence[float] = UNAVAILABLE_WAITS,
) -> list[T]:
    """``get`` of the calls ``ask`` makes, made again while a shard answers "unavailable": one
    Ray is restarting ("the actor is restarting"), or a handle's first Ray call to one it
    restarted (the steps went over the data plane since), which can fail so though the new
    one is up. Asked again after each of ``waits`` seconds, then every last one of them,
    until ``timeout_s`` seconds have passed (then its error is raised). For calls that change
    nothing, or nothing more when made again."""
    deadline = time.monotonic() + timeout_s
    k = 0
    while True:
        try:
            return get(ask())
        except ActorUnavailableError:
            wait = waits[min(k, len(waits) - 1)] if waits else 0.0
            if time.monotonic() + wait > deadline:
                raise
            time.sleep(wait)
            k += 1


def _get_all(refs: Sequence[ray.ObjectRef[T]]) -> list[T]:
    try:
        return ray.get(list(refs))  # type: ignore[no-any-return]
    except RayTaskError as e:
        raise remote_error(e) from None


class Call:
    """One ``step`` call to one shard, with what is needed to redo its pull after a restart."""

    __slots__ = ("clock", "pulls", "ref", "shard")

    def __init__(self, shard: int, ref: Ref, clock: int, pulls: Pulls | None) -> None:
        self.shard = shard
        self.ref = ref
        self.clock = clock  # the clock its pull is served at
        self.pulls = pulls


def _again(shard: int) -> str:
    return (
        f"parameter shard {shard} died again during each of {RECOVERY_ROUNDS} recoveries; giving up"
    )


def dead_for_good(shard: int, e: ActorDiedError) -> str:
    """The one line that reports a shard Ray will not restart again, with Ray's reason."""
    why = next(
        (ln.strip() for ln in str(e).splitlines() if ln.strip().startswith("The actor is dead")),
        "",
    )
    why = why.split(". ")[0].rstrip(".")
    return (
        f"parameter shard {shard} died and Ray will not restart it again: the starts "
        f"angel.ps.max-attempts allows are used up (or its restart failed)"
        + (f"; Ray says: {why}" if why else "")
        + "; raise angel.ps.max-attempts to survive more failures"
    )


def is_restart(e: RayTaskError) -> bool:
    """A remote call refused because its shard restarted (the client must replay)."""
    return isinstance(getattr(e, "cause", None), ShardRestarted)


class ReplayLog:
    """One worker's pushes to each shard since that shard's last backup."""

    def __init__(
        self, handles: Sequence[ActorHandle], worker_id: int, enabled: bool, timeout_s: float
    ) -> None:
        self.handles = list(handles)
        self.worker_id = worker_id
        self.enabled = enabled
        self.timeout_s = timeout_s
        #: Ray's memory kills of this job's processes from then on are named in the warning
        #: that a shard was recovered.
        self.since_ms = now_ms()
        #: The job's secret, which the shards check on every call (set by the client).
        self.secret = ""
        # per shard: the push calls sent to it, as they are replayed (StepCall.replayed)
        self.entries: list[collections.deque[StepCall]] = [collections.deque() for _ in handles]

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()  # the log belongs to this process's pushes
        state["entries"] = [collections.deque() for _ in self.handles]
        return state

    def record(self, shard: int, call: StepCall) -> None:
        """Keep the push of ``call`` (sent to ``shard``) until a backup holds it."""
        if self.enabled:
            self.entries[shard].append(call.replayed())

    def trim(self, shard: int, backed_up: int) -> None:
        """Forget the pushes older than the clock the shard's latest backup holds."""
        log = self.entries[shard]
        while log and log[0].clock < backed_up:
            log.popleft()

    def clear(self) -> None:
        for log in self.entries:
            log.clear()

    def recover(self, calls: Sequence[Call], net: Transport, clock: int) -> list[Reply]:
        """Some shard died. Wait for Ray to restart it (it restores its latest backup), replay
        this worker's logged pushes from the clock the shard came back at, then redo the
        pulls of the failed calls. ``clock``: this worker's next clock.

        A shard is replayed as soon as its own calls are answered or failed, whatever the
        other shards' calls wait for: under BSP the call to another shard may wait for a
        worker that itself waits for this replay (it redoes a pull that needs this worker's
        pushes the restored shard lacks). The pulls are redone as calls in flight like the
        others, so no wait here holds up another shard's replay."""
        results: list[Reply | None] = [None] * len(calls)
        waiting = {i: c.ref for i, c in enumerate(calls)}  # calls (or redone pulls) in flight
        lost: set[int] = set()  # shards with a failed call, not replayed since
        rounds: collections.Counter[int] = collections.Counter()
        while waiting or lost:
            for i, ref in list(waiting.items()):
                if not settled(ref):
                    continue
                del waiting[i]
                try:
                    results[i] = get_refs([ref])[0]
                except FAILURES:
                    lost.add(calls[i].shard)
                except RayTaskError as e:
                    if not is_restart(e):
                        raise remote_error(e) from None
                    lost.add(calls[i].shard)
            if lost and not self.enabled:
                raise RuntimeError(
                    f"parameter shard(s) {sorted(lost)} died and shard backups are off "
                    f"(angel.ps.backup.interval=0): their rows are lost; set "
                    f"angel.ps.backup.interval > 0 to let shards restart and recover"
                )
            # (a shard's calls still in flight are failing too: its replay waits for them)
            for s in sorted(lost - {calls[i].shard for i in waiting}):
                lost.discard(s)
                rounds[s] += 1
                if rounds[s] > RECOVERY_ROUNDS:
                    raise RuntimeError(_again(s))
                self._recover_shard(s, clock, net)
                for i, c in enumerate(calls):
                    if c.shard == s and results[i] is None and c.pulls:
                        redo = StepCall(
                            self.worker_id, c.clock, pulls=c.pulls, recovering=True, checked=True
                        )
                        waiting[i] = self.handles[s].step.remote(redo, secret=self.secret)
            if waiting:  # (a lost shard's call first: it fails at once)
                first = min(waiting, key=lambda i: calls[i].shard not in lost)
                settled(waiting[first], WATCH_S)
        return [StepResult(None, 0) if r is None else r for r in results]

    def _recover_shard(self, shard: int, clock: int, net: Transport) -> int:
        """Replay this worker's pushes to ``shard`` (restarted); the pushes replayed. A shard
        that dies again meanwhile is restarted by Ray from its backup once more: the replay is
        made again, up to :data:`RECOVERY_ROUNDS` times; one Ray will not restart fails at
        once (naming the key that bounds it)."""
        for _ in range(RECOVERY_ROUNDS):
            net.reconnect(shard)
            try:
                start, replayed = self._replay(shard, clock)
            except ActorDiedError as e:
                raise RuntimeError(dead_for_good(shard, e)) from None
            except RayActorError:
                continue  # (died again: restored from its backup again)
            except RayTaskError as e:
                if not is_restart(e):
                    raise remote_error(e) from None
                continue
            self.warn(shard, start, replayed)
            return replayed
        raise RuntimeError(_again(shard))

    def warn(self, shard: int, start: int, replayed: int) -> None:
        """What failed and what was done, on the console (a worker's stderr reaches the
        driver's through Ray). A kill for memory may be a passing peak (a checkpoint's copy of
        the tables): the shard is recovered as Ray's restarts allow, but the job's processes
        Ray killed for memory since this client started, the likely cause, are named with what
        would keep it away (by now Ray's worker table has the kill: no wait for it)."""
        kills: Sequence[MemoryKill] = memory_kills(self.since_ms, settle_s=0.0)
        why = ""
        if kills:
            each = ", ".join(
                f"pid {k.pid}" + (f" ({k.used_bytes / 2**30:.2f} GiB)" if k.used_bytes else "")
                for k in kills
            )
            why = (
                f" (Ray killed the job's process(es) {each} because the node ran low on "
                f"memory; to keep it from happening again: more shard actors on more nodes, "
                f"angel.ps.number, or checkpoints written without a copy of the tables, "
                f"angel.save.model.async=false)"
            )
        print(
            f"angelps: warning: parameter shard {shard} died{why}; Ray restarted it and it "
            f"restored its backup at clock {start} of worker {self.worker_id}, which replayed "
            f"{replayed} push(es) since; training goes on",
            file=sys.stderr,
            flush=True,
        )

    def catch_up(self, net: Transport, clock: int, waits: Sequence[float]) -> int:
        """Make every shard hold this worker's ``clock`` pushes (all answered): a shard Ray
        restarted from a backup since gets the pushes it lacks replayed (as after a failed
        call); every shard notes that the worker has nothing left to replay, so that a
        checkpoint may be written (a shard refuses one before: it would lack those pushes).
        Before a save, as no step of this worker may come to find the restart first.
        ``waits``: as :func:`ask_available`'s (a shard being restarted is waited for, up to
        the client's timeout). Returns the pushes replayed."""

        def ask() -> list[ray.ObjectRef[int]]:
            return [
                h.catch_up.remote(self.worker_id, clock, secret=self.secret) for h in self.handles
            ]

        replayed = 0
        for s, held in enumerate(ask_available(ask, _get_all, self.timeout_s, waits)):
            if held > clock:
                raise RuntimeError(
                    f"parameter shard {s} holds {held} pushes of worker {self.worker_id} but "
                    f"this client made {clock}: it is not that worker's client"
                )
            if held == clock:
                continue
            if not self.enabled:
                raise RuntimeError(
                    f"parameter shard {s} restarted without the {clock - held} push(es) of "
                    f"worker {self.worker_id} since and shard backups are off "
                    f"(angel.ps.backup.interval=0): its rows are lost; set "
                    f"angel.ps.backup.interval > 0 to let shards restart and recover"
                )
            replayed += self._recover_shard(s, clock, net)
        return replayed

    def _restored_clock(self, shard: int) -> int:
        """The clock of this worker that the restarted shard came back at (waits for it).

        A call to a shard Ray is restarting waits for the restart (or fails as unavailable:
        tried again); a call to a shard Ray will not restart fails with ActorDiedError at once,
        and so does this, naming the shard and the key that bounds its restarts."""
        h = self.handles[shard]
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                ref: ray.ObjectRef[int] = h.clock_of.remote(self.worker_id)
                return int(ray.get(ref))
            except ActorDiedError as e:
                raise RuntimeError(dead_for_good(shard, e)) from None
            except RayActorError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"parameter shard {shard} did not come back within {self.timeout_s:g} s "
                        f"(angel.matrixtransfer.request.timeout.ms)"
                    ) from None
                time.sleep(0.2)

    def _replay(self, shard: int, clock: int) -> tuple[int, int]:
        """Replay the logged pushes to ``shard`` from the clock it came back at; returns
        (that clock, the pushes replayed)."""
        start = self._restored_clock(shard)
        entries = [e for e in self.entries[shard] if e.clock >= start]
        first = entries[0].clock if entries else clock
        if first != start:
            raise RuntimeError(
                f"parameter shard {shard} restarted at clock {start} of worker {self.worker_id} "
                f"but this client's log starts at clock {first}: updates would be lost"
            )
        h = self.handles[shard]
        refs = [h.step.remote(e, secret=self.secret) for e in entries]
        try:
            ray.get(refs)
        except RayTaskError as e:
            raise remote_error(e) from None
        return start, len(entries)
