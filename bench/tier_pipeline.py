"""A device tier's pipeline under a GPU's short step, on the CPU: how long a step takes when the
training thread's own work is short, with one swap in flight (the update thread asks for batch
k+1's misses once batch k's are placed) and with two (it asks for k+1's before k's rows are put:
learners/worker/held_tables.py; its room then knows the batch after the next one and evicts
that batch's rows last, so fewer rows miss).

On a GPU the training thread's forward and backward are a few ms of host work, then waits for
the device (the GIL released); the tier's update thread and the shard's swaps run beside it, and
the step is as long as the longest of the three chains. Here: the feed suite's power-law ids and
FM's two tables (bench/tier_host.py's); the real :class:`HeldTables` with its update thread; the
training thread's forward and backward replaced by ``--host-ms`` of Python work (the GIL held)
and a wait to ``--step-ms``; a real :class:`angelps.server.shard.ParameterShard` served on
a thread of its own (a shard is a process of its own, and its row work releases the GIL), one
swap after another, in order. Reported, ms a step over the last epoch after ``--warm`` steps:
the step (median and mean), the training thread's waits for the tier (for the shard's answers in
it) and for the update thread's queue, the shard's own work, for each mode, alternated
``--rounds`` times. ``--device cuda`` on a GPU node: the tier's rows on the GPU.

Usage:
    python bench/tier_pipeline.py --json bench/results/tier_pipeline_cpu.json
    python bench/tier_pipeline.py --step-ms 6 --host-ms 2 --rounds 3
    python bench/tier_pipeline.py --eviction lfu --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tier_host import feed_epoch, fm_specs

from angelps import TableSpec
from angelps.client.tier_swap import swap_async
from angelps.partition import Partitioner
from angelps.server.shard import ParameterShard
from learners.worker import held_tables
from learners.worker.device_tier import TierPolicy
from learners.worker.held_tables import HeldTables


class ThreadShard:
    """One shard behind the real swap routing (angelps/client/tier_swap.py), its swaps served
    one after another on a thread of its own (as a shard's swap thread serves one connection)."""

    def __init__(self, specs: list[TableSpec], threads: int) -> None:
        self.specs = {s.name: s for s in specs}
        self.num_shards = 1
        self.shard = ParameterShard(0, 1, specs, swap_threads=threads)
        self.parts = {s.name: Partitioner(s, 1, "hash") for s in specs}
        self.shard_pids: dict[int, int] = {}
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="shard-swap")
        self.busy_s = 0.0  # (the shard's own work)

    def _swap(self, writes: Any, reads: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return 1, self.shard.swap(writes, reads)
        finally:
            self.busy_s += time.perf_counter() - t0

    def swap_call(self, shard: int, writes: Any, reads: Any) -> Future[Any]:
        return self.pool.submit(self._swap, writes, reads)

    def swap_answers(self, refs: list[Future[Any]]) -> list[Any]:
        return [f.result() for f in refs]

    def swap_async(self, writes: Any, reads: Any, every: bool = False) -> Any:
        return swap_async(self, writes, reads, every)  # type: ignore[arg-type]


def _busy(seconds: float) -> None:
    """Python work holding the GIL (a training thread's host work: torch's calls, the batch)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(
    reqs: list[dict[str, np.ndarray]],
    steps: int,
    warm: int,
    two: bool,
    step_s: float,
    host_s: float,
    capacity: int,
    threads: int,
    device: str = "cpu",
    eviction: str = "lru",
) -> dict[str, Any]:
    """One run of ``len(reqs) - 2`` updates; the figures of the last ``steps - warm``."""
    specs = fm_specs()
    shard = ThreadShard(specs, threads)
    held = HeldTables(
        specs,
        0,
        1,
        "hash",
        torch.device(device),
        tiers={"w": capacity, "v": capacity},
        policy=TierPolicy(eviction),
        shards=lambda: shard,
    )
    cols = {s.name: s.cols for s in specs}
    n = len(reqs) - 2
    first = n - steps + warm
    times: list[float] = []
    waits = shard_waits = busy = 0.0
    asked = False
    held.prefetch(reqs[0])
    for k in range(n):
        t0 = time.perf_counter()
        if k == first:
            held.tier_counts()
            busy = shard.busy_s
        req = reqs[k]
        rows = held.rows(req)
        if not asked:  # (the worker's ask once an update's reads are done)
            held.ask_ahead(reqs[k + 1])
        _busy(host_s)
        rest = step_s - (time.perf_counter() - t0)
        if rest > 0:  # (the device's forward and backward: the GIL released)
            time.sleep(rest)
        for name, r in rows.items():
            held.add_grad(name, req[name], torch.full((len(r), cols[name]), 1e-3, device=device))
        held.apply(1.0, 0.01)
        asked = held.prefetch(reqs[k + 1], reqs[k + 2] if two else None)
        if k >= first:
            times.append(time.perf_counter() - t0)
    tc = held.tier_counts()
    waits, shard_waits, update_waits = tc.wait_s, tc.wait_shards_s, tc.wait_update_s
    held.settle()
    busy = shard.busy_s - busy
    shard.pool.shutdown()
    m = len(times)
    return {
        "step_ms_median": 1000 * statistics.median(times),
        "step_ms_mean": 1000 * statistics.mean(times),
        "tier_wait_ms": 1000 * waits / m,
        "tier_wait_shards_ms": 1000 * shard_waits / m,
        "tier_wait_update_ms": 1000 * update_waits / m,
        "shard_swap_ms": 1000 * busy / m,
        "hit_rate": tc.hits / max(tc.lookups, 1),
        "asked_two": held.asked_two,
    }


def measure(
    steps: int = 60,
    warm: int = 5,
    batch: int = 8192,
    capacity: int = 100_000,
    step_ms: float = 6.0,
    host_ms: float = 2.0,
    threads: int = 1,
    rounds: int = 2,
    epochs: int = 2,
    device: str = "cpu",
    eviction: str = "lru",
) -> dict[str, Any]:
    """Each mode (one swap in flight, two) ``rounds`` times, alternated; the figures of each
    run (:func:`run`)."""
    epoch = feed_epoch(batch, steps)
    reqs = epoch * epochs + epoch[:2]  # (the last steps ask for the next epoch's first)
    out: dict[str, Any] = {
        "batch": batch,
        "capacity": capacity,
        "step_ms": step_ms,
        "host_ms": host_ms,
        "shard_swap_threads": threads,
        "device": device,
        "eviction": eviction,
        "unique_ids_per_step": statistics.mean(len(r["w"]) for r in epoch),
        "runs": [],
    }
    try:
        for rnd in range(rounds):
            for two in (False, True) if rnd % 2 == 0 else (True, False):
                held_tables.TWO_AHEAD = two
                r = run(
                    reqs,
                    steps,
                    warm,
                    two,
                    step_ms / 1000,
                    host_ms / 1000,
                    capacity,
                    threads,
                    device,
                    eviction,
                )
                r = {"swaps_in_flight": 2 if two else 1, "round": rnd + 1, **r}
                out["runs"].append(r)
                print(
                    json.dumps(
                        {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
                    )
                )
    finally:
        held_tables.TWO_AHEAD = True
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="updates an epoch")
    p.add_argument("--epochs", type=int, default=2, help="the last one is measured")
    p.add_argument("--warm", type=int, default=5, help="steps of the last epoch left out")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--step-ms", type=float, default=6.0, help="the training thread's step")
    p.add_argument("--host-ms", type=float, default=2.0, help="of it, its host work")
    p.add_argument("--threads", type=int, default=1, help="the shard's swap threads")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="cpu", help="the tier's device (cuda: a GPU's rows)")
    p.add_argument("--eviction", choices=["lru", "lfu"], default="lru")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    if args.host_ms > args.step_ms:
        p.error(f"--host-ms {args.host_ms} is longer than --step-ms {args.step_ms}")
    out = measure(
        args.steps,
        args.warm,
        args.batch,
        args.capacity,
        args.step_ms,
        args.host_ms,
        args.threads,
        args.rounds,
        args.epochs,
        args.device,
        args.eviction,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
