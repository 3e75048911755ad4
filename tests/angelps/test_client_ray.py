"""PSClient against shard actors on a real local Ray: results equal the in-process shard."""

from __future__ import annotations

import os

import numpy as np
import pytest
import ray

from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.server.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec, init_rows

EMB = TableSpec(
    "emb",
    rows=-1,
    cols=4,
    sparse=True,
    init="normal",
    init_std=0.1,
    seed=2,
    optimizer=OptimizerSpec("adam"),
)
LIN = TableSpec("lin", rows=50, cols=1, init="zeros", optimizer=OptimizerSpec("momentum"))


JOB = "tclient"


@pytest.fixture(scope="module")
def client(ray_local):
    # One launch per module (actor start-up costs seconds); tests only compare relative state.
    c = PSClient.launch(
        [EMB, LIN], PSOptions.from_config({"angel.job.name": JOB, "angel.ps.number": 3})
    )
    yield c
    c.shutdown()


def _steps(seed=0, n=6):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        ek = rng.integers(-1000, 1000, 40)
        lk = rng.integers(0, 50, 30)
        yield (
            ek,
            rng.standard_normal((40, 4)).astype(np.float32),
            lk,
            rng.standard_normal((30, 1)).astype(np.float32),
        )


def test_actors_are_named_in_namespace(client):
    names = {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "angelps"
    }
    assert {f"{JOB}-ps-0", f"{JOB}-ps-1", f"{JOB}-ps-2"} <= names


def test_same_results_as_one_in_process_shard(client):
    ref = ParameterShard(0, 1, [EMB, LIN])
    start = client.step_count
    ref.clocks.pushed[0] = start
    for i, (ek, eg, lk, lg) in enumerate(_steps()):
        lr = 0.1 / (i + 1)
        if i % 3 == 0:
            client.push("emb", ek, eg, lr)
            client.push("lin", lk, lg, lr)
            ref.push(0, ref.clocks.pushed[0], {"emb": (ek, eg)}, lr)
            ref.push(0, ref.clocks.pushed[0], {"lin": (lk, lg)}, lr)
            got = client.pull_many({"emb": ek, "lin": lk})
        elif i % 3 == 1:
            client.push_many({"emb": (ek, eg), "lin": (lk, lg)}, lr)
            ref.push(0, ref.clocks.pushed[0], {"emb": (ek, eg), "lin": (lk, lg)}, lr)
            got = {"emb": client.pull("emb", ek), "lin": client.pull_async("lin", lk).result()}
        else:
            got = client.push_pull({"emb": (ek, eg), "lin": (lk, lg)}, lr, {"emb": ek, "lin": lk})
            ref.push(0, ref.clocks.pushed[0], {"emb": (ek, eg), "lin": (lk, lg)}, lr)
        want = ref.pull({"emb": ek, "lin": lk})
        np.testing.assert_array_equal(got["emb"], want["emb"])
        np.testing.assert_array_equal(got["lin"], want["lin"])
    np.testing.assert_array_equal(client.pull_dense("lin"), ref.pull({"lin": None})["lin"])
    both = client.pull_many({"lin": None, "emb": np.array([5, -5, 5])})
    np.testing.assert_array_equal(both["lin"], ref.pull({"lin": None})["lin"])
    np.testing.assert_array_equal(both["emb"], ref.pull({"emb": np.array([5, -5, 5])})["emb"])
    with pytest.raises(ValueError, match=r"table 'emb' is sparse: pulling all rows needs a dense"):
        client.pull_many({"emb": None})
    assert client.step_count == start + 8
    stats = client.stats()
    assert [s["clocks"]["pushed"] for s in stats] == [[start + 8]] * 3
    assert sum(s["rows"]["lin"] for s in stats) == 50


def test_pull_order_duplicates_and_fresh_rows(client):
    keys = np.array([7000, -3000, 7000, 2**62, -3000])  # never pushed
    np.testing.assert_array_equal(client.pull("emb", keys), init_rows(EMB, keys))
    assert client.pull("emb", np.array([], dtype=np.int64)).shape == (0, 4)


def test_bad_input_raises_before_anything_is_sent(client):
    before = client.pull_dense("lin")
    steps = client.step_count
    with pytest.raises(ValueError, match=r"table 'lin': key 50 is outside the dense range"):
        client.push_many({"lin": (np.array([1, 50]), np.ones(2))}, 0.1)
    with pytest.raises(ValueError, match=r"unknown table 'bias'; tables: emb, lin"):
        client.push_many({"lin": (np.array([1]), np.ones(1)), "bias": ([0], [1.0])}, 0.1)
    with pytest.raises(ValueError, match=r"table 'lin': gradient contains NaN or inf"):
        client.push("lin", np.array([1]), np.array([np.nan]), 0.1)
    with pytest.raises(ValueError, match=r"learning rate -1.0 must be a finite number >= 0"):
        client.push("lin", np.array([1]), np.array([1.0]), -1.0)
    np.testing.assert_array_equal(client.pull_dense("lin"), before)
    assert client.step_count == steps


def test_duplicate_job_name_is_refused(client):
    with pytest.raises(ValueError, match=r"cannot create shard actor 'tclient-ps-0'.*running"):
        PSClient.launch([EMB], PSOptions.from_config({"angel.job.name": JOB, "angel.ps.number": 1}))


def test_two_workers_bsp_sum_then_one_update(ray_local):
    tab = TableSpec("m", rows=4, cols=1, init="zeros", optimizer=OptimizerSpec("momentum"))
    c = PSClient.launch(
        [tab],
        PSOptions.from_config({"angel.job.name": "bsp2", "angel.ps.number": 2}),
        num_workers=2,
    )
    try:
        w0, w1 = c.for_worker(0), c.for_worker(1)
        f0 = w0.push_pull_async({"m": ([0, 3], [[1.0], [2.0]])}, 0.1, {"m": np.arange(4)})
        f1 = w1.push_pull_async({"m": ([3], [[3.0]])}, 0.1, {"m": np.arange(4)})
        r0, r1 = f0.result()["m"][:, 0], f1.result()["m"][:, 0]
        np.testing.assert_allclose(r0, [-0.1, 0.0, 0.0, -0.5], rtol=1e-6)
        np.testing.assert_array_equal(r0, r1)
        assert [s["updates"] for s in c.stats()] == [1, 1]
        with pytest.raises(ValueError, match="worker id 2 is out of range: num_workers=2"):
            c.for_worker(2)
    finally:
        c.shutdown()


def test_save_then_load_into_two_shards(client, tmp_path):
    client.push("emb", np.array([1, 2, 3]), np.ones((3, 4), dtype=np.float32), 0.1)
    keys = np.arange(-1000, 1000)
    want = client.pull_many({"emb": keys, "lin": np.arange(50)})
    client.save(str(tmp_path / "ck"), extra={"scheduler": {"count": 7}})
    other = PSClient.launch(
        [EMB, LIN], PSOptions.from_config({"angel.job.name": "tload", "angel.ps.number": 2})
    )
    try:
        assert other.load(str(tmp_path / "ck")) == {"scheduler": {"count": 7}}
        got = other.pull_many({"emb": keys, "lin": np.arange(50)})
        np.testing.assert_array_equal(got["emb"], want["emb"])
        np.testing.assert_array_equal(got["lin"], want["lin"])
        bad = TableSpec("lin", rows=51, cols=1)
        with pytest.raises(ValueError, match=r"table 'lin' has rows=50 in the checkpoint but 51"):
            PSClient.load(PSClient([EMB, bad], other.handles), str(tmp_path / "ck"))
    finally:
        other.shutdown()


def test_a_save_in_the_background_holds_the_rows_of_its_start(client, tmp_path):
    """``save_async`` returns once every shard copied its rows: pushes after it are not in
    the checkpoint, which its ``result()`` commits (nothing before: no manifest yet)."""
    client.push("emb", np.array([5, 6]), np.ones((2, 4), dtype=np.float32), 0.1)
    keys = np.arange(-50, 50)
    want = client.pull_many({"emb": keys, "lin": np.arange(50)})
    pending = client.save_async(str(tmp_path / "ck"), extra={"at": 1})
    client.push("emb", np.array([5, 7]), np.full((2, 4), 3.0, dtype=np.float32), 0.1)
    client.push("lin", np.arange(50), np.ones((50, 1), dtype=np.float32), 0.1)
    after = client.pull_many({"emb": keys, "lin": np.arange(50)})
    assert not (tmp_path / "ck").exists()
    pending.result()
    assert (tmp_path / "ck" / "manifest.json").is_file()  # committed
    other = PSClient.launch(
        [EMB, LIN], PSOptions.from_config({"angel.job.name": "tasync", "angel.ps.number": 1})
    )
    try:
        assert other.load(str(tmp_path / "ck")) == {"at": 1}
        got = other.pull_many({"emb": keys, "lin": np.arange(50)})
        for name in ("emb", "lin"):
            np.testing.assert_array_equal(got[name], want[name])
            assert not np.array_equal(after[name], want[name])
    finally:
        other.shutdown()


def test_shards_that_cannot_be_placed_fail_clearly(ray_local):
    # The local Ray of this module has no GPU: the shard actors can never start.
    conf = {
        "angel.job.name": "nogpu",
        "angel.ps.gpus": 1.0,
        "angel.matrixtransfer.request.timeout.ms": 1500,
    }
    with pytest.raises(RuntimeError, match=r"did not start within 1.5 s: .*angel\.ps\.gpus=1"):
        PSClient.launch([EMB], PSOptions.from_config(conf))
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    assert "nogpu-ps-0" not in names


@pytest.mark.parametrize("how", ["save", "save_async"])
def test_a_failed_save_leaves_no_temporary_even_while_the_shards_still_write(
    client, tmp_path, monkeypatch, how
):
    # The driver's own file fails (a full disk) while the shards are still writing theirs into
    # the temporary (in the background too): the save waits for them before removing it, so
    # nothing is left behind.
    import errno

    import angelps.client.pending_save

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(angelps.client.pending_save, "write_durably", full)
    with pytest.raises(OSError, match=r"\[Errno 28\] No space left on device"):
        getattr(client, how)(str(tmp_path / "ck"), files={"dense.safetensors": b"x"})
    client.stats()  # every shard is done with the failed save's call by now
    assert os.listdir(tmp_path) == []
