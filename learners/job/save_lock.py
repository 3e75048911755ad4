"""One writer per save path: a job holds ``<angel.save.model.path>.lock`` for its lifetime.

The lock is a small JSON file beside the checkpoint (never inside it: a save replaces the
checkpoint directory by renames) naming its holder: the job, the host, the pid and the pid's
start time (so a reused pid is not taken for the holder). A second job with the same save path
is refused before anything starts, with one line naming the holder (a ConfigError: exit 2).

A lock left by a job that died without removing it is stale when it names this host and its
process is gone (or is another process under the same pid): it is taken over, and the console
says so; of two jobs that find the same stale lock only one takes the path (on a local disk;
on object storage, best effort). A lock naming another host cannot be checked from here: it is respected, and the
message says which file to remove once that job is known to be gone.

On a local disk the lock is created with ``O_CREAT | O_EXCL``, atomic on every POSIX file
system (NFSv3 and later included). On object storage (``s3://``, ``gs://``) pyarrow offers no
conditional create (no ``If-None-Match``): the lock object is created through claims
(:mod:`angelps.checkpoint.remote_lock`, best effort: of contenders that start together one
takes it), then read back to check that this job's token is the one that stayed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from typing import Any

from angelconf.config import ConfigError
from angelps import fs
from angelps.checkpoint.store import store_for
from learners.data.problems import printable

__all__ = ["LOCK_SUFFIX", "SaveLock"]

LOCK_SUFFIX = ".lock"
_KEY = "angel.save.model.path"


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of /proc/<pid>/stat), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its last ')'.
    return stat[stat.rfind(")") + 2 :].split()[19]


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the process a lock names (on this host) still runs: same pid, same start."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    started = _started(pid)
    return started is not None and started == holder.get("pid_start", started)


def _describe(holder: dict[str, Any]) -> str:
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
    return (
        f"job {holder.get('job')!r} (pid {holder.get('pid')} on {holder.get('host')}, since {when})"
    )


class SaveLock:
    """The lock of one save path, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, save_path: str, job: str, source: str = "") -> None:
        self.save_path = save_path
        self.shown = f"{_KEY}={save_path}" + (f" ({source})" if source else "")
        self.store = store_for(save_path)
        self.path = self.store.normalize(save_path) + LOCK_SUFFIX
        self.me = {
            "job": job,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": _started(os.getpid()),
            "since": time.time(),
            "token": uuid.uuid4().hex,
        }
        self.held = False

    def __enter__(self) -> SaveLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock; a ConfigError naming the holder when another live job holds it."""
        data = json.dumps(self.me, indent=1).encode()
        for _ in range(3):  # tried again after removing a stale lock (or one that vanished)
            holder = self._create(data)
            if holder is None:
                self.held = True
                return
            if not holder:
                continue  # removed between our create and our read
            if holder.get("host") != self.me["host"] or _alive(holder):
                raise ConfigError(
                    f"{self.shown} is in use by {printable(_describe(holder))}: one job writes a "
                    f"save path at a time; wait for it to end or choose another path (if that "
                    f"job is gone, remove {self.path})"
                )
            note = f"removing the stale lock {self.path} of {_describe(holder)}"
            # (a lock file's content may be anything: shown escaped)
            print(f"angelps: note: {printable(note)}, which is no longer running", file=sys.stderr)
            self._remove_stale(holder)
        raise ConfigError(f"{self.shown}: cannot take the lock {self.path}")

    def _create(self, data: bytes) -> dict[str, Any] | None:
        """Create the lock file; None when created, else the holder it names."""
        if not self.store.create_new(self.path, data):
            return self._holder()
        # Object storage's create is best effort (claims, no conditional put): read back that
        # the lock names this job (on a local disk O_EXCL has decided already).
        holder = self._holder()
        return None if holder.get("token") == self.me["token"] else holder

    def _holder(self, path: str | None = None) -> dict[str, Any]:
        """The holder a lock file (``path``, default the lock) names; an unreadable one (a
        crash mid-write) names nobody alive on this host, so it is stale."""
        try:
            holder = json.loads(fs.read_bytes(path or self.path).decode("utf-8"))
        except FileNotFoundError:
            return {}  # removed meanwhile: try again
        except (OSError, ValueError):
            holder = None
        if not isinstance(holder, dict):
            return {"job": "(unreadable lock)", "host": self.me["host"], "pid": 0}
        return holder

    def _remove_stale(self, stale: dict[str, Any]) -> None:
        """Remove the lock found stale, never a live job's lock that replaced it meanwhile (two
        jobs that find the same stale lock: the first removes it and takes the lock, the
        second must not remove that). On a local disk the lock is renamed aside (atomic) and
        checked: another job's fresh lock is linked back, unless a third has taken the path
        since. On object storage it is removed as read (best effort: no conditional delete)."""
        if self.store.kind != "local":
            self._remove()
            return
        aside = f"{self.path}.stale-{self.me['token']}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another job removed it first
        try:
            if self._holder(aside) != stale:
                try:
                    os.link(aside, self.path)  # put back: it is another job's, taken meanwhile
                except FileExistsError:
                    pass
        finally:
            os.unlink(aside)

    def _remove(self) -> None:
        try:
            self.store.delete_file(self.path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        """Remove the lock if this job still holds it (never another job's)."""
        if not self.held:
            return
        self.held = False
        try:
            if self._holder().get("token") == self.me["token"]:
                self._remove()
        except OSError:
            pass  # a lock that cannot be removed is stale once this process ends
