"""A shard's backups: the latest version of its rows and optimizer state, for recovery.

On a local disk a backup is a version directory renamed into place and a ``LATEST`` file
replaced atomically (:class:`LocalBackups`); under a URL it is a generation and a pointer
(:class:`ObjectBackups`, :mod:`angelps.checkpoint.remote_backup`). Which one is decided once
from the path, by the checkpoint store it names (:func:`angelps.checkpoint.store.store_for`).
The files are checkpoint table files with their manifest (:mod:`angelps.checkpoint.files`),
checked when read.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from angelps import fs
from angelps.checkpoint import remote_backup
from angelps.checkpoint.errors import CheckpointError
from angelps.checkpoint.files import VERSION, load_manifest_file, write_manifest
from angelps.checkpoint.local_dir import fsync_dir, write_durably
from angelps.checkpoint.store import store_for

__all__ = [
    "LocalBackups",
    "ObjectBackups",
    "ShardBackups",
    "backup_version",
    "backups_for",
    "launch_dir",
    "private_dir",
    "read_backup",
    "remove_launch",
    "shard_dir",
    "write_backup",
]

_LATEST = "LATEST"


class ShardBackups(Protocol):
    """Where a shard's backups live: write the latest, find it, read it."""

    def write_backup(self, backup_dir: str, shard: Any, meta: Mapping[str, Any]) -> str:
        """Write ``shard`` as the latest backup under ``backup_dir``; its version's name."""
        ...

    def backup_version(self, backup_dir: str) -> str | None:
        """The name of the latest backup under ``backup_dir`` (None without one)."""
        ...

    def read_backup(self, backup_dir: str) -> tuple[str, dict[str, Any]] | None:
        """(location, meta) of the latest backup under ``backup_dir``, or None."""
        ...

    def remove_launch(self, root: str) -> None:
        """Remove one launch's backups at ``root`` once its job is over (best effort)."""
        ...

    def launch_dir(self, backup_path: str, name: str) -> str:
        """The directory (or prefix) ``<backup_path>/<name>`` of one launch's backups."""
        ...

    def shard_dir(self, root: str, shard_id: int) -> str:
        """Shard ``shard_id``'s backups inside the launch's ``root``: ``<root>/shard-<i>``."""
        ...


class LocalBackups:
    """Backups on a local disk: version directories and a ``LATEST`` file."""

    def write_backup(self, backup_dir: str, shard: Any, meta: Mapping[str, Any]) -> str:
        """Write ``shard`` (a ParameterShard) into a new version directory under
        ``backup_dir``, then point ``LATEST`` at it with an atomic ``os.replace``; older
        versions are removed. The files' checksums go into the version's manifest, so a
        restore checks them too."""
        os.makedirs(backup_dir, exist_ok=True)
        version = f"b-{time.time_ns()}"
        tmp = os.path.join(backup_dir, f"tmp-{uuid.uuid4().hex[:12]}")
        try:
            os.makedirs(tmp)  # (a shard of no tables writes no table file into it)
            info = shard.save(tmp)
            write_manifest(tmp, {**meta, "version": VERSION, "files": info.get("files", {})})
            os.rename(tmp, os.path.join(backup_dir, version))
        except BaseException:
            # A full disk (or any failure) leaves nothing half-written: the previous version
            # and LATEST are untouched, the temporary goes.
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        pointer = os.path.join(backup_dir, f"{_LATEST}.tmp")
        write_durably(pointer, version.encode())
        os.replace(pointer, os.path.join(backup_dir, _LATEST))
        fsync_dir(backup_dir)
        for name in os.listdir(backup_dir):
            if name != version and (name.startswith("b-") or name.startswith("tmp-")):
                shutil.rmtree(os.path.join(backup_dir, name), ignore_errors=True)
        return version

    def backup_version(self, backup_dir: str) -> str | None:
        """The version directory named by ``backup_dir``'s ``LATEST`` file (None without one).

        Only a plain name (``b-<digits>``, what :meth:`write_backup` writes) is accepted: a
        pointer that could lead out of the backup directory (``../x``, an absolute path, a
        separator) is refused with a CheckpointError naming the file, never joined into a
        path."""
        pointer = os.path.join(backup_dir, _LATEST)
        try:
            with open(pointer, encoding="utf-8", errors="replace") as f:
                text = f.read(64)
        except FileNotFoundError:
            return None
        version = text.strip()
        digits = version[2:]
        if not (
            version.startswith("b-")
            and 0 < len(digits) <= 24
            and digits.isascii()
            and digits.isdigit()
        ):
            raise CheckpointError(
                f"backup pointer {pointer} holds {text[:40]!r}, not a backup version name "
                f"(b-<digits>, a directory inside {backup_dir}); refusing to restore from it"
            )
        return version

    def read_backup(self, backup_dir: str) -> tuple[str, dict[str, Any]] | None:
        """(directory, meta) of the latest backup under ``backup_dir``, or None; ``LATEST``
        checked by :meth:`backup_version`, the manifest by its checksum."""
        version = self.backup_version(backup_dir)
        if version is None:
            return None
        root = os.path.join(backup_dir, version)
        return root, load_manifest_file(root)

    def remove_launch(self, root: str) -> None:
        shutil.rmtree(root, ignore_errors=True)

    def launch_dir(self, backup_path: str, name: str) -> str:
        path = os.path.abspath(os.path.join(backup_path, name))
        private_dir(path)
        return path

    def shard_dir(self, root: str, shard_id: int) -> str:
        path = os.path.join(root, f"shard-{shard_id}")
        private_dir(root)
        private_dir(path)
        return path


class ObjectBackups:
    """Backups on object storage: a generation and a pointer per shard
    (:mod:`angelps.checkpoint.remote_backup`)."""

    def write_backup(self, backup_dir: str, shard: Any, meta: Mapping[str, Any]) -> str:
        return remote_backup.write_backup(backup_dir, shard, meta)

    def backup_version(self, backup_dir: str) -> str | None:
        return remote_backup.backup_version(backup_dir)

    def read_backup(self, backup_dir: str) -> tuple[str, dict[str, Any]] | None:
        return remote_backup.read_backup(backup_dir)

    def remove_launch(self, root: str) -> None:
        remote_backup.remove_launch(root)

    # A prefix exists once a shard writes under it; who reads it is the bucket's permissions:
    # object storage has no directory mode (no 0700).
    def launch_dir(self, backup_path: str, name: str) -> str:
        return fs.join(backup_path, name)

    def shard_dir(self, root: str, shard_id: int) -> str:
        return fs.join(root, f"shard-{shard_id}")


#: One per checkpoint store kind (:attr:`angelps.checkpoint.store.CheckpointStore.kind`).
_BACKUPS: dict[str, ShardBackups] = {"local": LocalBackups(), "object": ObjectBackups()}


def backups_for(backup_dir: str) -> ShardBackups:
    """The backups of the store that ``backup_dir`` names (a local disk, or object storage)."""
    return _BACKUPS[store_for(backup_dir).kind]


def write_backup(backup_dir: str, shard: Any, meta: Mapping[str, Any]) -> str:
    """Write ``shard`` (a ParameterShard) as the latest backup under ``backup_dir``: a version
    directory and ``LATEST`` on disk, a generation and a pointer on a URL; older ones go."""
    return backups_for(backup_dir).write_backup(backup_dir, shard, meta)


def backup_version(backup_dir: str) -> str | None:
    """The latest backup's version under ``backup_dir`` (None without one); a pointer that
    could lead outside ``backup_dir`` is a CheckpointError naming it."""
    return backups_for(backup_dir).backup_version(backup_dir)


def read_backup(backup_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(location, meta) of the latest backup under ``backup_dir``, or None if there is none;
    the pointer and the manifest checked."""
    return backups_for(backup_dir).read_backup(backup_dir)


def remove_launch(root: str) -> None:
    """Remove one launch's backups at ``root`` (the job is over): the directory on disk; on
    object storage each shard's pointer and generations, nothing else (a warning if it fails)."""
    backups_for(root).remove_launch(root)


def launch_dir(backup_path: str, name: str) -> str:
    """A new launch's backup location ``<backup_path>/<name>``: a directory made 0700 on disk,
    a prefix (nothing created yet) on object storage."""
    return backups_for(backup_path).launch_dir(backup_path, name)


def shard_dir(root: str, shard_id: int) -> str:
    """Shard ``shard_id``'s backup location inside the launch's ``root`` (0700 on disk)."""
    return backups_for(root).shard_dir(root, shard_id)


def private_dir(path: str) -> None:
    """Create directory ``path`` for this user only (0700); an existing one must belong to
    this user (else CheckpointError naming it) and is made 0700."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return
    st = os.stat(path)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CheckpointError(
            f"backup directory {path} belongs to another user (uid {st.st_uid}); choose "
            f"another angel.ps.backup.path"
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
