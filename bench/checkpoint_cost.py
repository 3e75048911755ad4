"""Cost of a checkpoint: save and load one shard's table of 1M rows x 8 columns (Momentum).

    python bench/checkpoint_cost.py [--rows 1000000] [--cols 8] [--repeat 5] [--dir DIR]

Saves with the same calls as ``PSClient.save`` (a temporary directory, the shard's files, the
manifest, the commit) and loads with those of ``PSClient.load`` (the manifest, then
``ParameterShard.load``), in one process without Ray, so the figures are the checkpoint code
alone. Prints the median seconds of ``--repeat`` runs of each and the checkpoint's size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from angelps import checkpoint
from angelps.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec


def _shard(rows: int, cols: int) -> tuple[ParameterShard, TableSpec]:
    spec = TableSpec("t", rows=rows, cols=cols, optimizer=OptimizerSpec("momentum"))
    shard = ParameterShard(0, 1, [spec])
    keys = np.arange(rows, dtype=np.int64)
    grads = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    shard.push(0, 0, {"t": (keys, grads)}, 0.1)  # every row and its momentum non-zero
    return shard, spec


def _save(shard: ParameterShard, spec: TableSpec, path: str) -> None:
    tmp = checkpoint.new_tmp_dir(path)
    info = shard.save(tmp)
    checkpoint.write_manifest(tmp, checkpoint.build_manifest([spec], 1, "hash", [info]))
    checkpoint.commit_dir(tmp, path)


def _load(shard: ParameterShard, path: str) -> None:
    m = checkpoint.read_manifest(path)
    shard.load(m["root"], m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    shard, spec = _shard(args.rows, args.cols)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = os.path.join(d, "ck")
        saves, loads = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            _save(shard, spec, path)
            saves.append(time.perf_counter() - t)
            t = time.perf_counter()
            _load(shard, path)
            loads.append(time.perf_counter() - t)
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    print(
        f"{args.rows} rows x {args.cols} cols (momentum): save {statistics.median(saves):.3f} s, "
        f"load {statistics.median(loads):.3f} s (median of {args.repeat}), "
        f"checkpoint {size / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
