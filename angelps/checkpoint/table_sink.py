"""A table file's bytes: one shard's rows of one table as Parquet, hashed while written.

:func:`write_chunks` writes (keys, w, state) chunks, one row group each, into any open binary
file (a local file, an object store's output stream) and counts and hashes (SHA-256) what it
writes, for the checkpoint's manifest (:mod:`angelps.checkpoint.files`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["HashingFile", "chunk_table", "write_chunks"]


def chunk_table(keys: np.ndarray, w: np.ndarray, state: Mapping[str, np.ndarray]) -> pa.Table:
    """One chunk's columns: key, w and a fixed-size list column per optimizer slot."""
    cols: dict[str, pa.Array] = {"key": pa.array(np.ascontiguousarray(keys, dtype=np.int64))}
    for name, arr in [("w", w), *((f"state.{k}", v) for k, v in sorted(state.items()))]:
        a = np.ascontiguousarray(arr)
        cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])
    return pa.table(cols)


#: A column's dictionary grows to this at most before its values are written plain: values that
#: repeat (a long tail of rows barely trained) fit, distinct ones (trained or random
#: embeddings) give up after 16k values instead of 256k (Parquet's default, 1 MiB).
_DICTIONARY_BYTES = 1 << 16


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet columns worth trying a dictionary on: the values (weights, optimizer
    state), not the keys, unique in every file (a dictionary built for each page and
    dropped)."""
    # (a fixed-size list column's values are the Parquet column <name>.list.element)
    return [f"{name}.list.element" for name in schema.names if name != "key"]


class HashingFile:
    """A binary file that hashes (SHA-256) and counts what is written to it."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += view.nbytes
        return int(self.f.write(view))

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.closed = True

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


def write_chunks(
    f: Any, path: str, chunks: Iterable[tuple[np.ndarray, np.ndarray, Mapping[str, np.ndarray]]]
) -> tuple[int, HashingFile]:
    """The chunks as one Parquet file into the open binary file ``f``: (rows, hashed sink)."""
    rows = 0
    sink = HashingFile(f)
    writer: pq.ParquetWriter | None = None
    for keys, w, state in chunks:
        part = chunk_table(keys, w, state)
        if writer is None:
            writer = pq.ParquetWriter(
                pa.PythonFile(sink, mode="w"),
                part.schema,
                write_page_checksum=True,
                use_dictionary=_dictionary_columns(part.schema),
                dictionary_pagesize_limit=_DICTIONARY_BYTES,
            )
        writer.write_table(part)
        rows += len(keys)
    if writer is None:
        raise ValueError(f"checkpoint file {path}: no chunk to write (not even an empty one)")
    writer.close()
    pa.default_memory_pool().release_unused()  # (see angelps.checkpoint.files.iter_table_file)
    return rows, sink
