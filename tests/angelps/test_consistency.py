"""BSP / SSP / ASP: the clock rules as a pure class, then each guarantee on a real local Ray
with one deliberately slowed worker.

Every worker pushes a gradient of -1 to the one row of a zero-initialised table with SGD and
lr 1, so the row's value counts the pushes applied (under BSP, one update of -W per step)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.server.consistency import ClockTable
from angelps.table import OptimizerSpec, TableSpec

# --- the pure rules ----------------------------------------------------------------------------


def test_bsp_rules():
    c = ClockTable(2, 0)
    assert c.can_pull(0, 0) and c.can_push(0, 0)
    c.record_push(0)
    assert not c.can_pull(0, 1)  # waits for worker 1's push of clock 0
    assert not c.complete_clock()
    c.record_push(1)
    assert c.complete_clock()
    c.mark_applied()
    assert c.can_pull(0, 1) and c.can_pull(1, 1)
    assert not c.can_pull(0, 2)  # its own push of clock 1 is missing
    with pytest.raises(ValueError, match=r"worker id -1 is out of range"):
        c.check_worker(-1)


def test_ssp_rules():
    c = ClockTable(2, 2)
    for _ in range(3):
        c.record_push(0)
    # Worker 0 at clock 3 needs every push of clocks < 1: worker 1 has pushed none.
    assert not c.can_pull(0, 3)
    assert c.can_pull(0, 2)
    c.record_push(1)
    assert c.can_pull(0, 3)
    assert c.stale_push(0, 1) and not c.stale_push(0, 3)


def test_asp_rules_and_bad_worker():
    c = ClockTable(2, -1)
    for _ in range(10):
        c.record_push(0)
    assert c.can_pull(0, 10) and not c.can_pull(0, 11)
    with pytest.raises(ValueError, match=r"worker id 2 is out of range: this job has 2 worker"):
        c.check_worker(2)
    assert "SSP" in ClockTable(1, 3).describe() and "ASP" in c.describe()


# --- on Ray ------------------------------------------------------------------------------------

X = TableSpec("x", rows=1, cols=1, init="zeros", optimizer=OptimizerSpec("sgd"))
STEPS = 10


@ray.remote(num_cpus=0)
class Worker:
    def run(self, client: PSClient, steps: int, delay: float) -> list[float]:
        """Value of the row seen at clocks 0..steps (fused push + pull each step)."""
        seen = [float(client.pull("x", np.array([0]))[0, 0])]
        for _ in range(steps):
            time.sleep(delay)
            r = client.push_pull(
                {"x": (np.array([0]), np.array([[-1.0]]))}, 1.0, {"x": np.array([0])}
            )
            seen.append(float(r["x"][0, 0]))
        client.flush()
        return seen


@pytest.fixture(scope="module")
def workers(ray_local):
    return [Worker.remote(), Worker.remote()]


def _run(workers, staleness, shards=1, slow=0.08):
    c = PSClient.launch(
        [X],
        PSOptions.from_config(
            {
                "angel.job.name": f"cons{staleness}",
                "angel.ps.number": shards,
                "angel.staleness": staleness,
            }
        ),
        num_workers=2,
    )
    try:
        # Worker 1 is slowed down; worker 0 runs as fast as the PS lets it.
        refs = [
            workers[0].run.remote(c.for_worker(0), STEPS, 0.0),
            workers[1].run.remote(c.for_worker(1), STEPS, slow),
        ]
        fast, slow_seen = ray.get(refs)
        # The launching client, at clock 0, reads the current rows without waiting.
        final = float(c.pull("x", np.array([0]))[0, 0])
        return fast, slow_seen, final
    finally:
        c.shutdown()


def test_bsp_every_pull_sees_exactly_all_previous_steps(workers):
    fast, slow, final = _run(workers, 0, shards=2)
    # One update per step on the sum of both workers' gradients: exactly 2 per clock.
    assert fast == [2.0 * c for c in range(STEPS + 1)]
    assert slow == fast
    assert final == 2.0 * STEPS


def test_ssp_bounded_staleness(workers):
    s = 2
    fast, slow, final = _run(workers, s)
    for seen in (fast, slow):
        for c, v in enumerate(seen):
            # Own pushes (c) plus at least the other worker's pushes of clocks < c - s.
            assert v >= c + max(0, c - s), (c, v, seen)
    assert any(v < 2 * c for c, v in enumerate(fast))  # it did run ahead of the slow worker
    assert final == 2.0 * STEPS  # nothing dropped


def test_asp_never_waits_and_drops_nothing(workers):
    fast, slow, final = _run(workers, -1, slow=0.15)
    # The fast worker finished all its steps long before the slow one pushed most of its own.
    assert fast[-1] < STEPS + STEPS // 2, fast
    assert all(v >= c for c, v in enumerate(fast))  # reads its own writes
    assert slow[-1] == 2.0 * STEPS  # the slow worker's last pull sees every push
    assert final == 2.0 * STEPS
