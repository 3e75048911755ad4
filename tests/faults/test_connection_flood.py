"""Fault matrix: a connection flood against a shard's data plane (on 127.0.0.1 only).

Idle connections beyond ``angel.ps.max.connections`` are refused at once and counted; the
job's own client keeps its connection and gets exactly the rows of an in-process reference
shard throughout; a new client during the flood falls back to Ray calls with a warning; once
the flood ends, connections are accepted again.
"""

from __future__ import annotations

import socket
import time
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import ray

from angelps.client.ps_client import PSClient
from angelps.client.transport import Channel, Transport
from angelps.options import PSOptions
from angelps.server.shard import ParameterShard
from angelps.table import TableSpec

EMB = TableSpec("emb", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, seed=5)


def _until(pred: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    """Wait (bounded) for the shard to have handled the connections opened so far."""
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"the shard never got to {what}")
        time.sleep(0.05)


def _flood(cap: int, n: int) -> None:
    client = PSClient.launch(
        [EMB],
        PSOptions.from_config(
            {
                "angel.job.name": f"flood-{n}",
                "angel.ps.max.connections": cap,
                "angel.ps.token.timeout.ms": 600000,  # the flood's connections stay open
            }
        ),
    )
    ref = ParameterShard(0, 1, [EMB])
    rng = np.random.default_rng(3)

    def step() -> None:
        keys = np.unique(rng.integers(-1000, 1000, 64))
        grads = rng.standard_normal((len(keys), 4)).astype(np.float32)
        got = client.push_pull({"emb": (keys, grads)}, 0.05, {"emb": keys})["emb"]
        ref.push(0, ref.clocks.pushed[0], {"emb": (keys, grads)}, 0.05)
        np.testing.assert_array_equal(got, ref.pull({"emb": keys})["emb"])

    def conns() -> dict[str, int]:
        return client.stats()[0]["connections"]

    flood: list[socket.socket] = []
    try:
        step()  # the job's connection: open before the flood
        chan = client.net.chans[0]
        # (the key, unless it exceeds half of the shard's open-file limit)
        assert conns()["cap"] == min(cap, conns()["cap"])
        cap = conns()["cap"]
        host, port = ray.get(client.handles[0].serve.remote("127.0.0.1"))
        assert host == "127.0.0.1"
        for i in range(n):
            flood.append(socket.create_connection((host, port), timeout=30))
            if i % 50 == 0:
                step()
        _until(lambda: conns()["open"] + conns()["refused"] == n + 1, "every connection")
        assert conns() == {"open": cap, "refused": n + 1 - cap, "dropped": 0, "cap": cap}
        step()
        assert client.net.chans[0] is chan and isinstance(chan, Channel) and not chan.dead
        # A new client process now: refused, so it uses Ray calls for this shard.
        late = Transport(client.handles, client.options)
        with pytest.warns(RuntimeWarning, match="no direct connection to parameter shard 0"):
            assert late._channel(0) is None
        for s in flood:
            s.close()
        flood.clear()
        _until(lambda: conns()["open"] == 1, "the flood's end")
        again = Transport(client.handles, client.options)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert isinstance(again._channel(0), Channel)
        again.close()
        step()
    finally:
        for s in flood:
            s.close()
        client.shutdown()


def test_a_connection_flood_leaves_the_job_unaffected(ray_local: None) -> None:
    _flood(cap=16, n=200)  # (16: far below any open-file limit, so the cap is the key)


@pytest.mark.slow
def test_a_flood_beyond_the_default_cap(ray_local: None) -> None:
    """As many connections as the issue's flood would need to exhaust a shard's files under
    the default cap (bounded by this process's own open-file limit)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(6000, soft - 200)
    cap = PSOptions.from_config({}).max_connections
    if n <= cap:
        pytest.skip(f"this process may open only {soft} files")
    _flood(cap=cap, n=n)
