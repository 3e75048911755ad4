"""One checkpoint store per path: on a local disk, or on object storage, chosen once.

A checkpoint (and a shard's backup) is written the same way wherever it lives: check the
target, write every file durably into a new temporary location, commit it, keep the previous
one. How each step is done differs: a local disk has renames and fsync
(:mod:`angelps.checkpoint.local_dir`: a ``<path>.tmp-<id>`` sibling renamed into place,
``<path>.prev`` kept); object storage has neither (:mod:`angelps.checkpoint.remote`: a
generation under ``<path>``, a pointer written last). :class:`CheckpointStore` is that common
interface, :class:`LocalStore` and :class:`ObjectStore` its two implementations, and
:func:`store_for` the one place that looks at a path to pick one. The module-level functions
below dispatch once each, for callers that hold only a path.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Protocol

from angelps import fs
from angelps.checkpoint import local_dir, remote_lock
from angelps.checkpoint import remote as checkpoint_remote
from angelps.file_store import is_url

__all__ = [
    "CheckpointStore",
    "LocalStore",
    "ObjectStore",
    "check_target",
    "commit_dir",
    "fsync_dir",
    "holds_checkpoint",
    "new_tmp_dir",
    "older_hint",
    "previous",
    "resolve",
    "store_for",
    "write_durably",
]


class CheckpointStore(Protocol):
    """Where checkpoints live: what a save, a load and a shard's backup need of it."""

    #: ``"local"`` or ``"object"`` (what a caller keeps per store, e.g. the backup layout).
    kind: str

    def holds_checkpoint(self, path: str) -> bool:
        """Whether ``path`` holds an angelps checkpoint."""
        ...

    def check_target(self, path: str) -> None:
        """Refuse a save path holding something angelps did not write (a CheckpointError)."""
        ...

    def new_tmp_dir(self, path: str) -> str:
        """A new location to write a checkpoint of ``path`` into, before its commit."""
        ...

    def commit(self, tmp: str, path: str) -> None:
        """Make the complete checkpoint in ``tmp`` the one at ``path``, keeping the previous."""
        ...

    def previous(self, path: str) -> str | None:
        """The checkpoint before the latest at ``path`` (None without one)."""
        ...

    def resolve(self, path: str, fallback: bool = False) -> str:
        """Where the checkpoint saved at ``path`` is read from (a NoCheckpoint without one)."""
        ...

    def older_hint(self, path: str) -> str:
        """A hint naming an older checkpoint beside ``path`` for an error about it, or ''."""
        ...

    def write_durably(self, path: str, data: bytes | memoryview) -> None:
        """Write a new file ``path``, durable when this returns."""
        ...

    def fsync_dir(self, path: str) -> None:
        """Make the entries of the directory ``path`` durable."""
        ...

    def file_in(self, root: str, rel: str) -> str:
        """The file ``rel`` (a checked relative name) inside the checkpoint ``root``."""
        ...

    def open_read(self, path: str) -> IO[bytes]:
        """A file of a checkpoint, opened for reading."""
        ...

    def open_write(self, path: str) -> Any:
        """A context manager: a new file ``path`` opened for writing, durable once closed."""
        ...

    def discard(self, tmp: str) -> None:
        """Remove the uncommitted ``tmp`` of a save that failed, quietly (best effort)."""
        ...

    def normalize(self, path: str) -> str:
        """``path`` in the form its copies' names are built from (absolute; a URL as it is)."""
        ...

    def holds_latest(self, path: str) -> bool:
        """Whether there is something at ``path`` that :meth:`roll_back` can set aside."""
        ...

    def roll_back(self, path: str, prev: str) -> str:
        """Set the damaged latest checkpoint at ``path`` aside (kept) and make ``prev`` (its
        :meth:`previous`) the latest; where the damaged one is kept."""
        ...

    def restore_interrupted(self, path: str) -> tuple[str, str] | None:
        """Finish a save interrupted before its commit completed: (the older checkpoint made
        the latest again, where what was at ``path`` went or ''); None if there is nothing to
        do."""
        ...

    def copy(self, src: str, dst: str) -> None:
        """Make ``dst`` a copy of the checkpoint at ``src``, replacing ``dst`` only when done."""
        ...

    def remove(self, path: str) -> None:
        """Remove the checkpoint at ``path`` (a kept copy), nothing angelps did not write."""
        ...

    def beside(self, path: str, prefix: str) -> list[str]:
        """The checkpoints beside ``path`` whose names start with its name and ``prefix``."""
        ...

    def create_new(self, path: str, data: bytes) -> bool:
        """Create file ``path`` holding ``data`` unless it exists: whether it was created."""
        ...

    def delete_file(self, path: str) -> None:
        """Delete file ``path`` (FileNotFoundError when it is not there)."""
        ...


class LocalStore:
    """Checkpoints on a local disk: a temporary sibling, fsync, renames (``<path>.prev``)."""

    kind = "local"

    def holds_checkpoint(self, path: str) -> bool:
        return local_dir.holds_checkpoint(path)

    def check_target(self, path: str) -> None:
        local_dir.check_target(path)

    def new_tmp_dir(self, path: str) -> str:
        return local_dir.new_tmp_dir(path)

    def commit(self, tmp: str, path: str) -> None:
        local_dir.commit_dir(tmp, path)

    def previous(self, path: str) -> str | None:
        return local_dir.previous(path)

    def resolve(self, path: str, fallback: bool = False) -> str:
        return local_dir.resolve(path, fallback)

    def older_hint(self, path: str) -> str:
        return local_dir.older_hint(path)

    def write_durably(self, path: str, data: bytes | memoryview) -> None:
        local_dir.write_durably(path, data)

    def fsync_dir(self, path: str) -> None:
        local_dir.fsync_dir(path)

    def file_in(self, root: str, rel: str) -> str:
        return local_dir.file_in(root, rel)

    def open_read(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    @contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        local_dir.fsync_dir(os.path.dirname(path))

    def discard(self, tmp: str) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def normalize(self, path: str) -> str:
        return os.path.abspath(path)

    def holds_latest(self, path: str) -> bool:
        return os.path.isdir(path)

    def roll_back(self, path: str, prev: str) -> str:
        aside = local_dir.set_aside(path)
        os.rename(prev, os.path.abspath(path))
        return aside

    def restore_interrupted(self, path: str) -> tuple[str, str] | None:
        return local_dir.restore_interrupted(path)

    def copy(self, src: str, dst: str) -> None:
        local_dir.copy_checkpoint(src, dst)

    def remove(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def beside(self, path: str, prefix: str) -> list[str]:
        return glob.glob(glob.escape(path) + prefix + "*")

    def create_new(self, path: str, data: bytes) -> bool:
        return local_dir.create_new(path, data)

    def delete_file(self, path: str) -> None:
        os.unlink(path)


class ObjectStore:
    """Checkpoints on object storage (``s3://``, ``gs://``): generations and a pointer."""

    kind = "object"

    def holds_checkpoint(self, path: str) -> bool:
        return checkpoint_remote.holds_checkpoint(path)

    def check_target(self, path: str) -> None:
        checkpoint_remote.check_target(path)

    def new_tmp_dir(self, path: str) -> str:
        return checkpoint_remote.new_tmp_dir(path)

    def commit(self, tmp: str, path: str) -> None:
        checkpoint_remote.commit_dir(tmp, path)

    def previous(self, path: str) -> str | None:
        return checkpoint_remote.previous(path)

    def resolve(self, path: str, fallback: bool = False) -> str:
        # No fallback here: the pointer names the latest; ``--resume`` sets a damaged one
        # aside explicitly (remote.set_aside).
        return checkpoint_remote.resolve(path)

    def older_hint(self, path: str) -> str:
        return ""  # the pointer decides which generation is read

    def write_durably(self, path: str, data: bytes | memoryview) -> None:
        fs.write_bytes(path, data)  # an object is durable once written

    def fsync_dir(self, path: str) -> None:
        return None  # no directories: nothing to make durable

    def file_in(self, root: str, rel: str) -> str:
        return fs.join(root, rel)

    def open_read(self, path: str) -> IO[bytes]:
        stream: IO[bytes] = fs.open_input_stream(path)
        return stream

    def open_write(self, path: str) -> Any:
        return fs.open_output_stream(path)  # one object, complete once closed

    def discard(self, tmp: str) -> None:
        try:
            fs.delete_dir(tmp)
        except OSError:
            pass  # an uncommitted generation: the next save removes it

    def normalize(self, path: str) -> str:
        # No abspath (it would make s3://b/m a local s3:/b/m), no trailing / (or the copies'
        # names would go inside it: s3://b/m/.best).
        return path.rstrip("/")

    def holds_latest(self, path: str) -> bool:
        return True  # the pointer names the latest generation

    def roll_back(self, path: str, prev: str) -> str:
        return checkpoint_remote.set_aside(path)  # no rename: the pointer goes back

    def restore_interrupted(self, path: str) -> tuple[str, str] | None:
        return None  # a generation is committed by its pointer alone: none is half-committed

    def copy(self, src: str, dst: str) -> None:
        checkpoint_remote.copy_checkpoint(src, dst)

    def remove(self, path: str) -> None:
        checkpoint_remote.remove(path)  # the pointer, then the generations: nothing else

    def beside(self, path: str, prefix: str) -> list[str]:
        parent, base = path.rsplit("/", 1)
        return [
            fs.join(parent, name)
            for name, is_dir in fs.list_dir(parent)
            if is_dir and name.startswith(base + prefix)
        ]

    def create_new(self, path: str, data: bytes) -> bool:
        # No conditional put in pyarrow: claims, then the object (best effort, see there).
        return remote_lock.create_new(path, data)

    def delete_file(self, path: str) -> None:
        fs.delete_file(path)


_LOCAL = LocalStore()
_OBJECT = ObjectStore()


def store_for(path: str) -> CheckpointStore:
    """The store that ``path`` names: object storage for a URL, else the local disk. The one
    place that looks at a path to choose."""
    return _OBJECT if is_url(path) else _LOCAL


def holds_checkpoint(path: str) -> bool:
    """Whether ``path`` holds an angelps checkpoint (see :meth:`CheckpointStore.holds_checkpoint`)."""
    return store_for(path).holds_checkpoint(path)


def check_target(path: str) -> None:
    """Refuse a save path that angelps must not replace (a CheckpointError)."""
    store_for(path).check_target(path)


def new_tmp_dir(path: str) -> str:
    """A new location to write the checkpoint of ``path`` into, after :func:`check_target`."""
    return store_for(path).new_tmp_dir(path)


def commit_dir(tmp: str, path: str) -> None:
    """Make the complete checkpoint in ``tmp`` the one at ``path``, keeping the previous one."""
    store_for(path).commit(tmp, path)


def previous(path: str) -> str | None:
    """The checkpoint before the latest at ``path``, or None."""
    return store_for(path).previous(path)


def resolve(path: str, fallback: bool = False) -> str:
    """Where the checkpoint saved at ``path`` is read from; ``fallback`` as in
    :func:`angelps.checkpoint.local_dir.resolve`."""
    return store_for(path).resolve(path, fallback)


def older_hint(path: str) -> str:
    """``; an older checkpoint is at ...`` for an error about ``path``, or empty."""
    return store_for(path).older_hint(path)


def write_durably(path: str, data: bytes | memoryview) -> None:
    """Write ``data`` to a new file ``path``, durable before returning."""
    store_for(path).write_durably(path, data)


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` durable (nothing to do on object storage)."""
    store_for(path).fsync_dir(path)
