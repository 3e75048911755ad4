"""A device tier's swap at one shard over tables of many keys, in one process: FM's two tables
(a weight and an 8-column embedding, Momentum) over ids of any int64 value (the hash index), the
shard holding ``--held`` keys of each; then ``--steps`` swaps of ``--keys`` unique keys each,
read with one key array for both tables, the previous swap's rows written back. ``--new``: the
keys read are new (rows made, as in a first epoch over 10^8 ids); else drawn from those held (a
resumed epoch). Reported: the median milliseconds of a swap, with the second table checking the
first one's slots before it probes its index (``hint``) and without (``probe``), alternated over
``--rounds`` rounds, each on a shard of its own.

Usage:
    python bench/swap_keys.py --json bench/results/swap_keys_cpu.json
    python bench/swap_keys.py --held 30000000 --keys 200000 --new
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from angelps.server import shard_swap
from angelps.server.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec

FILL = 2_000_000  # keys made a swap while the shard is filled


def specs() -> list[TableSpec]:
    """FM's tables over any int64 id, as bench/big_job.py trains them."""
    mom = OptimizerSpec("momentum")
    return [
        TableSpec("wide", rows=-1, cols=1, sparse=True, optimizer=mom),
        TableSpec("embedding", rows=-1, cols=8, sparse=True, init_std=0.01, optimizer=mom),
    ]


def measure(held: int, keys: int, steps: int, new: bool, hint: bool, seed: int = 0) -> float:
    """Median ms of a swap (after ``steps // 5`` not counted) on a shard holding ``held`` keys."""
    shard = ParameterShard(0, 1, specs())
    rng = np.random.default_rng(seed)
    ids = rng.integers(-(2**63), 2**63 - 1, size=held, dtype=np.int64)
    for a in range(0, held, FILL):
        k = np.unique(ids[a : a + FILL])
        shard.swap({}, {"wide": k, "embedding": k})
    saved = shard_swap._hint
    if not hint:
        shard_swap._hint = lambda last, keys: None  # type: ignore[assignment]
    try:
        prev: tuple[np.ndarray, dict[str, np.ndarray]] | None = None
        times = []
        for step in range(steps + steps // 5):
            if new:
                read = np.unique(rng.integers(-(2**63), 2**63 - 1, size=keys, dtype=np.int64))
            else:
                read = np.unique(ids[rng.integers(0, held, size=keys)])
            writes = {} if prev is None else {n: (prev[0], r) for n, r in prev[1].items()}
            t0 = time.perf_counter()
            got = shard.swap(writes, {"wide": read, "embedding": read})
            if step >= steps // 5:
                times.append(time.perf_counter() - t0)
            prev = (read, got)
        return 1000.0 * statistics.median(times)
    finally:
        shard_swap._hint = saved  # type: ignore[assignment]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--held", type=int, default=30_000_000, help="keys each table holds")
    p.add_argument("--keys", type=int, default=200_000, help="keys a swap reads")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new", action="store_true", help="the keys read are new (rows made)")
    p.add_argument("--json", metavar="PATH", help="where the results go")
    args = p.parse_args()
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for hint in (False, True):
            ms = measure(args.held, args.keys, args.steps, args.new, hint, seed=r)
            runs.append({"round": r + 1, "hint": hint, "swap_ms": round(ms, 2)})
            print(f"round {r + 1}, {'hint' if hint else 'probe'}: {ms:.1f} ms a swap", flush=True)
    out = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "args": vars(args),
        "runs": runs,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
