"""Where a checkpoint lives on disk: the target check, durable writes, the commit, the previous one.

A checkpoint saved at ``<path>`` is written into a sibling ``<path>.tmp-<id>`` (every file and
directory fsynced, the manifest last), then committed by renames::

    <path>.prev  -> <path>.old-<id>     (the checkpoint before the previous one: deleted below)
    <path>       -> <path>.prev         (the previous good checkpoint: kept)
    <path>.tmp-<id> -> <path>           (the new one)

and the parent directory is fsynced. Only then are ``<path>.old-*`` and the temporaries of
earlier crashed saves (``<path>.tmp-*``) removed. Invariants: at every instant either ``<path>``
or ``<path>.prev`` holds a complete, committed checkpoint once one save has finished; a save
never deletes or renames anything that angelps did not write (:func:`check_target` refuses a
regular file and a non-empty directory of other files before a byte is written).
:func:`resolve` finds the checkpoint: ``<path>`` with its manifest, else an error naming
``<path>`` (and ``<path>.prev`` when it is there: a reader never gets an older model
silently); only ``--resume`` and a restart after a lost worker fall back (``fallback=True``) to
``<path>.prev`` (a crash between the renames) or the newest ``<path>.old-*`` (left by angelps
before version 2), and say so. A damaged
checkpoint that ``--resume`` moved aside (``<path>.damaged-<id>``, :mod:`learners.job.saved_model`)
is never removed.

Every function here takes a local path: a URL (``s3://...``) has no rename, and its
checkpoints are :mod:`angelps.checkpoint.remote`'s (generations under ``<path>``, a pointer
committed last). :func:`angelps.checkpoint.store.store_for` picks one or the other from a path.
"""

from __future__ import annotations

import glob
import os
import shutil
import uuid

from angelps.checkpoint.errors import (
    FORMAT,
    MANIFEST,
    PREV,
    CheckpointDamaged,
    CheckpointError,
    NoCheckpoint,
)

__all__ = [
    "MANIFEST",
    "PREV",
    "CheckpointDamaged",
    "CheckpointError",
    "NoCheckpoint",
    "check_target",
    "commit_dir",
    "copy_checkpoint",
    "create_new",
    "file_in",
    "fsync_dir",
    "holds_checkpoint",
    "new_tmp_dir",
    "older_hint",
    "previous",
    "resolve",
    "restore_interrupted",
    "set_aside",
    "write_durably",
]


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (created, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str, data: bytes | memoryview) -> None:
    """Write ``data`` to a new file ``path``, flushed and fsynced before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def holds_checkpoint(path: str) -> bool:
    """Whether directory ``path`` has an angelps manifest (its ``format`` field says so)."""
    try:
        with open(os.path.join(path, MANIFEST), "rb") as f:
            data = f.read()
    except OSError:
        return False
    # A byte search, not a parse: a damaged manifest still marks the directory as angelps's.
    return f'"format": "{FORMAT}"'.encode() in data


def check_target(path: str) -> None:
    """Refuse a save path that angelps must not replace: a regular file (or anything but a
    directory), or a non-empty directory without an angelps checkpoint. Absent, empty, or
    holding a checkpoint is fine."""
    path = os.path.abspath(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise CheckpointError(
            f"{path} is a file, not a checkpoint directory: angelps will not replace it "
            "(remove it or choose another path)"
        )
    if os.path.isdir(path) and os.listdir(path) and not holds_checkpoint(path):
        raise CheckpointError(
            f"{path} is a non-empty directory without an angelps checkpoint ({MANIFEST}): "
            "angelps will not replace it (choose a new or empty directory)"
        )


def new_tmp_dir(path: str) -> str:
    """A fresh sibling directory ``<path>.tmp-<id>`` to write a checkpoint into (after
    :func:`check_target`, so nothing is written for a path that would be refused)."""
    path = os.path.abspath(path)
    check_target(path)
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
        os.makedirs(tmp)
    except (FileExistsError, NotADirectoryError, PermissionError) as e:
        raise CheckpointError(
            f"cannot write a checkpoint at {path}: {e.strerror or e} ({parent})"
        ) from None
    return tmp


def commit_dir(tmp: str, path: str) -> None:
    """Make the complete checkpoint in ``tmp`` appear at ``path``, keeping the previous one as
    ``<path>.prev`` (see the module docstring). ``tmp`` must be complete and fsynced."""
    path = os.path.abspath(path)
    check_target(path)  # again: the path may have changed since the save began
    parent = os.path.dirname(path)
    prev = path + PREV
    if os.path.isdir(path) and not holds_checkpoint(path):
        os.rmdir(path)  # an empty directory (check_target refuses any other)
    if os.path.isdir(path):
        if os.path.lexists(prev):
            os.rename(prev, f"{path}.old-{uuid.uuid4().hex[:12]}")
        os.rename(path, prev)
    os.rename(tmp, path)
    fsync_dir(parent)
    for stale in glob.glob(glob.escape(path) + ".old-*") + glob.glob(glob.escape(path) + ".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def file_in(root: str, rel: str) -> str:
    """The file ``rel`` (a relative name already checked) inside the checkpoint ``root``; one
    that a symbolic link leads outside ``root`` is a CheckpointDamaged."""
    path = os.path.join(root, *rel.split("/"))
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(path), real_root]) != real_root:
        raise CheckpointDamaged(
            f"checkpoint file {path} leads outside the checkpoint {root} (a symbolic link); "
            "refusing to read it"
        )
    return path


def previous(path: str) -> str | None:
    """``<path>.prev`` if it holds a checkpoint (the one before the latest), else None."""
    prev = os.path.abspath(path) + PREV
    return prev if holds_checkpoint(prev) else None


def resolve(path: str, fallback: bool = False) -> str:
    """The directory holding the checkpoint saved at ``path``: ``path`` itself when it has its
    manifest. Anything else is a CheckpointError naming ``path`` (never an older model
    silently), with a hint naming ``<path>.prev`` when one is there. ``fallback=True`` (what
    ``--resume`` and a restart after a lost worker use, saying so on the console) returns
    ``<path>.prev`` when a save crashed between its renames, or the newest ``<path>.old-*``."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    older = _older(path)
    if fallback and older is not None:
        return older
    hint = older_hint(path)
    if os.path.isdir(path):
        raise NoCheckpoint(f"{path} is not a checkpoint: it has no {MANIFEST}{hint}")
    raise NoCheckpoint(f"no checkpoint at {path}{hint}")


def older_hint(path: str) -> str:
    """``; an older checkpoint is at <path>.prev: pass it explicitly ...`` for an error about
    ``path`` when a save left one beside it; empty otherwise."""
    older = _older(os.path.abspath(path))
    if older is None:
        return ""
    return (
        f"; an older checkpoint is at {older}: pass {older} explicitly to use it "
        "(train --resume falls back to it by itself and says so)"
    )


def _older(path: str) -> str | None:
    """The checkpoint a save of ``path`` kept or left behind: ``<path>.prev``, else the newest
    ``<path>.old-*`` (left by angelps before version 2); None."""
    prev = previous(path)
    if prev is not None:
        return prev
    olds = [
        p
        for p in glob.glob(glob.escape(path) + ".old-*")
        if os.path.isfile(os.path.join(p, MANIFEST))
    ]
    return max(olds, key=os.path.getmtime) if olds else None


def set_aside(path: str) -> str:
    """Move the (damaged) checkpoint at ``path`` to ``<path>.damaged-<id>``, kept and never
    removed; returns where it went."""
    aside = f"{os.path.abspath(path)}.damaged-{uuid.uuid4().hex[:8]}"
    os.rename(path, aside)
    return aside


def restore_interrupted(path: str) -> tuple[str, str] | None:
    """For ``path`` without its manifest: the older checkpoint a save left (``<path>.prev``, or
    ``<path>.old-*``) moved back to ``path``, anything at ``path`` set aside first. (where it
    came from, where what was at ``path`` went or ''); None when ``path`` has its manifest or
    nothing older is there."""
    try:
        root = resolve(path, fallback=True)
    except CheckpointError:
        return None
    path = os.path.abspath(path)
    if root == path:
        return None
    aside = set_aside(path) if os.path.lexists(path) else ""
    os.rename(root, path)
    return root, aside


def copy_checkpoint(src: str, dst: str) -> None:
    """Make ``dst`` a copy of checkpoint ``src`` (hard links where possible: a checkpoint's
    files are never changed in place), replacing what was at ``dst`` only once the copy is
    complete."""
    tmp = f"{dst}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        _link_tree(src, tmp)
        old = None
        if os.path.lexists(dst):
            old = f"{dst}.old-{uuid.uuid4().hex[:12]}"
            os.rename(dst, old)
        os.rename(tmp, dst)
        fsync_dir(os.path.dirname(dst))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _link_tree(src: str, dst: str) -> None:
    def link_or_copy(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def create_new(path: str, data: bytes) -> bool:
    """Create file ``path`` holding ``data`` (fsynced) unless it exists: whether it was
    created (``O_EXCL``: of two creators exactly one wins)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
