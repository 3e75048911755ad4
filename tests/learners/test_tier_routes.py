"""Several workers' device tiers routing the read after the next one with the next
(learners/worker/tier_routes.py), in two processes joined over gloo as the workers are: the
room an owner makes keeps the rows it serves in that read last, the hit rate rises, a step
still routes once, the owners ask for that read's misses a step early (two swaps in flight:
the next read finds its misses placed), and every row read and trained is as when one table
holds them all, with a save's flush and a read outside training between two steps."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from angelps import OptimizerSpec, TableSpec

IDS = 3000
SPECS = [
    TableSpec("w", IDS, 1, sparse=True, optimizer=OptimizerSpec("momentum", l2=0.01)),
    TableSpec(
        "v", IDS, 4, sparse=True, init="normal", init_std=0.1, optimizer=OptimizerSpec("adam")
    ),
]
STEPS = 12


def _batch(rank: int, step: int) -> dict[str, np.ndarray]:
    """Worker ``rank``'s request of ``step``: power-law ids, one array for both tables."""
    rng = np.random.default_rng(1000 * step + rank)
    ids = np.unique((rng.pareto(1.1, 150) * 30).astype(np.int64) % IDS)
    return {"w": ids, "v": ids}


def _grads(rank: int, step: int, req: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(7 + 1000 * step + rank)
    return {
        s.name: torch.from_numpy(rng.standard_normal((len(req[s.name]), s.cols)).astype("f4"))
        for s in SPECS
    }


def _train(rank: int) -> tuple[float, int, int]:
    """12 updates of both workers' batches, the batch after the next one given with each
    prefetch (not at the last two, as at an epoch's end); after the 5th, a save's flush and a
    read outside training. Each read and the rows at the end checked against one table
    holding every row in this process; the tier's hit rate, the routes made and the reads
    that found their misses placed ahead."""
    from learners.worker.device_tier import TierPolicy
    from learners.worker.held_tables import HeldTables
    from tests.learners.test_device_tier import _Shards

    cpu = torch.device("cpu")
    shards = _Shards(SPECS, 2)  # (each owner swaps only the rows it owns)
    tiers = {"w": 120, "v": 120}
    held = HeldTables(SPECS, rank, 2, "hash", cpu, "gloo", tiers, TierPolicy(), lambda: shards)
    whole = HeldTables(SPECS, 0, 1, "hash", cpu)
    assert held.exchange is not None
    routes = [0]
    route = held.exchange._route

    def counted(*a: Any) -> Any:
        routes[0] += 1
        return route(*a)

    held.exchange._route = counted  # type: ignore[method-assign]
    nxt, after = _batch(rank, 0), _batch(rank, 1)
    for step in range(STEPS):
        req = nxt
        got = held.rows(req)
        want = whole.rows(req)
        for n in ("w", "v"):
            np.testing.assert_allclose(got[n].numpy(), want[n].numpy(), rtol=1e-5, atol=1e-7)
        for n, g in _grads(rank, step, req).items():
            held.add_grad(n, req[n], g)
        for r in (0, 1):  # (the one table takes both workers' gradients)
            theirs = _batch(r, step)
            for n, g in _grads(r, step, theirs).items():
                whole.add_grad(n, theirs[n], g)
        held.apply(1.0, 0.05)
        whole.apply(1.0, 0.05)
        nxt, after = after, _batch(rank, step + 2)
        held.prefetch(nxt, after if step < STEPS - 2 else None)
        if step == 4:
            held.flush_tiers()
            held.train(False)
            held.rows({"w": np.arange(0, IDS, 7), "v": np.arange(0, IDS, 7)})
            held.train(True)
    counts = held.tier_counts()
    held.train(False)
    keys = np.arange(IDS)
    got = held.rows({"w": keys, "v": keys})
    want = whole.rows({"w": keys, "v": keys})
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n].numpy(), want[n].numpy(), rtol=1e-5, atol=1e-7)
    assert counts.writebacks > 0
    placed = sum(b.reads_placed_ahead for b in held.books)
    return counts.hits / counts.lookups, routes[0], placed


def _run(rank: int, port: int) -> None:
    from learners.worker import tier_routes

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        runs = {}
        for route, ask in ((True, True), (True, False), (False, False)):
            tier_routes.ROUTE_AFTER, tier_routes.ASK_AFTER = route, ask
            runs[route, ask] = _train(rank)
        both, routed, blind = runs[True, True], runs[True, False], runs[False, False]
        # The read after's route is made a step early and reused: one route a step, but two
        # at the first prefetch and at the one after the read outside training (their batch
        # was not routed ahead), and none at the first prefetch given no batch after (its
        # batch was routed with the one before).
        assert both[1] == routed[1] == blind[1] + 1, runs
        assert both[0] == routed[0] > blind[0], runs  # (the same rooms, asked earlier)
        # The next read's misses are placed before it (asked for a step early, or at once
        # where they were not): every read but the first (never prefetched) and the last (no
        # batch after it, so its room only is made ahead, as with one swap in flight).
        assert both[2] == STEPS - 2 and routed[2] == blind[2] == 0, runs
    finally:
        dist.destroy_process_group()


def test_two_owners_route_the_read_after_the_next_and_stay_exact() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run, args=(port,), nprocs=2, join=True)
