"""The data plane's calls with and without memory shared with a shard on the client's node
(``angel.ps.shared.mib``, angelps/client/shared.py): a device tier's swap (write back ``k``
whole rows, read ``k`` others) and a step (push ``k`` gradients, pull ``k`` rows), timed through
real shard actors, each call waited for.

Usage:
    python bench/shared_memory.py --json bench/results/shared_memory.json
    python bench/shared_memory.py --keys 8192 55000 --cols 4 --reps 50

Each point is the median of ``--reps`` calls after five warm-up calls; ``shared_mib=0`` puts
every body on the socket (the data plane before), the other value lets bodies travel in the
segment. Rows are float32 with Adam's slots (a swap moves a row's weights and state: 3x the
columns plus one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import ray

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.table import OptimizerSpec, TableSpec


def _median_ms(fn: Any, reps: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def measure(keys: int, cols: int, shards: int, shared_mib: int, reps: int) -> dict[str, Any]:
    """Milliseconds a swap and a step take with ``keys`` rows each way."""
    spec = TableSpec(
        "emb", rows=1 << 24, cols=cols, sparse=True, init="normal", init_std=0.01, seed=1,
        optimizer=OptimizerSpec("adam"),
    )  # fmt: skip
    conf = {
        "angel.job.name": f"shm-bench-{shared_mib}",
        "angel.ps.number": shards,
        "angel.ps.shared.mib": shared_mib,
    }
    client = PSClient.launch([spec], PSOptions.from_config(conf))
    try:
        rng = np.random.default_rng(0)
        ids = np.unique(rng.integers(0, 1 << 24, 3 * keys))[: 2 * keys]
        held, missed = np.sort(ids[:keys]), np.sort(ids[keys:])
        rows = client.swap_async({}, {"emb": held}).result()["emb"].copy()
        grads = rng.standard_normal((keys, cols)).astype(np.float32)

        def swap() -> None:
            client.swap_async({"emb": (held, rows)}, {"emb": missed}).result()

        def step() -> None:
            client.push_pull({"emb": (held, grads)}, 0.01, {"emb": missed})

        out = {
            "keys": keys,
            "cols": cols,
            "shards": shards,
            "shared_mib": shared_mib,
            "swap_ms": _median_ms(swap, reps),
            "step_ms": _median_ms(step, reps),
            "swap_mb_each_way": len(held) * (8 + rows.shape[1] * 4) / 1e6,
            "shared": [getattr(ch, "arena", None) is not None for ch in client.net.chans],
        }
    finally:
        client.shutdown()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, nargs="+", default=[8192, 55000])
    p.add_argument("--cols", type=int, default=4)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    p.add_argument("--shared-mib", type=int, default=64)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--json", default="", help="write the results here")
    args = p.parse_args()
    start_ray()
    results = []
    try:
        for shards in args.shards:
            for keys in args.keys:
                for mib in (0, args.shared_mib):
                    r = measure(keys, args.cols, shards, mib, args.reps)
                    results.append(r)
                    print(
                        f"shards {shards} keys {keys:>6} shared.mib {mib:>3}: swap "
                        f"{r['swap_ms']:.2f} ms, step {r['step_ms']:.2f} ms",
                        flush=True,
                    )
    finally:
        ray.shutdown()
    if args.json:
        write_results(args.json, results)


def start_ray() -> None:
    """A local Ray over this machine's cores, quiet, in a short temp dir (socket paths)."""
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rs"))  # fmt: skip


def write_results(path: str, results: list[dict[str, Any]]) -> None:
    """``results`` as JSON at ``path``, with the machine and the command's arguments."""
    doc = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "argv": sys.argv[1:],
        "results": results,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
