"""Which checkpoints a training job keeps, and what a failed checkpoint write does.

The latest checkpoint is always at ``angel.save.model.path`` (and the one before it at
``<path>.prev``, :mod:`angelps.checkpoint.local_dir`); ``--resume`` reads it there. Besides it:

- ``angel.save.model.keep.last = N > 1``: the checkpoints of the last N epochs stay as
  ``<path>.epoch-<n>`` (n counted from 1, as the console counts epochs), older ones are removed;
- ``angel.save.model.keep.best = true``: the checkpoint of the best epoch by
  ``ml.early.stop.metric`` stays as ``<path>.best``.

Those copies are hard links of the committed checkpoint's files (a checkpoint's files are
written once and never changed in place, since every save writes a new directory), so they cost
no disk until the latest moves on; a copy is made where links are not possible. Each copy is
made beside its target and renamed into place, so a crash leaves either the old or the new one.
On object storage (a URL save path) each copy is a checkpoint of its own at the same name,
copied server-side and committed by its own pointer
(:func:`angelps.checkpoint.remote.copy_checkpoint`); pruning removes only what angelps wrote
there (the pointer, the generations), never another object under or beside it. Both ways are
the checkpoint store's that the path names (:func:`angelps.checkpoint.store.store_for`).

A checkpoint that cannot be written (a full disk, a path made unwritable) never touches the
previous one (the save writes into a temporary directory and commits by renames only once
complete). ``angel.save.failure=stop`` then ends the job with :class:`CheckpointWriteError`
naming the path and the last good checkpoint; ``continue`` warns and trains on.

With ``angel.save.model.async`` (the default) :meth:`Checkpoints.save_async` returns once the
rows are copied; a commit thread waits for the files, commits and keeps the copies, and the
job waits for it (:meth:`Checkpoints.wait`) before the next save, a restart and its end, where
a failed write meets the policy above. ``waited_s`` (the summary's ``checkpoint_wait_s``): the
seconds training waited for checkpoints either way.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from angelconf.printable import printable
from angelps.checkpoint import files as checkpoint
from angelps.checkpoint.errors import CheckpointDamaged, CheckpointError
from angelps.checkpoint.store import store_for
from angelps.client.pending_save import PendingSave
from angelps.client.recovery import SHARD_LOST
from learners.worker.group import WorkerDied

__all__ = ["CheckpointWriteError", "Checkpoints", "Kept", "kept_summary"]

#: Seconds a job ending on an error (or Ctrl-C) waits for the checkpoint being written in the
#: background: long enough for a write in progress, bounded so a hung shard cannot hold the
#: exit back.
ABANDON_WAIT_S = 120.0
_EPOCH = ".epoch-"
_BEST = ".best"


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written and ``angel.save.failure=stop``: the message names the
    path, the reason and the last good checkpoint."""


@dataclass(frozen=True)
class Kept:
    """A committed checkpoint: where it is and the epoch (0-based) it was saved after."""

    path: str
    epoch: int


def _reason(exc: BaseException) -> str:
    """One short line for ``exc``: the error inside a Ray actor rather than its wrapper."""
    seen = 0
    while isinstance(getattr(exc, "cause", None), BaseException) and seen < 8:
        exc = exc.cause  # type: ignore[attr-defined]
        seen += 1
    lines = str(exc).strip().splitlines() or [""]
    text = lines[-1] if type(exc).__module__.startswith("ray.") else lines[0]
    return f"{type(exc).__name__}: {text}"[:300]


def _on_disk(exc: BaseException) -> bool:
    """Whether a failed save's cause is the file system (an OSError, in this process or, by
    its text, inside a Ray actor) or the path (a CheckpointError)."""
    seen = 0
    while seen < 8:
        if isinstance(exc, (OSError, CheckpointError)):
            return True
        nxt = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(nxt, BaseException):
            break
        exc, seen = nxt, seen + 1
    return "[Errno " in str(exc) or "OSError" in str(exc)


@dataclass
class _Writing:
    """A checkpoint being written in the background and its commit thread's outcome."""

    pending: PendingSave
    epoch: int
    thread: threading.Thread | None = None
    error: BaseException | None = None
    notes: list[str] = field(default_factory=list)


class Checkpoints:
    """The checkpoints of one training job: the save, the copies kept, the failure policy."""

    def __init__(
        self,
        path: str,
        keep_last: int = 1,
        keep_best: bool = False,
        on_failure: str = "stop",
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store_for(path)
        self.path = self.store.normalize(path)  # a URL as it is, a local path absolute
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.on_failure = on_failure
        self.warn = warn or (lambda text: print(printable(text), file=sys.stderr, flush=True))
        self.last_good: Kept | None = None
        #: the epoch (0-based) whose checkpoint is kept at <path>.best
        self.best_kept: int | None = None
        self.failures = 0
        #: <path>.epoch-<n> prefixes not removed because angelps did not write them (warned once)
        self._foreign: set[str] = set()
        #: the checkpoint being written in the background (:meth:`save_async`)
        self._writing: _Writing | None = None
        #: seconds training waited for checkpoints (their writes, or copies and commits)
        self.waited_s = 0.0
        #: a job that does not continue the checkpoint at its path: the copies beside it are
        #: another job's until its first commit replaces them (:meth:`_drop_stale`)
        self._fresh = True

    def resumed(self, epoch: int) -> None:
        """Training continues from the checkpoint saved after ``epoch``."""
        self.last_good = Kept(self.path, epoch)
        self.best_kept = _epoch_of(self.path + _BEST) if self.keep_best else None
        self._fresh = False

    def _drop_stale(self) -> list[str]:
        """At a fresh job's first commit: remove the copies an earlier job left beside the
        checkpoint it replaced (``<path>.best``, ``<path>.epoch-<n>``), which would otherwise
        pass for this job's (a best epoch of other data, an epoch this job never ran). The
        notes to say."""
        self._fresh = False
        stale = [p for _, p in sorted(self._epoch_copies()) if self.store.holds_checkpoint(p)]
        if self.store.holds_checkpoint(self.path + _BEST):
            stale.append(self.path + _BEST)  # (only checkpoints: whatever else is there stays)
        notes = []
        for p in stale:
            try:
                self.store.remove(p)
            except (OSError, CheckpointError) as e:
                notes.append(f"angelps: warning: not removing {p}, another job's: {_reason(e)}")
                continue
            notes.append(f"angelps: note: removed {p}, kept by the job this one replaced")
        return notes

    def save(self, write: Callable[[str], object], epoch: int, improved: bool) -> bool:
        """Write the checkpoint of ``epoch`` with ``write(path)``, then keep its copies.
        False when the write failed and the job goes on (``continue``); raises
        :class:`CheckpointWriteError` when it failed and the job stops."""
        t0 = time.perf_counter()
        try:
            write(self.path)
        except WorkerDied:
            raise  # not the disk: the job restarts from its last checkpoint (learners.job.failover)
        except Exception as e:  # a write that failed, for whatever reason: the policy decides
            self._failed(epoch, e)
            return False
        finally:
            self.waited_s += time.perf_counter() - t0
        self._committed(epoch, improved)
        return True

    def _committed(self, epoch: int, improved: bool, say: bool = True) -> list[str]:
        """The checkpoint of ``epoch`` is committed: the last good one; keep its copies. The
        warnings (said at once unless ``say`` is false: the commit thread's, said by
        :meth:`wait`)."""
        self.last_good = Kept(self.path, epoch)
        notes = self._drop_stale() if self._fresh else []
        try:
            self._keep(epoch, improved)
        except (OSError, CheckpointError) as e:
            notes.append(
                f"angelps: warning: the checkpoint of epoch {epoch + 1} is saved at {self.path}, "
                f"but keeping its copy failed: {_reason(e)}"
            )
        if say:
            for note in notes:
                self.warn(note)
        return notes

    def save_async(
        self,
        start: Callable[[str], PendingSave | None],
        epoch: int,
        improved: bool,
    ) -> bool:
        """:meth:`save`, the files written in the background: ``start(path)`` begins the
        checkpoint of ``epoch`` and returns once its rows are copied; a thread waits for its
        files, commits it and keeps its copies while training goes on. The checkpoint before
        it is waited for first (:meth:`wait`: one at a time, its failure handled by the
        policy then). False when this start failed and the job goes on."""
        t0 = time.perf_counter()
        try:
            self._wait(False)
            try:
                pending = start(self.path)
            except WorkerDied:
                raise
            except Exception as e:
                self._failed(epoch, e)
                return False
        finally:
            self.waited_s += time.perf_counter() - t0
        if pending is None:  # (written already)
            self._committed(epoch, improved)
            return True
        writing = _Writing(pending, epoch)
        writing.thread = threading.Thread(
            target=self._finish, args=(writing, improved), name="checkpoint-commit", daemon=True
        )
        self._writing = writing
        writing.thread.start()
        return True

    def _finish(self, writing: _Writing, improved: bool) -> None:
        """The commit thread: the files, the manifest, the commit, the copies."""
        try:
            writing.pending.result()
        except BaseException as e:
            writing.error = e
            return
        writing.notes = self._committed(writing.epoch, improved, say=False)

    @property
    def writing(self) -> bool:
        """A checkpoint written in the background has not been waited for yet."""
        return self._writing is not None

    def wait(self, lost_worker: bool = False) -> bool:
        """Wait for the checkpoint being written in the background (if any) to be committed.
        False when it failed and the job goes on (angel.save.failure=continue); raises
        :class:`CheckpointWriteError` when it failed and the job stops, and
        :class:`WorkerDied` when a worker died while writing its part (the job restarts from
        the checkpoint before it, as for a worker lost during an inline save), unless
        ``lost_worker`` (the job is restarting already)."""
        t0 = time.perf_counter()
        try:
            return self._wait(lost_worker)
        finally:
            self.waited_s += time.perf_counter() - t0

    def _wait(self, lost_worker: bool, timeout: float | None = None) -> bool:
        writing, self._writing = self._writing, None
        if writing is None:
            return True
        assert writing.thread is not None
        writing.thread.join(timeout)
        if writing.thread.is_alive():
            self.warn(
                f"angelps: warning: the checkpoint of epoch {writing.epoch + 1} was still being "
                f"written after {timeout:g} s: not committed; {self.last_good_text()}"
            )
            return False
        for note in writing.notes:
            self.warn(note)
        e = writing.error
        if e is None:
            return True
        if isinstance(e, WorkerDied):
            if lost_worker:
                return False
            why = f"{e.reason}, while the checkpoint of epoch {writing.epoch + 1} was written"
            raise WorkerDied(e.index, why) from e
        if isinstance(e, SHARD_LOST):
            # Not the disk: a shard died while writing it, and Ray restarted it (training went
            # on, its workers replaying their pushes). This epoch's rows are gone with the
            # copy; the next save writes the next epoch's as usual (the job's last is inline,
            # written again after such a failure: learners/job/saved_model.py).
            self.failures += 1
            self.warn(
                f"angelps: warning: the checkpoint of epoch {writing.epoch + 1} was not "
                f"written: a parameter shard failed while it wrote it in the background "
                f"({_reason(e)}); training goes on and the next checkpoint is written as "
                f"usual; {self.last_good_text()}"
            )
            return False
        self._failed(writing.epoch, e)
        return False

    def abandon(self) -> None:
        """The job is ending on an error: wait for the checkpoint being written (so that a
        checkpoint whose files are written is still committed), and say if it failed."""
        writing = self._writing
        if writing is not None and writing.thread is not None and writing.thread.is_alive():
            self.warn(
                f"angelps: note: waiting for the checkpoint of epoch {writing.epoch + 1} being "
                f"written in the background (at most {ABANDON_WAIT_S:g} s)"
            )
        try:
            self._wait(True, timeout=ABANDON_WAIT_S)
        except Exception as e:
            self.warn(f"angelps: warning: {_reason(e)}")

    def where(self, epoch: int) -> str | None:
        """Where the checkpoint saved after ``epoch`` (0-based) is kept, or None."""
        if self.keep_best and self.best_kept == epoch:
            return self.path + _BEST
        if self.last_good is not None and self.last_good.epoch == epoch:
            return self.path
        kept = f"{self.path}{_EPOCH}{epoch + 1}"
        return kept if self.keep_last > 1 and self.store.holds_checkpoint(kept) else None

    def last_good_text(self) -> str:
        """The last good checkpoint, for a message."""
        if self.last_good is None:
            return "no checkpoint has been written yet"
        try:
            where = self.store.resolve(self.path, fallback=True)  # <path>.prev mid-commit
        except CheckpointError:
            where = self.last_good.path
        return f"the last good checkpoint is {where} (epoch {self.last_good.epoch + 1})"

    def _failed(self, epoch: int, exc: BaseException) -> None:
        self.failures += 1
        what = (
            f"the checkpoint of epoch {epoch + 1} could not be written to {self.path}: "
            f"{_reason(exc)}; {self.last_good_text()}"
        )
        if self.on_failure == "stop":
            # The disk's hint only where the disk (or the path) is the cause.
            fix = "make room or fix the path, then " if _on_disk(exc) else "fix the cause, then "
            # (with no checkpoint yet there is nothing to resume: --resume would be refused)
            then = "continue with --resume" if self.last_good is not None else "train again"
            raise CheckpointWriteError(
                f"{what}; stopped (angel.save.failure=stop): {fix}{then}"
            ) from exc
        self.warn(f"angelps: warning: {what}; training goes on (angel.save.failure=continue)")

    def _keep(self, epoch: int, improved: bool) -> None:
        """The copies of the checkpoint just committed at ``self.path``."""
        copy = self.store.copy
        if self.keep_last > 1:
            copy(self.path, f"{self.path}{_EPOCH}{epoch + 1}")
            self._prune(epoch)
        if improved and self.keep_best:
            copy(self.path, self.path + _BEST)
            self.best_kept = epoch

    def _prune(self, epoch: int) -> None:
        """Remove ``<path>.epoch-<n>`` beyond the last ``keep_last`` epochs (and any of a later
        epoch: left by a run this one resumed before)."""
        newest = epoch + 1
        for n, p in self._epoch_copies():
            if n > newest or n <= newest - self.keep_last:
                try:  # on object storage: the pointer, then the generations, nothing else
                    self.store.remove(p)
                except CheckpointDamaged as e:
                    if p not in self._foreign:
                        self._foreign.add(p)
                        self.warn(f"angelps: warning: not removing {p}: {e}")

    def _epoch_copies(self) -> list[tuple[int, str]]:
        """(n, path) of every ``<path>.epoch-<n>`` beside the checkpoint (a URL: every prefix)."""
        base = os.path.basename(self.path)  # (a URL's last part too)
        pattern = re.compile(re.escape(base + _EPOCH) + r"([0-9]+)")
        return [
            (int(m.group(1)), p)
            for p in self.store.beside(self.path, _EPOCH)
            if (m := pattern.fullmatch(os.path.basename(p)))
        ]


def kept_summary(
    ckpts: Checkpoints | None, best_epoch: int | None, metric: str, best: float | None
) -> dict[str, Any]:
    """The summary's word on the best epoch (counted from 1, as the console counts) and the
    checkpoints: the latest written, where the best one is kept, how many writes failed."""
    found = best_epoch is not None
    last = ckpts.last_good if ckpts is not None else None
    return {
        "best_epoch": best_epoch + 1 if best_epoch is not None else None,
        "best_metric": metric if found else None,
        "best_value": best if found else None,
        "best_checkpoint": ckpts.where(best_epoch)
        if ckpts is not None and best_epoch is not None
        else None,
        "checkpoint": last.path if last is not None else None,
        "checkpoint_epoch": last.epoch + 1 if last is not None else None,
        "checkpoint_failures": ckpts.failures if ckpts is not None else 0,
        "checkpoint_wait_s": ckpts.waited_s if ckpts is not None else 0.0,
    }


def _epoch_of(path: str) -> int | None:
    """The epoch a learner's checkpoint at ``path`` was saved after, or None."""
    try:
        extra = checkpoint.read_manifest(path).get("extra", {})
        return int(extra["learner"]["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
