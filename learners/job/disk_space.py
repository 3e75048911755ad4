"""Room on the disk of the job's log path: checked before the job starts, named when it runs out.

A job writes under ``angel.log.path`` from its first second: the run's files and every shard's
start-up backup (``<log>/ps-backup``). On a disk without room for them the job used to fail
inside a shard's start, with Ray's traceback of the actor and a half-written backup left behind.
:func:`check_log_space` refuses it before anything starts, with one line naming the path, the
free space and the space needed (:data:`LOG_MIN_FREE`; a caller that knows the tables' bytes
adds twice them: a backup is written beside the previous one). :func:`explain` turns a
"No space left on device" met later, wherever it was raised (a shard, a worker, the driver),
into one line naming the job's paths and their free space.
"""

from __future__ import annotations

import os

from angelps.file_store import files_for

__all__ = ["LOG_MIN_FREE", "DiskFull", "check_log_space", "explain", "free_bytes"]

#: Room a job needs under its log path before it starts: the run's files (metrics.jsonl,
#: summary.json, TensorBoard events) and the shard backups of a small model.
LOG_MIN_FREE = 1 << 20
_NO_SPACE = "No space left on device"


class DiskFull(RuntimeError):
    """No room on a disk the job writes (exit 1: a failure while running, not bad input)."""


def free_bytes(path: str) -> int | None:
    """Bytes free to this user on the file system that holds (or would hold) ``path``; None when
    it cannot be told, or on object storage (no disk of this machine fills up: a run logged
    there is staged locally and copied when written, learners.runs.log_store)."""
    disk = files_for(path).disk_path(path)
    if disk is None:
        return None
    p = os.path.abspath(disk)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"


def check_log_space(log_dir: str, table_bytes: int = 0) -> None:
    """DiskFull when the disk of ``log_dir`` (a local path) has less room than the job's start
    needs: :data:`LOG_MIN_FREE` plus twice ``table_bytes`` (the shard backups)."""
    need = LOG_MIN_FREE + 2 * table_bytes
    free = free_bytes(log_dir)
    if free is not None and free < need:
        raise DiskFull(
            f"angel.log.path={log_dir}: {_size(free)} free on its disk, the job needs at least "
            f"{_size(need)} there (its run files and shard backups): make room or choose "
            "another angel.log.path; nothing was written"
        )


def explain(exc: BaseException, paths: dict[str, str], resumable: bool = True) -> DiskFull | None:
    """A DiskFull naming ``paths`` (key -> path) and their free space when ``exc`` (or the text
    of a Ray error wrapping it) is a "No space left on device"; else None. ``resumable``: a
    checkpoint is there to continue from (else ``--resume`` would be refused: train again)."""
    if not (getattr(exc, "errno", None) == 28 or _NO_SPACE in str(exc)):
        return None
    where = "; ".join(
        f"{key}={path}: {_size(free)} free"
        for key, path in paths.items()
        if path and (free := free_bytes(path)) is not None
    )
    then = "continue with --resume" if resumable else "train again (no checkpoint to resume yet)"
    return DiskFull(
        f"no space left on device ({where}): make room, then {then}"
        if where
        else f"no space left on device: make room, then {then}"
    )
