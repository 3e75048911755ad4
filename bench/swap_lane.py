"""How long a worker's step call waits when it is sent while a device tier's swap is at the
shard, and how long the swap takes: the swap on the step's own connection (served first,
whole) or on a connection of its own (angelps/client/transport.py), run at the shard on a
thread of its own beside the event loop that answers the step, its row work over
``--threads`` threads (``angel.ps.swap.threads``: angelps/server/shard_swap.py,
angelps/storage/row_threads.py). Real shard actors; each round sends a swap (write back
``--keys`` whole rows, read ``--keys`` others, FM rank 8 with momentum: 2 tables, 72 bytes a
row) and at once a step (push and pull a few rows of a small table), then waits for both, and
for ``--gap-ms`` (a worker's step) before the next round.

Usage:
    python bench/swap_lane.py --json bench/results/swap_lane_cpu.json
    python bench/swap_lane.py --keys 66000 --reps 40 --threads 1 2 --lanes own step
    python bench/swap_lane.py --keys 66000 --threads 1 2 4 --alone   # and the shard alone
    python bench/swap_lane.py --keys 66000 --placed --lanes          # the reply's rows placed

The CPU twin of the GPU figure this change is for: on an H200 the worker's dense call waited
2.6-3.9 ms a step behind the tier's swap (docs/benchmarks-train.md). Reported: the median
milliseconds from the step's send to its answer, and to the swap's answer, and the shard's
own swap time (its ``stats()["served"]``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import ray

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shared_memory import start_ray, write_results

from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.table import OptimizerSpec, TableSpec

ROWS = 1_000_000  # the feed suite's ids


def measure(keys: int, lane: bool, reps: int, gap_ms: float, threads: int = 0) -> dict[str, Any]:
    """Medians over ``reps`` rounds (after three) with the swaps on their own connection
    (``lane``) or on the step's; ``gap_ms`` between rounds (a worker's step: a swap is
    asked for once a step); ``threads``: ``angel.ps.swap.threads``."""
    mom = OptimizerSpec("momentum")
    specs = [
        TableSpec("w", rows=ROWS, cols=1, sparse=True, optimizer=mom),
        TableSpec("v", rows=ROWS, cols=8, sparse=True, init_std=0.01, optimizer=mom),
        TableSpec("bias", rows=64, cols=1, init="zeros", optimizer=mom),
    ]
    conf = {
        "angel.job.name": f"swap-lane-{int(lane)}-{threads}",
        "angel.ps.number": 1,
        "angel.ps.swap.threads": threads,
    }
    client = PSClient.launch(specs, PSOptions.from_config(conf))
    try:
        if not lane:  # (the step's connection carries the swaps, as before)
            client.net.swap_chans = [False] * len(client.net.swap_chans)
        rng = np.random.default_rng(0)
        ids = np.unique(rng.integers(0, ROWS, 12 * keys))
        client.swap_async({}, {"w": ids, "v": ids}).result()  # every row made once
        small = np.arange(64, dtype=np.int64)
        grads = np.ones((64, 1), np.float32)
        alone = []
        for _ in range(reps):  # (a step with no swap at the shard)
            t0 = time.perf_counter()
            client.push_pull({"bias": (small, grads)}, 0.01, {"bias": small})
            alone.append(time.perf_counter() - t0)
        steps, swaps = [], []
        before = client.stats()[0]["served"]
        for i in range(reps + 3):
            back = np.sort(rng.choice(ids, keys, replace=False))
            read = np.sort(rng.choice(ids, keys, replace=False))
            writes = {n: (back, np.zeros((keys, w), np.float32)) for n, w in (("w", 2), ("v", 16))}
            fut = client.swap_async(writes, {"w": read, "v": read})
            t0 = time.perf_counter()
            client.push_pull({"bias": (small, grads)}, 0.01, {"bias": small})
            t_step = time.perf_counter() - t0
            fut.result()
            t_swap = time.perf_counter() - t0
            time.sleep(gap_ms / 1e3)
            if i >= 3:
                steps.append(t_step)
                swaps.append(t_swap)
        after = client.stats()[0]["served"]
        on = client.net.swap_chans[0]
        return {
            "keys": keys,
            "gap_ms": gap_ms,
            "own_connection": lane,
            "swap_threads": threads,
            "swap_connection": type(on).__name__ if on is not None else None,
            "step_alone_ms": 1e3 * statistics.median(alone),
            "step_ms": 1e3 * statistics.median(steps),
            "swap_answer_ms": 1e3 * statistics.median(swaps),
            "shard_swap_ms": 1e3 * (after["swap_s"] - before["swap_s"]) / (reps + 3),
        }
    finally:
        client.shutdown()


@ray.remote
class _AloneShard:
    """A shard's tables in a Ray actor of their own, swapped without a client: the shard's
    work for a swap and nothing else."""

    def __init__(self, threads: list[int]) -> None:
        from angelps.server.shard import ParameterShard

        specs = [
            TableSpec("w", rows=ROWS, cols=1, sparse=True, optimizer=OptimizerSpec("momentum")),
            TableSpec("v", rows=ROWS, cols=8, sparse=True, optimizer=OptimizerSpec("momentum")),
        ]
        self.shards = {t: ParameterShard(0, 1, specs, swap_threads=t) for t in threads}
        order = np.random.default_rng(0).permutation(ROWS)  # (rows made in a random order)
        for a in range(0, ROWS, 100_000):
            k = np.sort(order[a : a + 100_000])
            for sh in self.shards.values():
                sh.swap({}, {"w": k, "v": k})

    def run(self, keys: int, reps: int) -> dict[int, float]:
        """Median ms of a swap (``keys`` rows written back, ``keys`` others read) a thread
        count, the counts alternated."""
        rng = np.random.default_rng(1)
        took: dict[int, list[float]] = {t: [] for t in self.shards}
        for i in range(reps + 3):
            back = np.sort(rng.choice(ROWS, keys, replace=False))
            read = np.sort(rng.choice(ROWS, keys, replace=False))
            writes = {n: (back, np.zeros((keys, w), np.float32)) for n, w in (("w", 2), ("v", 16))}
            for t in sorted(self.shards, reverse=bool(i % 2)):
                t0 = time.perf_counter()
                self.shards[t].swap(writes, {"w": read, "v": read})
                if i >= 3:
                    took[t].append(time.perf_counter() - t0)
        return {t: 1e3 * statistics.median(v) for t, v in took.items()}


@ray.remote
class _ServedShard:
    """A shard actor's own side of a swap over the data plane with its body and reply in
    memory shared with a client (``--placed``): to its answer, with the rows gathered into
    the reply's region or copied there after."""

    def __init__(self) -> None:
        from angelps.client.shared import Segment
        from angelps.options import ShardOptions
        from angelps.server.shard_server import ShardServer

        specs = [
            TableSpec("w", rows=ROWS, cols=1, sparse=True, optimizer=OptimizerSpec("momentum")),
            TableSpec("v", rows=ROWS, cols=8, sparse=True, optimizer=OptimizerSpec("momentum")),
        ]
        conf = {"angel.ps.swap.threads": 1}
        self.server = ShardServer(0, 1, specs, ShardOptions.from_config(conf))
        self.segment = Segment.create(16 << 20)
        order = np.random.default_rng(0).permutation(ROWS)
        for a in range(0, ROWS, 100_000):
            k = np.sort(order[a : a + 100_000])
            self.server.shard.swap({}, {"w": k, "v": k})

    async def run(self, keys: int, reps: int) -> dict[str, float]:
        """Median ms to a swap's answer in each way, alternated: ``copied`` (the rows
        gathered, then copied into the reply's region; the write-backs read after the answer
        copied first), ``placed`` (the rows gathered into the region), ``kept`` (placed, and
        the body kept by the client until the next reply: no copy of the write-backs)."""
        from angelps.client import wire
        from angelps.step_call import StepResult

        srv, rng = self.server, np.random.default_rng(1)
        region = (self.segment, 4096, keys * 72)
        ways = {"copied": (False, True), "placed": (True, True), "kept": (True, False)}
        took: dict[str, list[float]] = {w: [] for w in ways}
        for i in range(reps + 3):
            back = np.sort(rng.choice(ROWS, keys, replace=False))
            read = np.sort(rng.choice(ROWS, keys, replace=False))
            writes = {n: (back, np.zeros((keys, w), np.float32)) for n, w in (("w", 2), ("v", 16))}
            # (as the data plane reads them: views of the call's body)
            head, bufs = wire.swap_parts(writes, {"w": read, "v": read})
            body = bytearray(b"".join(bytes(b) for b in bufs))
            writes, reads = wire.decode_swap(json.dumps(head).encode(), memoryview(body))
            order = list(ways)
            for way in order[i % 3 :] + order[: i % 3]:
                placed, lent = ways[way]
                t0 = time.perf_counter()
                outs = srv._reply_rows(reads, region) if placed else None
                rows, rest = await srv._swap_reads(writes, reads, lent, outs)
                wire.encode_reply(StepResult(rows, 0, 1), region, placed=placed)
                if i >= 3:
                    took[way].append(time.perf_counter() - t0)
                await rest()
        return {w: 1e3 * statistics.median(v) for w, v in took.items()}


def measure_placed(keys: int, reps: int) -> list[dict[str, Any]]:
    """A shard's time to a swap's answer with the rows gathered into the reply's region in
    shared memory, and the body kept by the client, against gathered then copied there, the
    body copied (``--placed``)."""
    actor = _ServedShard.remote()  # type: ignore[attr-defined]
    ms = ray.get(actor.run.remote(keys, reps))
    return [{"keys": keys, "served": True, "way": w, "answer_ms": ms[w]} for w in ms]


def measure_alone(keys: int, threads: list[int], reps: int) -> list[dict[str, Any]]:
    """The shard's work for a swap alone (``--alone``), on each of ``threads`` threads."""
    actor = _AloneShard.remote(threads)  # type: ignore[attr-defined]
    ms = ray.get(actor.run.remote(keys, reps))
    return [{"keys": keys, "alone": True, "swap_threads": t, "shard_swap_ms": ms[t]} for t in ms]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, nargs="+", default=[16000, 66000])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--gap-ms", type=float, default=20.0, help="between rounds (a step)")
    p.add_argument(
        "--threads", type=int, nargs="+", default=[1, 2], help="angel.ps.swap.threads (0: auto)"
    )
    p.add_argument(
        "--lanes", nargs="*", choices=["own", "step"], default=["own"], help="swap connections"
    )
    p.add_argument(
        "--alone",
        action="store_true",
        help="also the shard's work for a swap alone, in an actor, on each --threads count",
    )
    p.add_argument(
        "--placed",
        action="store_true",
        help="also a shard's time to a swap's answer, its rows gathered into the reply's "
        "shared memory or copied there",
    )
    p.add_argument("--json", default="", help="write the results here")
    args = p.parse_args()
    start_ray()
    results = []
    try:
        for keys in args.keys:
            if args.placed:
                for r in measure_placed(keys, args.reps):
                    results.append(r)
                    print(
                        f"keys {keys:>6} the shard's answer, {r['way']}: {r['answer_ms']:.2f} ms",
                        flush=True,
                    )
            if args.alone:
                for r in measure_alone(keys, [max(1, t) for t in args.threads], args.reps):
                    results.append(r)
                    print(
                        f"keys {keys:>6} threads {r['swap_threads']} the shard alone: "
                        f"{r['shard_swap_ms']:.2f} ms a swap",
                        flush=True,
                    )
            for lane, threads in ((la == "own", t) for la in args.lanes for t in args.threads):
                r = measure(keys, lane, args.reps, args.gap_ms, threads)
                results.append(r)
                print(
                    f"keys {keys:>6} threads {threads} "
                    f"swaps on {'their own' if lane else 'the step'} connection: "
                    f"step {r['step_ms']:.2f} ms (alone {r['step_alone_ms']:.2f}), swap answered {r['swap_answer_ms']:.2f} ms "
                    f"(the shard's work {r['shard_swap_ms']:.2f} ms)",
                    flush=True,
                )
    finally:
        ray.shutdown()
    if args.json:
        write_results(args.json, results)


if __name__ == "__main__":
    main()
