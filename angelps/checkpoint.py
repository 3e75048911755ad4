"""Checkpoints: every shard's rows and optimizer state in Parquet, plus a JSON manifest.

Layout of a checkpoint directory::

    manifest.json                 format, tables (specs), shards, partitioner, clocks, extra
    <table>/shard-<i>.parquet     columns: key (int64), w (fixed_size_list<dtype>[cols]),
                                  one fixed_size_list column per optimizer slot (state.<slot>)

Nothing is pickled. Values are stored in their own dtype, so a restore is bit-identical. Each
shard writes its own files; the client writes the manifest last. A save writes everything into
``<path>.tmp-<id>`` and then renames it to ``<path>`` (an existing ``<path>`` is first renamed
to ``<path>.old-<id>`` and removed after the swap), so a crash during a save never damages the
previous checkpoint: :func:`resolve` finds it under ``<path>.old-<id>`` if the crash fell
between the two renames.

A restore reads, for every table, all shard files of the checkpoint and keeps the keys that the
new layout routes to this shard: the number of shards and the partitioner may differ from the
saving job's. Tables must match by name, dense/sparse, rows, cols, dtype and optimizer
(which fixes the state slots); anything else is refused with an error naming the difference.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from angelps.table import TableSpec

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointError",
    "build_manifest",
    "check_layout",
    "commit_dir",
    "new_tmp_dir",
    "read_backup",
    "read_manifest",
    "read_table_file",
    "resolve",
    "write_backup",
    "write_manifest",
    "write_table_file",
]

FORMAT = "angelps-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit this job."""


def table_file(root: str, table: str, shard: int) -> str:
    return os.path.join(root, table, f"shard-{shard}.parquet")


def write_table_file(
    path: str,
    keys: np.ndarray,
    w: np.ndarray,
    state: Mapping[str, np.ndarray],
) -> int:
    """Write one shard's rows of one table; returns the row count."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cols: dict[str, pa.Array] = {"key": pa.array(np.ascontiguousarray(keys, dtype=np.int64))}
    for name, arr in [("w", w), *((f"state.{k}", v) for k, v in sorted(state.items()))]:
        a = np.ascontiguousarray(arr)
        cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])
    pq.write_table(pa.table(cols), path)
    return len(keys)


def read_table_file(path: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(keys, w, state) of one file written by :func:`write_table_file`."""
    try:
        t = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise CheckpointError(f"cannot read checkpoint file {path}: {e}") from None

    def matrix(name: str) -> np.ndarray:
        col = t.column(name).combine_chunks()
        width = col.type.list_size
        return col.values.to_numpy(zero_copy_only=False).reshape(-1, width)

    keys = t.column("key").to_numpy().astype(np.int64, copy=False)
    state = {n[len("state.") :]: matrix(n) for n in t.column_names if n.startswith("state.")}
    return keys, matrix("w"), state


def new_tmp_dir(path: str) -> str:
    """A fresh sibling directory ``<path>.tmp-<id>`` to write a checkpoint into."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    os.makedirs(tmp)
    return tmp


def build_manifest(
    tables: Sequence[TableSpec],
    num_shards: int,
    partitioner: str,
    shards: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
    **info: Any,
) -> dict[str, Any]:
    """The manifest of a checkpoint: format, tables, layout, per-shard info, extra (which must
    be JSON-safe: it is checked here, before anything is written)."""
    try:
        extra_json = json.loads(json.dumps(dict(extra or {}), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint extra must be a JSON-safe dict: {e}") from None
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tables": [t.to_dict() for t in tables],
        "num_shards": int(num_shards),
        "partitioner": str(partitioner),
        "shards": [dict(s) for s in shards],
        "extra": extra_json,
        **info,
    }


def write_manifest(root: str, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` durably (flushed and fsynced)."""
    p = os.path.join(root, MANIFEST)
    with open(p, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def commit_dir(tmp: str, path: str) -> None:
    """Make the complete checkpoint in ``tmp`` appear at ``path`` (see the module docstring)."""
    path = os.path.abspath(path)
    old = None
    if os.path.exists(path):
        old = f"{path}.old-{uuid.uuid4().hex[:12]}"
        os.rename(path, old)
    os.rename(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in glob.glob(glob.escape(path) + ".old-*"):
        shutil.rmtree(stale, ignore_errors=True)


def resolve(path: str) -> str:
    """The directory holding the checkpoint saved at ``path`` (``path`` itself, or the
    ``.old-`` copy left by a save that crashed between its two renames)."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    olds = [
        p
        for p in glob.glob(glob.escape(path) + ".old-*")
        if os.path.isfile(os.path.join(p, MANIFEST))
    ]
    if olds:
        return max(olds, key=os.path.getmtime)
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is not a checkpoint: it has no {MANIFEST}")
    raise CheckpointError(f"no checkpoint at {path}")


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (its ``root`` key says where it was found)."""
    root = resolve(path)
    try:
        with open(os.path.join(root, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {os.path.join(root, MANIFEST)}: {e}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{root} is not an angelps checkpoint (format {manifest.get('format')!r})"
        )
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{root}: checkpoint format version {manifest.get('version')!r} is not supported "
            f"(this angelps reads version {VERSION})"
        )
    manifest["root"] = root
    return manifest


_LAYOUT_FIELDS = ("sparse", "rows", "cols", "dtype")


def check_layout(manifest: Mapping[str, Any], tables: Sequence[TableSpec]) -> None:
    """Refuse a checkpoint of another model layout, naming the first difference."""
    where = manifest.get("root", "checkpoint")
    saved = {t["name"]: t for t in manifest["tables"]}
    mine = {t.name: t for t in tables}
    if set(saved) != set(mine):
        only_saved = sorted(set(saved) - set(mine))
        only_mine = sorted(set(mine) - set(saved))
        raise CheckpointError(
            f"checkpoint {where} was saved for another model layout: tables "
            f"{only_saved or '[]'} are only in the checkpoint, {only_mine or '[]'} only in "
            f"this job"
        )
    for name, spec in mine.items():
        s = saved[name]
        for f in _LAYOUT_FIELDS:
            if s.get(f) != getattr(spec, f):
                raise CheckpointError(
                    f"checkpoint {where} was saved for another model layout: table {name!r} "
                    f"has {f}={s.get(f)!r} in the checkpoint but {getattr(spec, f)!r} here"
                )
        opt = s.get("optimizer", {}).get("name")
        if opt != spec.optimizer.name:
            raise CheckpointError(
                f"checkpoint {where} was saved for another model layout: table {name!r} "
                f"has optimizer {opt!r} in the checkpoint but {spec.optimizer.name!r} here "
                f"(its state slots differ)"
            )


# --- shard backups (recovery) ------------------------------------------------------------------

_LATEST = "LATEST"


def write_backup(backup_dir: str, shard: Any, meta: Mapping[str, Any]) -> str:
    """Write ``shard`` (a ParameterShard) into a new version directory under ``backup_dir``,
    then point ``LATEST`` at it with an atomic ``os.replace``; older versions are removed."""
    os.makedirs(backup_dir, exist_ok=True)
    version = f"b-{time.time_ns()}"
    tmp = os.path.join(backup_dir, f"tmp-{uuid.uuid4().hex[:12]}")
    shard.save(tmp)
    write_manifest(tmp, dict(meta))
    os.rename(tmp, os.path.join(backup_dir, version))
    pointer = os.path.join(backup_dir, f"{_LATEST}.tmp")
    with open(pointer, "w", encoding="utf-8") as f:
        f.write(version)
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer, os.path.join(backup_dir, _LATEST))
    for name in os.listdir(backup_dir):
        if name != version and (name.startswith("b-") or name.startswith("tmp-")):
            shutil.rmtree(os.path.join(backup_dir, name), ignore_errors=True)
    return version


def read_backup(backup_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(directory, meta) of the latest backup under ``backup_dir``, or None if there is none."""
    try:
        with open(os.path.join(backup_dir, _LATEST), encoding="utf-8") as f:
            version = f.read().strip()
    except FileNotFoundError:
        return None
    root = os.path.join(backup_dir, version)
    with open(os.path.join(root, MANIFEST), encoding="utf-8") as f:
        return root, json.load(f)
