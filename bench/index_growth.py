"""A shard's tables filling up with new ids, in one process: how long the growths of the hash
index take (the steps that wait for them) and the whole fill.

FM's two tables (bench/swap_keys.py's: a weight and an 8-column embedding, Momentum) over ids
of any int64 value, filled by swaps of ``--keys`` new keys each (as a first epoch over 10^8
ids makes rows) up to ``--held`` keys a table. Each time a table's index passes its load
(0.75) it is rehashed into 1.5x the buckets: the swap that makes it waits. Reported: the total
fill, the slowest swap (a growth) and each growth's keys and seconds, with the index's growth
as it is (``runs``: the old buckets' keys laid as runs) and as it was (``probe``: each key
probed into the new buckets, defined here for comparison), alternated over ``--rounds``.

Usage:
    python bench/index_growth.py --json bench/results/index_growth_cpu.json
    python bench/index_growth.py --held 10000000 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shared_memory import write_results
from swap_keys import specs

from angelps.server.shard import ParameterShard
from angelps.storage import open_index
from angelps.storage.open_index import OpenIndex


def probed_growth(self: OpenIndex, need: int) -> None:
    """The growth before runs: every old bucket's key probed into the new buckets."""
    old = self.buckets
    self.buckets = np.zeros(open_index._capacity_for(need), dtype=np.int32)
    for a in range(0, len(old), open_index._CHUNK):
        tags = old[a : a + open_index._CHUNK]
        tags = tags[tags != 0]
        if len(tags):
            self._place(self.key_at(tags.astype(np.int64) - 1), tags)


def fill(held: int, keys: int, growth: str, seed: int) -> dict[str, Any]:
    """Fill a shard's FM tables with ``held`` new keys, ``keys`` a swap; time every swap and
    every growth of the embedding table's index."""
    runs = OpenIndex._grow
    grows: list[tuple[int, float]] = []

    def timed(self: OpenIndex, need: int) -> None:
        t0 = time.perf_counter()
        (runs if growth == "runs" else probed_growth)(self, need)
        grows.append((self.count, time.perf_counter() - t0))

    OpenIndex._grow = timed  # type: ignore[method-assign]
    try:
        shard = ParameterShard(0, 1, specs())
        rng = np.random.default_rng(seed)
        swaps = []
        t_all = time.perf_counter()
        made = 0
        while made < held:
            k = np.unique(rng.integers(-(2**63), 2**63 - 1, size=keys, dtype=np.int64))
            t0 = time.perf_counter()
            shard.swap({}, {"wide": k, "embedding": k})
            swaps.append(time.perf_counter() - t0)
            made += len(k)
        total = time.perf_counter() - t_all
    finally:
        OpenIndex._grow = runs  # type: ignore[method-assign]
    return {
        "growth": growth,
        "fill_s": round(total, 2),
        "swaps": len(swaps),
        "swap_ms_median": round(1000 * float(np.median(swaps)), 2),
        "swap_ms_max": round(1000 * max(swaps), 1),
        "growth_s_total": round(sum(s for _, s in grows), 2),
        # (both tables grow at the same counts: every second entry is the embedding's)
        "growths": [{"keys": n, "seconds": round(s, 3)} for n, s in grows],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--held", type=int, default=36_000_000, help="keys each table ends with")
    p.add_argument("--keys", type=int, default=400_000, help="new keys a swap makes")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", metavar="PATH", help="where the results go")
    args = p.parse_args()
    out_runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for growth in ("probe", "runs"):
            res = fill(args.held, args.keys, growth, seed=r)
            res["round"] = r + 1
            out_runs.append(res)
            last = res["growths"][-1] if res["growths"] else {"keys": 0, "seconds": 0.0}
            print(
                f"round {r + 1}, {growth}: fill {res['fill_s']} s ({res['growth_s_total']} s of "
                f"it growing), slowest swap {res['swap_ms_max']} ms (median "
                f"{res['swap_ms_median']}), last growth {last['seconds']} s at {last['keys']:,} keys",
                flush=True,
            )
    if args.json:
        write_results(args.json, out_runs)


if __name__ == "__main__":
    main()
