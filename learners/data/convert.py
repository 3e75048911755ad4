"""The text-to-Parquet converter: :func:`to_parquet` and ``python -m learners.data SRC DST``.

The Parquet file holds the rows as the text reader reads them (same ids, values and order, blank
and skipped lines dropped), with the labels before the label transform, so the same
configuration reads both files alike. Every row group but the last has ``row_group_rows`` rows.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from angelconf.config import load_config
from learners.data.batch import Batch, concat
from learners.data.options import KEYS, DataOptions
from learners.data.problems import ReadStats
from learners.data.reader import Reader

__all__ = ["main", "to_parquet"]


def _schema(opts: DataOptions) -> pa.Schema:
    return pa.schema(
        [
            (opts.parquet_label_col, pa.float32()),
            (opts.parquet_ids_col, pa.list_(pa.int64())),
            (opts.parquet_values_col, pa.list_(pa.float32())),
        ]
    )


def _table(b: Batch, schema: pa.Schema) -> pa.Table:
    offsets = pa.array(b.indptr.astype(np.int32) if b.nnz < 2**31 else b.indptr)
    return pa.table(
        [
            pa.array(b.labels),
            pa.ListArray.from_arrays(offsets, pa.array(b.ids)),
            pa.ListArray.from_arrays(offsets, pa.array(b.values)),
        ],
        schema=schema,
    )


def to_parquet(
    src: str, dst: str, opts: DataOptions, *, row_group_rows: int = 1 << 20
) -> ReadStats:
    """Convert a text input (libsvm, dummy or dense, per ``opts``) to Parquet, streaming.

    Writes the columns named by ``ml.data.parquet.{label,ids,values}.col``: the labels as read
    (before the label transform), the 0-based ids and the values. Returns the read counts.
    """
    if opts.kind == "parquet":
        raise ValueError("to_parquet: the source is already Parquet (ml.data.type=parquet)")
    schema = _schema(opts)
    stats = ReadStats()
    reader = Reader(src, opts, stats=stats, transform=False)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    # Chunks are regrouped so that every row group but the last has exactly row_group_rows rows.
    pending: list[Batch] = []
    count = 0
    with pq.ParquetWriter(dst, schema) as writer:
        for b in reader:
            pending.append(b)
            count += len(b)
            if count >= row_group_rows:
                whole = concat(pending)
                cut = count - count % row_group_rows
                writer.write_table(
                    _table(whole.take(np.arange(cut)), schema), row_group_size=row_group_rows
                )
                pending, count = [whole.take(np.arange(cut, count))], count - cut
        if count:
            writer.write_table(_table(concat(pending), schema), row_group_size=row_group_rows)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m learners.data SRC DST [--set key=value ...]``: convert text input to Parquet."""
    parser = argparse.ArgumentParser(
        prog="python -m learners.data",
        description="Convert a libsvm, dummy or dense input (a file or a directory) to Parquet.",
    )
    parser.add_argument("src", help="text input")
    parser.add_argument("dst", help="Parquet file to write")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a data key, e.g. ml.data.type=dummy (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        opts = DataOptions.from_config(load_config(None, args.set, KEYS))
        stats = to_parquet(args.src, args.dst, opts)
    except ValueError as e:  # DataError and ConfigError included
        print(f"error: {e}")
        return 2
    print(f"{args.dst}: {stats.summary()}")
    return 0
