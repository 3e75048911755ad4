"""Checkpoints: every shard's rows and optimizer state in Parquet, plus a JSON manifest.

Layout of a checkpoint directory (format version 2)::

    manifest.json                 format, version, tables (specs), shards, partitioner, clocks,
                                  extra, files (SHA-256, rows, bytes of every table file),
                                  manifest_sha256 (of the manifest's own content)
    <table>/shard-<i>.parquet     columns: key (int64), w (fixed_size_list<dtype>[cols]),
                                  one fixed_size_list column per optimizer slot (state.<slot>);
                                  keys ascending, one row group per chunk of rows

Nothing is pickled. Values are stored in their own dtype, so a restore is bit-identical. A
table is written and read in chunks of rows (:func:`write_table_chunks`, :func:`iter_table_file`),
so a large table never needs a second full copy in memory. Each shard writes its own files (with Parquet page checksums, fsynced) and reports their SHA-256 and
row counts; the client writes the manifest last. Where the directory goes and how it is
committed (a temporary sibling, renames, the previous checkpoint kept as ``<path>.prev``) is
:mod:`angelps.checkpoint.local_dir`.

Invariant: nothing damaged is read silently. Every read of a table file
(:func:`read_table_file`: load, resume, predict, evaluate, a shard's backup) checks its SHA-256
and row count against the manifest and the Parquet page checksums, and every read of a manifest
checks its own checksum; a mismatch is a :class:`CheckpointError` naming the file. Version 1
checkpoints (no checksums) are still read, unchecked.

A restore reads, for every table, all shard files of the checkpoint and keeps the keys that the
new layout routes to this shard: the number of shards and the partitioner may differ from the
saving job's. Tables must match by name, dense/sparse, rows, cols, dtype and optimizer
(which fixes the state slots); anything else is refused with an error naming the difference.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from angelps import fs
from angelps.checkpoint.errors import (
    FORMAT,
    MANIFEST,
    CheckpointDamaged,
    CheckpointError,
    NoCheckpoint,
)
from angelps.checkpoint.store import (
    check_target,
    commit_dir,
    fsync_dir,
    new_tmp_dir,
    previous,
    resolve,
    store_for,
    write_durably,
)
from angelps.checkpoint.table_sink import write_chunks
from angelps.table import TableSpec

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointDamaged",
    "CheckpointError",
    "NoCheckpoint",
    "build_manifest",
    "check_layout",
    "check_target",
    "commit_dir",
    "file_entry",
    "iter_table_file",
    "member",
    "new_tmp_dir",
    "previous",
    "read_manifest",
    "read_table_file",
    "resolve",
    "table_shards",
    "verify",
    "write_manifest",
    "write_table_chunks",
    "write_table_file",
]

VERSION = 2
READABLE = (1, 2)  # version 1: no checksums (read unchecked)
_SELF_SUM = "manifest_sha256"
#: Rows per chunk when a table file is read back (bounds a restore's memory).
READ_CHUNK_ROWS = 1 << 20


def table_file(root: str, table: str, shard: int) -> str:
    """A table file of the checkpoint at ``root`` (:func:`member`: never outside it)."""
    return member(root, table_rel(table, shard))


def member(root: str, rel: str) -> str:
    """The file ``rel`` (a name from a manifest: a table file, ``dense.safetensors``) inside the
    checkpoint directory ``root``: the one resolver of every file a checkpoint names, so that a
    reader never leaves the checkpoint. A name that could lead out of it (absolute, ``..``, an
    empty or ``.`` part, a backslash, a NUL) or, on a local disk, a symbolic link that leads
    out is a CheckpointDamaged naming the checkpoint and the name."""
    parts = rel.split("/")
    bad = (
        not rel
        or "\\" in rel
        or "\0" in rel
        or rel.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
    )
    if bad:
        raise CheckpointDamaged(
            f"checkpoint {root} is damaged: its manifest names {rel!r}, which is not a file "
            "inside the checkpoint; refusing to read it"
        )
    return store_for(root).file_in(root, rel)


def table_rel(table: str, shard: int) -> str:
    """A table file's name inside the checkpoint (the key of the manifest's ``files``)."""
    return f"{table}/shard-{shard}.parquet"


def write_table_file(
    path: str,
    keys: np.ndarray,
    w: np.ndarray,
    state: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """Write one shard's rows of one table (page checksums on, fsynced); returns the file's
    manifest entry: ``rows``, ``sha256``, ``bytes``."""
    return write_table_chunks(path, [(keys, w, state)])


def write_table_chunks(
    path: str, chunks: Iterable[tuple[np.ndarray, np.ndarray, Mapping[str, np.ndarray]]]
) -> dict[str, Any]:
    """Write one shard's rows of one table from (keys, w, state) chunks, one Parquet row group
    each, so a large table is never copied whole; hashed while written, page checksums on,
    fsynced. Returns the file's manifest entry: ``rows``, ``sha256``, ``bytes``."""
    # A local file is fsynced with its directory; an object is complete once closed.
    with store_for(path).open_write(path) as out:
        rows, sink = write_chunks(out, path, chunks)
    return {"rows": rows, "sha256": sink.sha.hexdigest(), "bytes": sink.size}


def table_shards(manifest: Mapping[str, Any], table: str) -> int:
    """How many files hold ``table``: the manifest's ``num_shards``, or the table's own count
    in ``table_shards`` (tables that the workers held are written one file per worker)."""
    return int(manifest.get("table_shards", {}).get(table, manifest["num_shards"]))


def file_entry(manifest: Mapping[str, Any], table: str, shard: int) -> Mapping[str, Any] | None:
    """The manifest's record (sha256, rows) of a table file; None for a version 1 checkpoint."""
    files = manifest.get("files")
    if files is None and int(manifest.get("version", 1)) < 2:
        return None
    entry = (files or {}).get(table_rel(table, shard))
    if entry is None:
        where = manifest.get("root", "checkpoint")
        raise CheckpointError(
            f"checkpoint {where}: its manifest lists no file {table_rel(table, shard)}"
        )
    return dict(entry)


def _file_bytes(path: str, expect: Mapping[str, Any] | None) -> bytes:
    data = _open_checked(path, expect, keep=True)
    assert data is not None
    return data


def _open_checked(path: str, expect: Mapping[str, Any] | None, keep: bool) -> bytes | None:
    """The file's SHA-256 checked against ``expect`` (read in blocks); its bytes if ``keep``."""
    sha = hashlib.sha256()
    parts: list[bytes] = []
    try:
        with store_for(path).open_read(path) as f:
            while block := f.read(1 << 24):
                sha.update(block)
                if keep:
                    parts.append(block)
    except FileNotFoundError:
        raise CheckpointDamaged(f"checkpoint file {path} is missing") from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint file {path}: {e}") from None
    if expect is not None and sha.hexdigest() != expect["sha256"]:
        raise CheckpointDamaged(
            f"checkpoint file {path} is damaged: its SHA-256 does not match the manifest"
        )
    return b"".join(parts) if keep else None


def _damaged(path: str, e: BaseException) -> CheckpointDamaged:
    why = " ".join(str(e).split()) or type(e).__name__
    return CheckpointDamaged(f"checkpoint file {path} is damaged or unreadable: {why}")


_READ_ERRORS = (OSError, KeyError, IndexError, ValueError, AttributeError, pa.ArrowException)


def _columns(t: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    def matrix(name: str) -> np.ndarray:
        col = t.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        width = col.type.list_size
        return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)

    names = t.schema.names
    keys = t.column("key").to_numpy().astype(np.int64, copy=False)
    state = {n[len("state.") :]: matrix(n) for n in names if n.startswith("state.")}
    return keys, matrix("w"), state


def read_table_file(
    path: str, expect: Mapping[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(keys, w, state) of one file written by :func:`write_table_file`, checked against
    ``expect`` (its :func:`file_entry`; None: a version 1 file, unchecked) and its page
    checksums."""
    data = _file_bytes(path, expect)
    try:
        keys, w, state = _columns(
            pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
        )
    except _READ_ERRORS as e:
        raise _damaged(path, e) from None
    _check_rows(path, len(keys), expect)
    return keys, w, state


def iter_table_file(
    path: str, expect: Mapping[str, Any] | None = None, chunk: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """(keys, w, state) chunks of about ``chunk`` rows of one table file, with the checks of
    :func:`read_table_file` (the SHA-256 over the whole file first, read in blocks; the page
    checksums and the row count as the chunks are read): memory bounded by a chunk."""
    _open_checked(path, expect, keep=False)
    try:
        # pre_buffer off: with it, the reader kept every row group's column bytes it had
        # read until the file was done, so a restore held the whole file (measured: Arrow's
        # allocation grew by a chunk's size for every chunk read).
        pf = pq.ParquetFile(fs.input_file(path), page_checksum_verification=True, pre_buffer=False)
        _check_rows(path, pf.metadata.num_rows, expect)
        for batch in _row_chunks(pf, chunk or READ_CHUNK_ROWS):
            yield _columns(batch)
            del batch
            # Arrow's allocator keeps freed buffers: without this, reading a file left about
            # twice its size resident (measured: +620 MiB after a 294 MiB file).
            pa.default_memory_pool().release_unused()
    except _READ_ERRORS as e:
        raise _damaged(path, e) from None


def _row_chunks(pf: pq.ParquetFile, chunk: int) -> Iterator[pa.Table | pa.RecordBatch]:
    """The file's rows, one row group at a time (a chunk as written: only its data is held),
    a row group larger than ``chunk`` rows (a file written before row chunks) in batches."""
    for i in range(pf.metadata.num_row_groups):
        if pf.metadata.row_group(i).num_rows <= chunk:
            yield pf.read_row_group(i)
        else:
            yield from pf.iter_batches(batch_size=chunk, row_groups=[i])


def _check_rows(path: str, rows: int, expect: Mapping[str, Any] | None) -> None:
    if expect is not None and rows != int(expect["rows"]):
        raise CheckpointDamaged(
            f"checkpoint file {path} is damaged: {rows} rows, the manifest says {expect['rows']}"
        )


def build_manifest(
    tables: Sequence[TableSpec],
    num_shards: int,
    partitioner: str,
    shards: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
    **info: Any,
) -> dict[str, Any]:
    """The manifest of a checkpoint: format, tables, layout, per-shard info, the files the
    shards reported (``ParameterShard.save``), extra (which must be JSON-safe: it is checked
    here, before anything is written)."""
    try:
        extra_json = json.loads(json.dumps(dict(extra or {}), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint extra must be a JSON-safe dict: {e}") from None
    files: dict[str, Any] = {}
    for s in shards:
        files.update(s.get("files", {}))
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tables": [t.to_dict() for t in tables],
        "num_shards": int(num_shards),
        "partitioner": str(partitioner),
        "shards": [{k: v for k, v in s.items() if k != "files"} for s in shards],
        "files": files,
        "extra": extra_json,
        **info,
    }


def _self_sum(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k not in (_SELF_SUM, "root")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def write_manifest(root: str, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` durably, with its own checksum (the file and ``root`` fsynced:
    the directory is complete when this returns)."""
    body = json.loads(json.dumps(dict(manifest)))  # the JSON form, as a reader will see it
    body[_SELF_SUM] = _self_sum(body)
    text = json.dumps(body, indent=1, sort_keys=True)
    write_durably(os.path.join(root, MANIFEST), text.encode())
    fsync_dir(root)


def load_manifest_file(root: str) -> dict[str, Any]:
    """The manifest in directory ``root``, its own checksum checked (when it has one)."""
    p = os.path.join(root, MANIFEST)
    try:
        manifest = json.loads(fs.read_bytes(p).decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"cannot read {p}: {' '.join(str(e).split())}") from None
    except ValueError as e:  # not JSON (or not UTF-8): damaged
        why = " ".join(str(e).split())
        raise CheckpointDamaged(f"checkpoint file {p} is damaged or unreadable: {why}") from None
    if not isinstance(manifest, dict):
        raise CheckpointDamaged(f"checkpoint file {p} is damaged: not a JSON object")
    want = manifest.get(_SELF_SUM)
    if want is not None and want != _self_sum(manifest):
        raise CheckpointDamaged(f"checkpoint file {p} is damaged: its checksum does not match")
    return manifest


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (its ``root`` key says where it was found)."""
    root = resolve(path)
    manifest = load_manifest_file(root)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{root} is not an angelps checkpoint (format {manifest.get('format')!r})"
        )
    if manifest.get("version") not in READABLE:
        raise CheckpointError(
            f"{root}: checkpoint format version {manifest.get('version')!r} is not supported "
            f"(this angelps reads versions {', '.join(map(str, READABLE))})"
        )
    manifest["root"] = root
    return manifest


def verify(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` after checking every table file's SHA-256
    (a :class:`CheckpointError` naming the first damaged file); what ``--resume`` checks before
    it starts anything."""
    manifest = read_manifest(path)
    root = manifest["root"]
    for spec in manifest.get("tables", []):
        for shard in range(table_shards(manifest, spec["name"])):
            entry = file_entry(manifest, spec["name"], shard)
            _open_checked(table_file(root, spec["name"], shard), entry, keep=False)
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
