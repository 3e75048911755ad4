"""The all-to-all exchanges of tables held by several workers (learners/worker/table_exchange.py),
in two processes joined over gloo as the workers are: rows read from their owners, and the
owners' updates on the summed gradients, equal one table holding every row."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from angelps import OptimizerSpec, TableSpec

SPEC = TableSpec(
    "e", 300, 3, sparse=True, init="normal", init_std=0.1, optimizer=OptimizerSpec("adam")
)


def _batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 * step + rank)
    ids = np.unique(rng.integers(0, 300, 40 + 15 * rank))
    return ids, rng.standard_normal((len(ids), 3)).astype(np.float32)


def _run(rank: int, port: int, kind: str) -> None:
    from learners.worker.held_tables import HeldTables

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cpu = torch.device("cpu")
        held = HeldTables([SPEC], rank, 2, kind, cpu)
        whole = HeldTables([SPEC], 0, 1, kind, cpu)  # every row, in this process
        assert 0 < len(held.tables["e"].keys) < 300
        for step in range(4):
            # steps 2 and 3: two micro-batches an update (merged; their ids routed anew)
            for micro in [step] if step < 2 else [step, 10 + step]:
                ids, g = _batch(rank, micro)
                got = held.rows({"e": ids})["e"]
                want = whole.rows({"e": ids})["e"].numpy()
                # (the sums of a row's gradients run in another order: float rounding)
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
                held.add_grad("e", ids, torch.from_numpy(g))
                for r in (0, 1):  # the one table takes both workers' gradients
                    i, x = _batch(r, micro)
                    whole.add_grad("e", i, torch.from_numpy(x))
            held.apply(0.5, 0.1)
            whole.apply(0.5, 0.1)
        # Reads are collectives: a worker with fewer prediction chunks takes part idle.
        keys = np.arange(300)
        if rank == 0:
            held.rows({"e": keys[:10]})
            got = held.rows({"e": keys})["e"]
        else:
            held.idle()
            got = held.rows({"e": keys})["e"]
        np.testing.assert_allclose(got.numpy(), whole.rows({"e": keys})["e"].numpy(), rtol=1e-6)
        assert held.bytes_moved > 0
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["hash", "range"])
def test_two_owners_read_and_update_as_one_table(kind: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run, args=(port, kind), nprocs=2, join=True)
