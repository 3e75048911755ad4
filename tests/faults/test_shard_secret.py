"""Fault matrix: a shard serves its rows only to its own job.

On a real local Ray: a job's shard is found by its name (``<job>-ps-0`` in the namespace
``angelps``), as anyone who reaches the cluster can find it. Its actor methods that read or
write rows (``step``, ``save``, ``load``, ``run_backup``) refuse a call without the job's
secret (or with another), naming the method; nothing is read, written or saved. The job's own
client (through Ray calls and through the data plane) is served as before.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import ray
from ray.exceptions import RayTaskError

from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.server.launch import NAMESPACE, actor_name
from angelps.step_call import StepCall
from angelps.table import TableSpec

EMB = TableSpec("emb", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, seed=5)

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.mark.parametrize("transport", ["socket", "ray"])
def test_a_shard_refuses_row_calls_without_the_job_s_secret(tmp_path, transport):
    job = f"secret-{transport}"
    client = PSClient.launch(
        [EMB], PSOptions.from_config({"angel.job.name": job, "angel.ps.transport": transport})
    )
    try:
        keys = np.arange(8, dtype=np.int64)
        grads = np.ones((8, 4), dtype=np.float32)
        before = client.push_pull({"emb": (keys, grads)}, 0.1, {"emb": keys})["emb"]
        outsider = ray.get_actor(actor_name(job, 0), namespace=NAMESPACE)
        calls = {
            "step": lambda s: outsider.step.remote(StepCall(0, 1, pulls={"emb": keys}), secret=s),
            "save": lambda s: outsider.save.remote(str(tmp_path / "stolen"), secret=s),
            "saved": lambda s: outsider.saved.remote(secret=s),
            "swap": lambda s: outsider.swap.remote({}, {"emb": keys}, secret=s),
            "mark_tiers": lambda s: outsider.mark_tiers.remote(["emb"], secret=s),
            "load": lambda s: outsider.load.remote(str(tmp_path), {}, secret=s),
            "run_backup": lambda s: outsider.run_backup.remote(secret=s),
        }
        for method, call in calls.items():
            for secret in ("", "0" * len(client.options.shard.token)):
                with pytest.raises(RayTaskError) as e:
                    ray.get(call(secret))
                assert isinstance(e.value.cause, PermissionError), method
                assert str(e.value.cause) == (
                    f"parameter shard 0: {method}() refused: the call does not carry this "
                    "job's secret (only the job's own clients may read or write its rows)"
                )
        assert not os.path.exists(tmp_path / "stolen")
        # The job's own client: served as before, and its rows were not changed.
        again = client.pull("emb", keys)
        np.testing.assert_array_equal(again, before)
        client.save(str(tmp_path / "ck"))
        assert os.path.exists(tmp_path / "ck" / "manifest.json")
    finally:
        client.shutdown()
