"""A worker's step before and after one of its shards is killed and restarted by Ray: the
median milliseconds of a fused ``push_pull`` (``--keys`` ids of width ``--width`` over two
shards), the first step after the shard's process is gone (``recovery_s``: Ray's restart, the
backup's restore, the replay and the redone pull), and how the client reaches each shard
afterwards (a connection of its own, or Ray actor calls). A restart should cost the recovery
once, not every step after it.

Usage:
    python bench/after_restart.py --json bench/results/after_restart_cpu.json
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
from angelps.server.launch import actor_name
from angelps.table import OptimizerSpec, TableSpec


def _median_ms(client: PSClient, keys: np.ndarray, grads: np.ndarray, steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        client.push_pull({"w": (keys, grads)}, 0.01, {"w": keys})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _kill(job: str, shard: int, pid: int) -> None:
    """Kill the shard by Ray (which restarts it) and wait for its process to be gone."""
    ray.kill(ray.get_actor(actor_name(job, shard), namespace="angelps"), no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise RuntimeError(f"shard {shard} (pid {pid}) did not die")


def measure(keys: int, width: int, steps: int, transport: str) -> dict[str, Any]:
    job = "after-restart"
    spec = TableSpec(
        "w", rows=-1, cols=width, sparse=True, init="zeros", optimizer=OptimizerSpec("sgd")
    )
    conf = {
        "angel.job.name": job,
        "angel.ps.number": 2,
        "angel.ps.backup.interval": 100,
        "angel.ps.transport": transport,
    }
    c = PSClient.launch([spec], PSOptions.from_config(conf))
    try:
        ids = np.arange(keys, dtype=np.int64) * 7919
        grads = np.ones((keys, width))
        _median_ms(c, ids, grads, steps // 5)  # (warm)
        before = _median_ms(c, ids, grads, steps)
        _kill(job, 1, c.learn_pids()[1])
        t0 = time.perf_counter()
        _median_ms(c, ids, grads, 1)  # (waits for Ray's restart, replays, redoes the pull)
        recovery_s = time.perf_counter() - t0
        _median_ms(c, ids, grads, steps // 5)  # (warm again)
        after = _median_ms(c, ids, grads, steps)
        paths = ["connection" if type(ch).__name__ == "Channel" else "ray" for ch in c.net.chans]
        return {
            "ms_before": before,
            "ms_after": after,
            "recovery_s": recovery_s,
            "paths_after": paths,
        }
    finally:
        c.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1024)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--transport", default="socket", choices=["socket", "ray"])
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args()
    ray.init(
        num_cpus=2,
        _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"),
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        out = measure(args.keys, args.width, args.steps, args.transport)
    finally:
        ray.shutdown()
    out.update(vars(args), machine=f"{os.cpu_count()} cores, {platform.python_version()}")
    out.pop("json")
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
