"""A shard's backups on object storage (``angel.ps.backup.path`` a URL: ``s3://``, ``gs://``).

A local backup (:func:`angelps.checkpoint.backups.write_backup`) is a version directory renamed into
place and a ``LATEST`` file replaced atomically. Object storage has no rename, so a backup on a
URL is a remote checkpoint (:mod:`angelps.checkpoint.remote`) of its own at
``<backup path>/<job>-<launch id>/shard-<i>``::

    shard-<i>/LATEST.json              the pointer, naming the current generation only
    shard-<i>/gen-<id>/manifest.json   the shard's clocks and every file's SHA-256
    shard-<i>/gen-<id>/<table>/shard-<i>.parquet

A backup writes a new generation (table files, then its manifest), then the pointer
(``commit_dir(..., keep_previous=False)``: a restart needs the latest backup only), and only
then removes the generation it replaced and any left by a backup that died half-way.
Invariant: a generation no pointer names is never read, so a half-written backup never replaces
the last good one. Who can read the backups is the bucket's permissions (there is no 0700
directory on object storage).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any

from angelconf.printable import printable
from angelps import fs
from angelps.checkpoint import remote as checkpoint_remote
from angelps.checkpoint.errors import CheckpointError
from angelps.checkpoint.files import VERSION, load_manifest_file, write_manifest

__all__ = ["backup_version", "read_backup", "remove_launch", "write_backup"]

_SHARD = re.compile(r"shard-[0-9]{1,9}")


def write_backup(backup_dir: str, shard: Any, meta: Mapping[str, Any]) -> str:
    """Write ``shard`` (a ParameterShard) into a new generation under the URL ``backup_dir``
    and commit it by its pointer, written last; returns the generation's name."""
    tmp = checkpoint_remote.new_tmp_dir(backup_dir)
    info = shard.save(tmp)
    write_manifest(tmp, {**meta, "version": VERSION, "files": info.get("files", {})})
    checkpoint_remote.commit_dir(tmp, backup_dir, keep_previous=False)
    return tmp.rstrip("/").rsplit("/", 1)[-1]


def backup_version(backup_dir: str) -> str | None:
    """The generation the pointer of ``backup_dir`` names (None without a pointer); a pointer
    that is not an angelps one, or names anything but a generation, is a CheckpointError."""
    return checkpoint_remote.current(backup_dir)


def read_backup(backup_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(generation URL, meta) of the latest backup under ``backup_dir``, or None if there is
    none; the manifest checked by its checksum (each table file by its SHA-256 when read)."""
    version = backup_version(backup_dir)
    if version is None:
        return None
    root = fs.join(backup_dir, version)
    return root, load_manifest_file(root)


def remove_launch(root: str) -> None:
    """Remove one launch's backups at the URL ``root`` (``<backup path>/<job>-<id>``): each
    ``shard-<i>`` checkpoint (its pointer, then its generations), then ``root`` once nothing
    else is under it. Nothing outside ``root`` is touched, nor any other object inside it.
    A store that fails here is a warning on stderr (the job itself is over), not an error."""
    try:
        for name, is_dir in fs.list_dir(root):
            if is_dir and _SHARD.fullmatch(name):
                checkpoint_remote.remove(fs.join(root, name))
        if not fs.list_dir(root):
            fs.delete_dir(root)  # the empty marker object a store may leave behind
    except (OSError, CheckpointError) as e:
        why = " ".join(str(e).split())[:300]
        print(
            printable(
                f"angelps: warning: could not remove the shard backups at {root} ({why}); "
                "remove that prefix by hand"
            ),
            file=sys.stderr,
        )
