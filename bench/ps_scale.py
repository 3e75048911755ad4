"""Shard storage at scale: one shard's pull+push step as the table grows, against a numpy floor.

    python bench/ps_scale.py                          # 1M, 16M and 64M rows held
    python bench/ps_scale.py --rows 1000000 4000000   # other sizes
    python bench/ps_scale.py --index khash            # pandas' khash index instead of ours
    python bench/ps_scale.py --markdown bench/results/ps_scale.json

One step is what a training step asks of a shard: ``pull`` of 50k unique keys, half of them
held already and half never seen before (so 25k rows are created), then ``push`` of gradients
for the same keys (Momentum, 8 float32 columns), in-process on a plain
:class:`angelps.ParameterShard` (no Ray, no data plane). Keys are unbounded int64 spread over
the whole range, negatives included: the key of row ``i`` is ``mix64(i)`` (a bijection), so the
held keys need no storage in the benchmark. They arrive sorted and unique, as the client sends
them. Each size is filled with pulls of 1M keys, then timed: the median of ``--steps`` steps
after two warm-up steps (the table grows by 25k rows a step).

The floor is the same math on one preallocated numpy array ``[rows, 8 + 8]`` (each row's
weights and momentum side by side) with the row ids known: initialise the new rows
(:func:`angelps.table.init_rows`, written as one slice), gather the pulled rows, gather, update
and scatter the pushed rows and their momentum (``take`` and ``np.put`` of whole rows, the
fastest numpy gather and scatter here). ``floor_rowops`` is the same without the
initialisation.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from angelps.server.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec, init_rows, mix64

COLS = 8
KEYS = 50_000
LR = 0.01
FILL = 1 << 20
SPEC = TableSpec(
    "emb",
    rows=-1,
    cols=COLS,
    sparse=True,
    init="normal",
    init_std=0.01,
    optimizer=OptimizerSpec("momentum", momentum=0.9),
)


# --bounded SPAN: keys in [0, SPAN) instead (SPAN a power of two), for the direct index.
BOUNDED = {"span": 0}


def key_of(rows: np.ndarray) -> np.ndarray:
    """The int64 key of row numbers ``rows`` (mix64: distinct, spread over all of int64; with
    ``--bounded``, an odd multiple modulo the span: distinct in ``[0, span)``)."""
    span = BOUNDED["span"]
    if span:
        mixed = rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        return (mixed & np.uint64(span - 1)).view(np.int64)
    return mix64(rows.astype(np.uint64)).view(np.int64)


def rss_bytes() -> int:
    """Resident memory of this process."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Steps:
    """The row numbers of each step: half drawn from those held, half new (consecutive)."""

    def __init__(self, held: int, seed: int = 0) -> None:
        self.held = held
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """(old row numbers, new row numbers) of one step; the new ones are held after it."""
        half = KEYS // 2
        old = np.unique(self.rng.integers(0, self.held, half + half // 8))[:half]
        while len(old) < half:  # tiny tables: top up
            old = np.unique(np.concatenate([old, self.rng.integers(0, self.held, half)]))[:half]
        new = np.arange(self.held, self.held + half)
        self.held += half
        return old, new


def _median_steps(step: Any, steps: Steps, n: int) -> list[float]:
    times = []
    for i in range(n + 2):
        old, new = steps.next()
        grads = steps.rng.standard_normal((len(old) + len(new), COLS)).astype(np.float32) * 1e-3
        t = time.perf_counter()
        step(i, old, new, grads)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return times


def bench_floor(rows: int, n: int, with_init: bool) -> float:
    """Median seconds of the floor step at ``rows`` rows held."""
    cap = rows + (n + 2) * (KEYS // 2)
    table = np.zeros((cap, 2 * COLS), dtype=np.float32)
    for a in range(0, rows, FILL):  # touch every row, as a filled table would be
        b = min(a + FILL, rows)
        table[a:b, :COLS] = init_rows(SPEC, key_of(np.arange(a, b)))
    flat = table.view(np.dtype((np.void, table.shape[1] * 4))).reshape(-1)  # np.put of rows
    m = np.float32(SPEC.optimizer.momentum)
    lr = np.float32(LR)

    def step(_i: int, old: np.ndarray, new: np.ndarray, grads: np.ndarray) -> None:
        ids = np.concatenate([old, new])
        if with_init:  # the new rows are consecutive: a slice
            table[new[0] : new[-1] + 1, :COLS] = init_rows(SPEC, key_of(new))
        pulled = np.ascontiguousarray(table.take(ids, axis=0)[:, :COLS])
        del pulled
        block = table.take(ids, axis=0)
        v = block[:, COLS:]
        v *= m
        v += grads
        block[:, :COLS] -= lr * v
        np.put(flat, ids, block.view(flat.dtype).reshape(-1))

    return statistics.median(_median_steps(step, Steps(rows), n))


def fill(shard: ParameterShard, rows: int) -> float:
    """Create ``rows`` rows (pulls of sorted keys); returns the seconds it took."""
    t = time.perf_counter()
    for a in range(0, rows, FILL):
        keys = np.sort(key_of(np.arange(a, min(a + FILL, rows))))
        shard.pull({"emb": keys})
    return time.perf_counter() - t


def bench_shard(rows: int, n: int) -> dict[str, Any]:
    """Fill a shard to ``rows`` rows and time ``n`` steps."""
    gc.collect()
    rss0 = rss_bytes()
    spec = replace(SPEC, rows=BOUNDED["span"]) if BOUNDED["span"] else SPEC
    shard = ParameterShard(0, 1, [spec])
    fill_s = fill(shard, rows)
    rss1 = rss_bytes()
    clock = [0]

    def step(_i: int, old: np.ndarray, new: np.ndarray, grads: np.ndarray) -> None:
        keys = key_of(np.concatenate([old, new]))
        order = np.argsort(keys)
        keys = keys[order]
        shard.pull({"emb": keys})
        shard.push(0, clock[0], {"emb": (keys, grads[order])}, LR)
        clock[0] += 1

    steps = Steps(rows)
    times = _median_steps(step, steps, n)
    stats = shard.stats()
    held = int(stats["rows"]["emb"])
    out: dict[str, Any] = {
        "rows": rows,
        "index": stats.get("index", {}).get("emb", "sorted" if spec.rows < 0 else "direct"),
        "rows_after": held,
        "fill_s": fill_s,
        "step_s": statistics.median(times),
        "step_min_s": min(times),
        "step_max_s": max(times),
        "rss_fill_bytes": rss1 - rss0,
        "rss_bytes_per_row": (rss1 - rss0) / rows,
    }
    if "bytes" in stats:  # the shard's own account of its memory
        out["shard_bytes"] = stats["bytes"]["emb"]
        out["shard_bytes_per_row"] = stats["bytes"]["emb"] / held
    return out


def markdown(result: dict[str, Any]) -> str:
    """The table of docs/benchmarks-ps.md from a result JSON."""
    lines = [
        "| rows held | step ms (median) | min-max | floor ms | rowops floor ms | step/floor "
        "| vs smallest | fill s | bytes/row (RSS) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = result["points"][0]["step_s"]
    for p in result["points"]:
        lines.append(
            f"| {p['rows']:,} | {p['step_s'] * 1e3:.1f} "
            f"| {p['step_min_s'] * 1e3:.0f}-{p['step_max_s'] * 1e3:.0f} "
            f"| {p['floor_s'] * 1e3:.1f} | {p['floor_rowops_s'] * 1e3:.1f} "
            f"| {p['step_s'] / p['floor_s']:.1f}x | {p['step_s'] / base:.2f}x "
            f"| {p['fill_s']:.1f} | {p['rss_bytes_per_row']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1 << 20, 16 << 20, 64 << 20])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bounded", type=int, default=0, metavar="SPAN", help="keys in [0, SPAN)")
    p.add_argument(
        "--direct-max", type=int, default=None, help="angelps.storage.index.DIRECT_MAX for this run"
    )
    p.add_argument(
        "--index",
        choices=["open", "khash"],
        default=None,
        help="angelps.storage.index.HASH_KIND for this run (default: the library's)",
    )
    p.add_argument("--label", default="", help="a name for this run (e.g. before, after)")
    p.add_argument("--out", default="bench/results/ps_scale.json")
    p.add_argument("--markdown", metavar="JSON", help="print the table of a result file and exit")
    args = p.parse_args(argv)
    if args.markdown:
        with open(args.markdown, encoding="utf-8") as f:
            data = json.load(f)
        for label, run in data.items():
            sys.stdout.write(f"{label}:\n\n{markdown(run)}\n")
        return 0
    if args.bounded & (args.bounded - 1):
        p.error(f"--bounded must be a power of two, got {args.bounded}")
    BOUNDED["span"] = args.bounded
    from angelps.storage import index

    if args.direct_max is not None:
        index.DIRECT_MAX = args.direct_max
    if args.index is not None:
        index.HASH_KIND = args.index
    points = []
    for rows in args.rows:
        floor = bench_floor(rows, args.steps, with_init=True)
        floor_ops = bench_floor(rows, args.steps, with_init=False)
        gc.collect()
        point = {**bench_shard(rows, args.steps), "floor_s": floor, "floor_rowops_s": floor_ops}
        points.append(point)
        print(
            f"rows {rows:>11,}: step {point['step_s'] * 1e3:7.1f} ms "
            f"(min {point['step_min_s'] * 1e3:.1f}, max {point['step_max_s'] * 1e3:.1f}), "
            f"floor {floor * 1e3:6.1f} ms (row ops {floor_ops * 1e3:.1f}), "
            f"{point['step_s'] / floor:4.1f}x floor, fill {point['fill_s']:.1f} s, "
            f"{point['rss_bytes_per_row']:.0f} B/row RSS",
            flush=True,
        )
    run = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "numpy": np.__version__,
            "load": os.getloadavg(),
        },
        "keys": KEYS,
        "bounded": args.bounded,
        "index": index.HASH_KIND,
        "cols": COLS,
        "steps": args.steps,
        "points": points,
    }
    result: dict[str, Any] = {}
    if os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            result = json.load(f)
    result[args.label or time.strftime("%Y-%m-%dT%H:%M:%S")] = run
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
