"""A shard's backups: the latest version of its rows and optimizer state, for recovery.

On a local disk a backup is a version directory renamed into place and a ``LATEST`` file
replaced atomically; under a URL it is a generation and a pointer
(:mod:`angelps.checkpoint.remote_backup`). The files are checkpoint table files with their
manifest (:mod:`angelps.checkpoint.files`), checked when read.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping
from typing import Any

from angelps.checkpoint import remote_backup
from angelps.checkpoint.files import VERSION, load_manifest_file, write_manifest
from angelps.checkpoint.local_dir import CheckpointError, fsync_dir, write_durably
from angelps.fs import is_remote

__all__ = ["backup_version", "read_backup", "write_backup"]

_LATEST = "LATEST"


def write_backup(backup_dir: str, shard: Any, meta: Mapping[str, Any]) -> str:
    """Write ``shard`` (a ParameterShard) into a new version directory under ``backup_dir``,
    then point ``LATEST`` at it with an atomic ``os.replace``; older versions are removed.
    The files' checksums go into the version's manifest, so a restore checks them too. A URL:
    a generation and a pointer (:mod:`angelps.checkpoint.remote_backup`)."""
    if is_remote(backup_dir):
        return remote_backup.write_backup(backup_dir, shard, meta)
    os.makedirs(backup_dir, exist_ok=True)
    version = f"b-{time.time_ns()}"
    tmp = os.path.join(backup_dir, f"tmp-{uuid.uuid4().hex[:12]}")
    try:
        info = shard.save(tmp)
        write_manifest(tmp, {**meta, "version": VERSION, "files": info.get("files", {})})
        os.rename(tmp, os.path.join(backup_dir, version))
    except BaseException:
        # A full disk (or any failure) leaves nothing half-written: the previous version and
        # LATEST are untouched, the temporary goes.
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


def backup_version(backup_dir: str) -> str | None:
    """The version directory named by ``backup_dir``'s ``LATEST`` file (None without one).

    Only a plain name (``b-<digits>``, what :func:`write_backup` writes) is accepted: a pointer
    that could lead out of the backup directory (``../x``, an absolute path, a separator) is
    refused with a CheckpointError naming the file, never joined into a path. A URL: the
    generation its ``LATEST.json`` names."""
    if is_remote(backup_dir):
        return remote_backup.backup_version(backup_dir)
    pointer = os.path.join(backup_dir, _LATEST)
    try:
        with open(pointer, encoding="utf-8", errors="replace") as f:
            text = f.read(64)
    except FileNotFoundError:
        return None
    version = text.strip()
    digits = version[2:]
    if not (
        version.startswith("b-") and 0 < len(digits) <= 24 and digits.isascii() and digits.isdigit()
    ):
        raise CheckpointError(
            f"backup pointer {pointer} holds {text[:40]!r}, not a backup version name "
            f"(b-<digits>, a directory inside {backup_dir}); refusing to restore from it"
        )
    return version


def read_backup(backup_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(directory, meta) of the latest backup under ``backup_dir``, or None if there is none;
    ``LATEST`` checked by :func:`backup_version`, the manifest by its checksum."""
    if is_remote(backup_dir):
        return remote_backup.read_backup(backup_dir)
    version = backup_version(backup_dir)
    if version is None:
        return None
    root = os.path.join(backup_dir, version)
    return root, load_manifest_file(root)
