"""A BSP recovery in which the two workers wait for each other: worker 0's call to shard 0
waits for worker 1's next push, while worker 1 cannot push before worker 0 has replayed its
pushes to shard 1, which Ray restarted from a backup. Worker 0 must replay at once, not after
shard 0 answers (before: it waited for shard 0 first, and the job hung until the shards'
timeout: docs/checkpoints.md, "Recovery from a dead shard").

The two workers' clients live in this process, so the test decides the order of their calls:
the deadlock's timing (a shard dying between its replies to two workers) is made every time."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import ray
from ray.exceptions import ActorUnavailableError

from angelps.client.channel import Channel
from angelps.client.ps_client import PSClient
from angelps.server.launch import actor_name
from tests.angelps.test_before_replay import _launch_x
from tests.angelps.test_recovery import kill_shard

KEYS = np.arange(4)
BEFORE = 5  # steps both workers make before the shard is killed (backups every 3 pushes)


def _step(client: PSClient):
    """Push -1 to every row (+1 each with lr 1) and pull them for the next step."""
    return client.push_pull_async({"x": (KEYS, -np.ones((4, 1)))}, 1.0, {"x": KEYS})


def _clock_of(handle, worker: int) -> int:
    """The shard's clock of ``worker``; -1 while Ray restarts it."""
    try:
        return int(ray.get(handle.clock_of.remote(worker)))
    except ActorUnavailableError:
        return -1


@pytest.mark.parametrize("transport", ["socket", "ray"])
def test_a_worker_replays_a_restarted_shard_while_its_other_call_waits_for_a_peer(
    ray_local, tmp_path, capsys, transport
):
    job = f"peers-{transport}"
    # (inline backups: the last at clock 3)
    c = _launch_x(job, tmp_path, {"angel.ps.transport": transport}, num_workers=2)
    w0, w1 = c.for_worker(0), c.for_worker(1)
    try:
        for _ in range(BEFORE):
            f0, f1 = _step(w0), _step(w1)
            f0.result()
            f1.result()
        # (back before worker 0's step: under load a restart took longer than the wait below)
        kill_shard(job, 1, c.learn_pids()[1], back=True)
        shard1 = ray.get_actor(actor_name(job, 1), namespace="angelps")

        # Worker 0's next step: its call to shard 0 waits for worker 1's push, its call to
        # shard 1 reaches the restarted shard (which came back at worker 0's clock 3).
        f0 = _step(w0)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(f0.result()), daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while _clock_of(shard1, 0) != BEFORE + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        replayed_alone = _clock_of(shard1, 0)
        # Now worker 1 steps: its own call to shard 1 fails, it replays, and both go on.
        r1 = _step(w1).result()
        t.join(60)
        assert not t.is_alive(), "worker 0's step never ended"
        assert replayed_alone == BEFORE + 1, (
            f"worker 0 had not replayed its pushes to the restarted shard while its call to "
            f"shard 0 waited for worker 1: shard 1 holds {replayed_alone} of its "
            f"{BEFORE + 1} pushes"
        )
        # Both pulls see every push of both workers, exactly once.
        want = [2.0 * (BEFORE + 1)] * 4
        r0 = got[0]
        assert isinstance(r0, dict)
        np.testing.assert_array_equal(r0["x"][:, 0], want)
        np.testing.assert_array_equal(r1["x"][:, 0], want)
        # And the workers carry on in step.
        f0, f1 = _step(w0), _step(w1)
        np.testing.assert_array_equal(f0.result()["x"][:, 0], [2.0 * (BEFORE + 2)] * 4)
        np.testing.assert_array_equal(f1.result()["x"][:, 0], [2.0 * (BEFORE + 2)] * 4)
        assert [st["restarted"] for st in c.stats()] == [False, True]
        if transport == "socket":  # (the connections to the new process, not Ray calls)
            assert all(isinstance(w.net.chans[1], Channel) for w in (w0, w1))
        err = capsys.readouterr().err
        for w in (0, 1):
            assert (
                err.count(
                    f"angelps: warning: parameter shard 1 died; Ray restarted it and it restored "
                    f"its backup at clock 3 of worker {w}, which replayed {BEFORE + 1 - 3} push(es)"
                )
                == 1
            ), err
    finally:
        for client in (w0, w1):
            client.net.close()
        c.shutdown()
