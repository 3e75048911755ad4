"""Shards that keep rows and optimizer state as torch tensors (``angel.ps.gpus > 0`` puts them on
CUDA). The torch path is checked on the CPU here against the numpy shards; the CUDA tests skip
cleanly without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from angelps.checkpoint import files as checkpoint
from angelps.partition import Partitioner
from angelps.server.shard import ParameterShard
from angelps.storage.rows import TorchRows
from angelps.table import OptimizerSpec, TableSpec

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")

OPTS = [
    OptimizerSpec("sgd", l1=0.01, l2=0.1),
    OptimizerSpec("momentum", l2=0.01),
    OptimizerSpec("adam", l2=0.01),
    OptimizerSpec("adagrad", l1=0.001),
    OptimizerSpec("rmsprop", l1=0.001, l2=0.01),
    OptimizerSpec("ftrl", l1=0.1, l2=0.1),
]


def _tables(opt):
    return [
        TableSpec("s", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, optimizer=opt),
        TableSpec("d", rows=40, cols=2, init="uniform", init_std=0.5, optimizer=opt),
    ]


def _drive(shard, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        upd = {
            "s": (rng.integers(-50, 50, 30), rng.standard_normal((30, 4)).astype(np.float32)),
            "d": (rng.integers(0, 40, 25), rng.standard_normal((25, 2)).astype(np.float32)),
        }
        if step % 2:
            upd["d"] = (np.arange(40), rng.standard_normal((40, 2)).astype(np.float32))
        shard.push(0, step, upd, 0.05 * (step + 1))
    return shard.pull({"s": np.arange(-60, 60), "d": None})


def _compare(device, opt):
    ref = _drive(ParameterShard(0, 1, _tables(opt)))
    shard = ParameterShard(0, 1, _tables(opt), device=device)
    got = _drive(shard)
    for name in ("s", "d"):
        assert isinstance(got[name], np.ndarray)
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=2e-6)
    return shard


@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
def test_torch_rows_match_numpy_rows_on_cpu(opt):
    shard = _compare("cpu", opt)
    # Pulled rows are copies, never views of the table.
    rows = shard.pull({"d": None})["d"]
    rows[:] = 123.0
    assert not (shard.pull({"d": None})["d"] == 123.0).any()


def test_checkpoint_from_torch_shard_restores_into_numpy_shard(tmp_path):
    opt = OptimizerSpec("adam")
    src = ParameterShard(0, 1, _tables(opt), device="cpu")
    _drive(src)
    tmp = checkpoint.new_tmp_dir(str(tmp_path / "ck"))
    info = src.save(tmp)
    m = checkpoint.build_manifest(_tables(opt), 1, "hash", [info])
    checkpoint.write_manifest(tmp, m)
    checkpoint.commit_dir(tmp, str(tmp_path / "ck"))
    m = checkpoint.read_manifest(str(tmp_path / "ck"))
    with pytest.raises(checkpoint.CheckpointError, match="another model layout"):
        checkpoint.check_layout(m, _tables(opt)[1:])
    dst = ParameterShard(0, 1, _tables(opt))
    dst.load(m["root"], m)
    for name in ("s", "d"):
        a, b = src.export(name), dst.export(name)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        for k in a[2]:
            np.testing.assert_array_equal(a[2][k], b[2][k])


def _one_adam_push(device: str, shards: int) -> np.ndarray:
    """The rows of keys -20..19 after one Adam push of ones, over ``shards`` shards."""
    tables = _tables(OptimizerSpec("adam"))
    part = Partitioner(tables[0], shards, "hash")
    keys, g = np.arange(-20, 20), np.ones((40, 4), dtype=np.float32)
    sid, out = part.shard_of(keys), np.zeros((40, 4), dtype=np.float32)
    for i in range(shards):
        shard = ParameterShard(i, shards, tables, device=device if device != "numpy" else None)
        mine = sid == i
        shard.push(0, 0, {"s": (keys[mine], g[mine])}, 0.1)
        out[mine] = shard.pull({"s": keys[mine]})["s"]
    return out


def test_torch_shards_match_a_numpy_shard_after_one_adam_push():
    """The torch path computed 1 - β in float64, the numpy path in float32 (1 - 0.999 off by
    1.3e-5): rows near zero after the step differed by 4e-5 relative. Both now take 1 - β
    in float64, so two torch shards give a numpy shard's rows."""
    np.testing.assert_allclose(_one_adam_push("cpu", 2), _one_adam_push("numpy", 1), rtol=1e-6)


@pytest.mark.skipif(CUDA, reason="checks the error raised without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match=r"device 'cuda' requested \(angel.ps.gpus > 0\) but "
        r"CUDA is not available",
    ):
        ParameterShard(0, 1, _tables(OptimizerSpec("sgd")), device="cuda")


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
def test_cuda_rows_match_numpy_rows(opt):
    shard = _compare("cuda", opt)
    # Weights and optimizer slots side by side in one tensor a table (angelps/storage/rows.py).
    for t in shard.tables.values():
        assert isinstance(t.rows, TorchRows) and t.rows.t.is_cuda


@needs_cuda
@pytest.mark.gpu
def test_gpu_shards_on_ray():
    import shutil

    import ray

    from angelps.client.ps_client import PSClient
    from angelps.options import PSOptions
    from tests.short_tmp import short_tmp

    ray.init(
        num_cpus=2,
        num_gpus=1,
        include_dashboard=False,
        namespace="angelps",
        _temp_dir=(tmp := short_tmp()),  # a deep tmp_path gives Unix sockets > 107 bytes
        log_to_driver=False,
    )
    try:
        tables = _tables(OptimizerSpec("adam"))
        c = PSClient.launch(
            tables,
            PSOptions.from_config(
                {"angel.job.name": "gpu", "angel.ps.number": 2, "angel.ps.gpus": 0.25}
            ),
        )
        try:
            ref = ParameterShard(0, 1, tables)
            keys = np.arange(-20, 20)
            g = np.ones((40, 4), dtype=np.float32)
            c.push("s", keys, g, 0.1)
            ref.push(0, 0, {"s": (keys, g)}, 0.1)
            np.testing.assert_allclose(c.pull("s", keys), ref.pull({"s": keys})["s"], rtol=1e-5)
        finally:
            c.shutdown()
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
