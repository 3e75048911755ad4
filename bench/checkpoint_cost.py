"""Cost of a checkpoint: save and load one shard's table (Momentum), dense or sparse.

    python bench/checkpoint_cost.py [--rows 1000000] [--cols 8] [--repeat 5] [--dir DIR]
    python bench/checkpoint_cost.py --sparse --rows 67108864 --repeat 1   # 64M hashed keys

Saves with the same calls as ``PSClient.save`` (a temporary directory, the shard's files, the
manifest, the commit) and loads with those of ``PSClient.load`` (the manifest, then
``ParameterShard.load``), in one process without Ray, so the figures are the checkpoint code
alone. ``--sparse`` holds ``rows`` rows of int64 keys spread over the whole range (filled in
chunks, every row and its momentum non-zero). Prints the median seconds of ``--repeat`` runs of
each, the checkpoint's size, and the peak resident memory each added above the table itself
(a save or load in row chunks needs no second copy of the table). ``copy``: what a save in the
background (``angel.save.model.async``, angelps/server/shard_saves.py) makes training wait for,
the shard's copy of its rows (``ParameterShard.image(copy=True)``), and the memory it holds
while the copy is written.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from angelps.checkpoint import files as checkpoint
from angelps.server.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec, mix64

_CHUNK = 1 << 20


def _shard(rows: int, cols: int, sparse: bool) -> tuple[ParameterShard, TableSpec]:
    opt = OptimizerSpec("momentum")
    spec = TableSpec("t", rows=-1 if sparse else rows, cols=cols, sparse=sparse, optimizer=opt)
    shard = ParameterShard(0, 1, [spec])
    rng = np.random.default_rng(0)
    for clock, a in enumerate(range(0, rows, _CHUNK)):
        idx = np.arange(a, min(a + _CHUNK, rows), dtype=np.uint64)
        keys = np.sort(mix64(idx).view(np.int64)) if sparse else idx.astype(np.int64)
        grads = rng.standard_normal((len(keys), cols)).astype(np.float32)
        shard.push(0, clock, {"t": (keys, grads)}, 0.1)  # every row and its momentum non-zero
    return shard, spec


def _save(shard: ParameterShard, spec: TableSpec, path: str) -> None:
    tmp = checkpoint.new_tmp_dir(path)
    info = shard.save(tmp)
    checkpoint.write_manifest(tmp, checkpoint.build_manifest([spec], 1, "hash", [info]))
    checkpoint.commit_dir(tmp, path)


def _load(shard: ParameterShard, path: str) -> None:
    m = checkpoint.read_manifest(path)
    shard.load(m["root"], m)


def _rss_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _timed_peak(fn: Callable[[], None]) -> tuple[float, int]:
    """Seconds of ``fn`` and its peak resident memory above the resident memory before it
    (bytes; Linux: the peak is reset through /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass
    before = _rss_kib("VmRSS")
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    return seconds, max(0, _rss_kib("VmHWM") - before) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sparse", action="store_true", help="hashed int64 keys (rows = -1)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    t = time.perf_counter()
    shard, spec = _shard(args.rows, args.cols, args.sparse)
    fill = time.perf_counter() - t
    table_bytes = shard.stats()["bytes"]["t"]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = os.path.join(d, "ck")
        saves, loads, copies, peaks = [], [], [], [0, 0, 0]
        for _ in range(args.repeat):
            s, peak = _timed_peak(lambda: shard.image(copy=True))
            copies.append(s)
            peaks[2] = max(peaks[2], peak)
            s, peak = _timed_peak(lambda: _save(shard, spec, path))
            saves.append(s)
            peaks[0] = max(peaks[0], peak)
            s, peak = _timed_peak(lambda: _load(shard, path))
            loads.append(s)
            peaks[1] = max(peaks[1], peak)
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    kind = "sparse" if args.sparse else "dense"
    print(
        f"{args.rows} rows x {args.cols} cols ({kind}, momentum, table {table_bytes / 2**30:.2f} "
        f"GiB, filled in {fill:.1f} s): save {statistics.median(saves):.2f} s, "
        f"load {statistics.median(loads):.2f} s (median of {args.repeat}), checkpoint "
        f"{size / 2**20:.0f} MiB; peak memory above the table: save {peaks[0] / 2**20:.0f} MiB, "
        f"load {peaks[1] / 2**20:.0f} MiB; in the background training waits for the copy: "
        f"{statistics.median(copies):.2f} s, {peaks[2] / 2**20:.0f} MiB"
    )


if __name__ == "__main__":
    main()
