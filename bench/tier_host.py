"""A device tier's host work a step, alone: the worker's bookkeeping for its swaps (look the next
batch's ids up, choose the rows to evict and take them, place the misses, index them) and the
training thread's reads, with the feed suite's power-law ids (10^6 ids, FM's two tables with
momentum, a tier of ``--capacity`` rows), in one process: the shard is a real
:class:`angelps.server.shard.ParameterShard` called in place (its time is measured and taken
out), so no transport, no Ray. On a GPU node this work is the update thread's, beside the
training thread's (learners/worker/device_tier.py); the time of each phase here is that of the
CPU's share of it. It is run in the order of one swap in flight (the update thread places
batch k's misses, then asks for k+1's), each step settled before the next.

Usage:
    python bench/tier_host.py --json bench/results/tier_host_cpu.json
    python bench/tier_host.py --epochs 2 --capacity 100000 --eviction lfu

The batches of one epoch (``--steps`` of ``--batch`` rows: 491,520 rows by default, the feed
suite's 500,000) are run ``--epochs`` times; the last epoch is measured, after ``--warm`` of its
steps, when the shard has every row (the first epoch creates rows, which a shard does once).
Reported, in ms a step (medians over the steps measured): the update thread's phases
(``ask``: look up and send, ``room``: choose and take the victims, ``place``: put the misses
and index them, ``update``: the optimizer on the rows), the shard's own work (taken out of
``ask``), and the training thread's read; then the shard's work for the swaps of the steps
measured, replayed as a shard server serves them, in parts (``shard_parts_ms``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from synthetic import SyntheticSpec, generate

from angelps import OptimizerSpec, TableSpec
from angelps.client.tier_swap import swap_async
from angelps.partition import Partitioner
from angelps.server.shard import ParameterShard
from angelps.server.shard_swap import check_swap, read_rows, split_writes, write_back
from learners.worker.device_tier import TierBook, TierPolicy
from learners.worker.held_tables import HeldTables

IDS = 1_000_000  # the feed suite's


def fm_specs() -> list[TableSpec]:
    """FM's two tables over the feed suite's ids, with momentum (as the feed suite trains)."""
    mom = OptimizerSpec("momentum")
    return [
        TableSpec("w", rows=IDS, cols=1, sparse=True, optimizer=mom),
        TableSpec("v", rows=IDS, cols=8, sparse=True, init_std=0.01, optimizer=mom),
    ]


def feed_epoch(batch: int, steps: int) -> list[dict[str, np.ndarray]]:
    """The requests of one epoch of the feed suite's power-law ids: ``steps`` batches of
    ``batch`` rows, each batch's unique ids (one array for both tables: the read is staged)."""
    data = generate(SyntheticSpec(num_ids=IDS), rows=batch * steps, seed=1)
    epoch = []
    for k in range(steps):
        ids = np.unique(data.ids[k * batch : (k + 1) * batch])
        epoch.append({"w": ids, "v": ids})
    return epoch


class Timers:
    """Seconds spent in each timed call, by name, since the last :meth:`take`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.spent[name] += time.perf_counter() - t0

        return timed

    def take(self) -> dict[str, float]:
        out, self.spent = dict(self.spent), defaultdict(float)
        return out


class InPlaceShard:
    """One shard called in place behind the real swap routing (angelps/client/tier_swap.py)."""

    def __init__(self, specs: list[TableSpec], timers: Timers, threads: int) -> None:
        self.specs = {s.name: s for s in specs}
        self.num_shards = 1
        self.shard = ParameterShard(0, 1, specs, swap_threads=threads)
        self.parts = {s.name: Partitioner(s, 1, "hash") for s in specs}
        self.shard_pids: dict[int, int] = {}
        self.swap_call = timers.wrap("shard", self._swap_call)
        #: the swaps asked for while set to a list (the steps measured, for :func:`shard_parts`)
        self.kept: list[tuple[dict[str, Any], dict[str, Any]]] | None = None

    def _swap_call(self, shard: int, writes: Any, reads: Any) -> Any:
        if self.kept is not None:  # (copies: the tier reuses its arrays)
            kept_w = {n: (k.copy(), b.copy()) for n, (k, b) in writes.items()}
            self.kept.append((kept_w, {n: k.copy() for n, k in reads.items()}))
        return 1, self.shard.swap(writes, reads)

    def swap_answers(self, refs: list[Any]) -> list[Any]:
        return list(refs)

    def swap_async(self, writes: Any, reads: Any, every: bool = False) -> Any:
        return swap_async(self, writes, reads, every)  # type: ignore[arg-type]


def measure(
    steps: int,
    warm: int,
    batch: int,
    capacity: int,
    eviction: str,
    threads: int = 1,
    epochs: int = 2,
) -> dict[str, Any]:
    """Medians a step over the last of ``epochs`` epochs of ``steps`` updates, after its first
    ``warm`` (``threads``: the shard's swap threads, angel.ps.swap.threads)."""
    specs = fm_specs()
    timers = Timers()
    shard = InPlaceShard(specs, timers, threads)
    # The update thread's phases, timed where it runs them (the book's methods, put back after).
    phases = {"ask": "prefetch", "room": "make_room", "place": "place_ahead"}
    before = {attr: getattr(TierBook, attr) for attr in phases.values()}
    for name, attr in phases.items():
        setattr(TierBook, attr, timers.wrap(name, before[attr]))
    try:
        run = (steps, warm, batch, epochs)
        return _steps(specs, timers, shard, run, capacity, eviction, threads)
    finally:
        for attr, fn in before.items():
            setattr(TierBook, attr, fn)


def _steps(
    specs: list[TableSpec],
    timers: Timers,
    shard: InPlaceShard,
    run: tuple[int, int, int, int],
    capacity: int,
    eviction: str,
    threads: int,
) -> dict[str, Any]:
    steps, warm, batch, epochs = run
    cols = {s.name: s.cols for s in specs}
    held = HeldTables(
        specs,
        0,
        1,
        "hash",
        torch.device("cpu"),
        tiers={"w": capacity, "v": capacity},
        policy=TierPolicy(eviction=eviction),
        shards=lambda: shard,
    )
    held._update = timers.wrap("update", held._update)  # type: ignore[method-assign]
    epoch = feed_epoch(batch, steps)
    reqs = epoch * epochs + epoch[:1]  # (the last step asks for the next epoch's first)
    first = (epochs - 1) * steps + warm  # (the first step measured)
    per: list[dict[str, float]] = []
    hits = lookups = 0
    held.prefetch(reqs[0])
    for k in range(epochs * steps):
        req = reqs[k]
        t0 = time.perf_counter()
        rows = held.rows(req)
        read = time.perf_counter() - t0
        held.ask_ahead(reqs[k + 1])
        for name, r in rows.items():  # (a gradient of every row read)
            held.add_grad(name, req[name], torch.full((len(r), cols[name]), 1e-3))
        held.apply(1.0, 0.01)
        held.prefetch(reqs[k + 1])
        t1 = time.perf_counter()
        held.settle()
        spent = timers.take()
        spent["read"] = read
        spent["step"] = time.perf_counter() - t0
        spent["settle"] = time.perf_counter() - t1
        spent["ask"] = spent.get("ask", 0.0) - spent.get("shard", 0.0)  # (the shard's out)
        if k + 1 == first:
            shard.kept = []
        if k >= first:
            per.append(spent)
            tc = held.tier_counts()
            hits, lookups = hits + tc.hits, lookups + tc.lookups
        else:
            held.tier_counts()
    names = sorted({p for s in per for p in s})
    out: dict[str, Any] = {
        "batch": batch,
        "capacity": capacity,
        "eviction": eviction,
        "shard_swap_threads": threads,
        "epochs": epochs,
        "unique_ids_per_step": statistics.mean(len(r["w"]) for r in epoch),
        "hit_rate": hits / max(lookups, 1),
        "ms": {p: 1000 * statistics.median(s.get(p, 0.0) for s in per) for p in names},
    }
    out["ms"]["host_update_thread"] = sum(out["ms"].get(p, 0.0) for p in ("ask", "room", "place"))
    out["shard_parts_ms"] = shard_parts(shard.shard, shard.kept or [])
    return out


def shard_parts(shard: ParameterShard, swaps: list[tuple[Any, Any]]) -> dict[str, float]:
    """The shard's work for ``swaps`` (those of the steps measured) replayed as a shard server
    serves them (angelps/server/data_plane.py: checked, the write-backs split, those of rows
    also read written, the rows read, the answer, then the other write-backs), in ms a swap
    (medians): ``check``, ``split``, ``first``, ``read``, ``later`` and their sum ``swap``.
    The rows written back are those the swap wrote then (the shard's rows change; nothing is
    measured after)."""
    table, par = shard._table, shard.swap_par
    per: list[dict[str, float]] = []
    for writes, reads in swaps:
        t = [time.perf_counter()]
        checked = check_swap(table, writes, reads, par)
        t.append(time.perf_counter())
        first, later = split_writes(table, writes, checked, par)
        t.append(time.perf_counter())
        write_back(table, first, par)
        t.append(time.perf_counter())
        read_rows(table, checked, par)
        t.append(time.perf_counter())
        write_back(table, later, par)
        t.append(time.perf_counter())
        parts = ("check", "split", "first", "read", "later")
        per.append({p: t[i + 1] - t[i] for i, p in enumerate(parts)} | {"swap": t[-1] - t[0]})
    if not per:
        return {}
    return {p: 1000 * statistics.median(s[p] for s in per) for p in per[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--epochs", type=int, default=2, help="the last one is measured")
    p.add_argument("--warm", type=int, default=5, help="steps of the last epoch left out")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--eviction", choices=["lru", "lfu"], default="lru")
    p.add_argument("--threads", type=int, default=1, help="the shard's swap threads")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    r = measure(
        args.steps, args.warm, args.batch, args.capacity, args.eviction, args.threads, args.epochs
    )
    print(json.dumps(r, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
