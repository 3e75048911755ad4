"""angel.sparse.placement: which tables the workers hold, why (the start screen's words), and
a worker's share of a table (learners/job/sparse_placement.py, learners/worker/held_tables.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from angelconf.config import load_config
from angelps import OptimizerSpec, TableSpec
from angelps.optim import apply
from angelps.partition import Partitioner
from angelps.table import init_rows
from learners.job.loop_options import TrainPlan
from learners.job.sparse_placement import held_bytes, place_tables
from learners.keys import all_keys
from learners.worker.held_table import HeldTable

ADAM = OptimizerSpec(name="adam")
TABLES = [
    TableSpec("wide", 1000, 1, sparse=True, optimizer=ADAM),
    TableSpec("wide_bias", 1, 1, optimizer=ADAM),
    TableSpec("embedding", 1000, 8, sparse=True, optimizer=ADAM),
]


def _plan(**sets: object) -> TrainPlan:
    return TrainPlan.from_config(load_config(None, sets, all_keys()))


def test_ps_keeps_every_table_on_the_shards() -> None:
    placed = place_tables(_plan(), TABLES)
    assert [t.name for t in placed.ps] == ["wide", "wide_bias", "embedding"] and not placed.held
    assert placed.where()["wide"] == "on the shards: angel.sparse.placement=ps"


def test_worker_holds_the_sparse_tables_and_the_models_dense_ones() -> None:
    """The bias goes with the sparse tables (a step then calls no shard); dense layers placed
    on the shards keep the model's dense tables there."""
    placed = place_tables(_plan(**{"angel.sparse.placement": "worker"}), TABLES)
    assert [t.name for t in placed.held] == ["wide", "embedding", "wide_bias"]
    assert placed.ps == []
    assert placed.where()["wide_bias"] == (
        "on the workers: angel.sparse.placement=worker (a dense table, with the sparse ones)"
    )
    on_ps = {"angel.sparse.placement": "worker", "angel.dense.placement": "ps"}
    placed = place_tables(_plan(**on_ps), TABLES)
    assert [t.name for t in placed.held] == ["wide", "embedding"]
    assert [t.name for t in placed.ps] == ["wide_bias"]
    assert placed.where()["wide_bias"] == "on the shards: dense tables stay on the shards"


def test_auto_holds_tables_that_fit_the_budget_under_bsp() -> None:
    # Adam: weights + m + v + t: (1 + 1 + 1 + 1) + (8 + 8 + 8 + 1) columns of float32
    assert held_bytes(TABLES[0], 1) == 1000 * 4 * 4
    assert held_bytes(TABLES[2], 2) == 500 * 25 * 4
    need = (1000 * 4 + 1000 * 25) * 4
    fits = place_tables(_plan(**{"angel.sparse.placement": "auto"}), TABLES)
    assert [t.name for t in fits.held] == ["wide", "embedding", "wide_bias"]
    assert fits.where()["embedding"] == (
        f"on the workers: auto: BSP, {need / 2**20:.1f} MiB a worker within "
        "angel.sparse.worker.memory.mb=2048"
    )
    small = _plan(**{"angel.sparse.placement": "auto", "angel.sparse.worker.memory.mb": 0.01})
    over = place_tables(small, TABLES)
    assert not over.held
    assert over.where()["wide"] == (
        f"on the shards: auto: {need / 2**20:.1f} MiB a worker is above "
        "angel.sparse.worker.memory.mb=0.01"
    )
    ssp = place_tables(_plan(**{"angel.sparse.placement": "auto", "angel.staleness": 2}), TABLES)
    assert not ssp.held
    assert ssp.where()["wide"].startswith("on the shards: auto: angel.staleness=2: ")


def test_a_worker_owns_the_rows_of_its_shard_and_updates_them_as_a_shard() -> None:
    spec = TABLES[2]
    part = Partitioner(spec, 3, "hash")
    owned = [HeldTable(spec, part, i, torch.device("cpu")) for i in range(3)]
    keys = np.concatenate([t.keys for t in owned])
    assert sorted(keys.tolist()) == list(range(1000))  # every row has exactly one owner
    t = owned[1]
    assert (part.shard_of(t.keys) == 1).all()
    ids = torch.from_numpy(t.keys[[0, 5, 9]])
    np.testing.assert_array_equal(t.gather(ids).numpy(), init_rows(spec, ids.numpy()))
    g = torch.full((3, 8), 0.5)
    t.update(ids, g, 0.1)
    w = init_rows(spec, ids.numpy())
    state = {
        "m": np.zeros((3, 8), np.float32),
        "v": np.zeros((3, 8), np.float32),
        "t": np.zeros((3, 1), np.float32),
    }
    apply(spec.optimizer, w, state, g.numpy(), 0.1)  # a shard's (numpy) update
    np.testing.assert_allclose(t.gather(ids).numpy(), w, rtol=1e-6)
    keys_saved, rows, saved = next(t.export_chunks())  # only the rows read or written
    np.testing.assert_array_equal(keys_saved, ids.numpy())
    np.testing.assert_allclose(rows, w, rtol=1e-6)
    np.testing.assert_allclose(saved["m"], state["m"], rtol=1e-6)


def test_a_table_without_a_row_range_cannot_be_held() -> None:
    spec = TableSpec("open", -1, 4, sparse=True)
    with pytest.raises(ValueError, match="table 'open' has no row range"):
        HeldTable(spec, Partitioner(spec, 1, "hash"), 0, torch.device("cpu"))


CUDA = torch.cuda.is_available()
OPTS = [
    OptimizerSpec("sgd", l1=0.01, l2=0.1),
    OptimizerSpec("momentum", l2=0.01),
    OptimizerSpec("adam", l2=0.01),
    OptimizerSpec("adagrad", l1=0.001),
    OptimizerSpec("rmsprop", l1=0.001, l2=0.01),
    OptimizerSpec("ftrl", l1=0.1, l2=0.1),
]


def _held_steps(opt: OptimizerSpec, device: str, steps: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` updates of a held table (two micro-batches each, merged) and the same pushes
    into a numpy shard: (held rows, shard rows) of every key touched."""
    from angelps.server.shard import ParameterShard
    from learners.worker.held_tables import HeldTables

    spec = TableSpec("e", 500, 4, sparse=True, init="normal", init_std=0.1, optimizer=opt)
    held = HeldTables([spec], 0, 1, "hash", torch.device(device))
    shard = ParameterShard(0, 1, [spec])
    rng = np.random.default_rng(1)
    for step in range(steps):
        pushed = []
        for _ in range(2):
            ids = np.unique(rng.integers(0, 500, 60))
            held.rows({"e": ids})
            g = rng.standard_normal((len(ids), 4)).astype(np.float32)
            held.add_grad("e", ids, torch.from_numpy(g).to(device))
            pushed.append((ids, g * 0.5))
        lr = 0.05 * (step + 1)
        held.apply(0.5, lr)
        keys = np.concatenate([p[0] for p in pushed])
        shard.push(0, step, {"e": (keys, np.concatenate([p[1] for p in pushed]))}, lr)
    keys = np.arange(500)
    got = held.rows({"e": keys})["e"].cpu().numpy()
    return got, shard.pull({"e": keys})["e"]


@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
def test_held_tables_update_as_a_numpy_shard(opt: OptimizerSpec) -> None:
    got, want = _held_steps(opt, "cpu")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.gpu
@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
def test_held_tables_on_a_gpu_update_as_on_the_cpu(opt: OptimizerSpec) -> None:
    on_gpu, _ = _held_steps(opt, "cuda")
    on_cpu, _ = _held_steps(opt, "cpu")
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-5, atol=1e-7)


def _worker_steps(
    opt: str, device: str, held: bool, tmp_path, ps_cls, clip: float = 0.0
) -> dict[str, np.ndarray]:
    """4 DeepFM updates of one worker (no Ray): the sparse tables' rows after them, held by
    the worker or in an in-process PS."""
    from decay.angel import StandardDecay
    from tests.learners.test_worker import DEEPFM, ROOT, _head, _worker

    path = _head(ROOT / "data/census/census_148d_train.dummy", tmp_path / "c.dummy", 256)
    sets = {**DEEPFM, "ml.inputlayer.optimizer": opt, "ml.embedding.optimizer": opt}
    w, ps = _worker(path, sets, {"device": device, "clip": clip}, ps_cls, fields=13)
    sparse = [s for s in ps.specs.values() if s.sparse]
    if held:
        w.hold_tables(sparse, "hash")
    w.begin_epoch(0, StandardDecay(0.1))
    w.run_steps(4, None)
    if not held:
        return {s.name: ps.w[s.name] for s in sparse}
    keys = np.arange(148)
    return {k: v.cpu().numpy() for k, v in w.held.rows({s.name: keys for s in sparse}).items()}


@pytest.mark.parametrize(
    ("opt", "clip"), [("Momentum", 0.0), ("Adam", 0.0), ("FTRL", 0.0), ("Momentum", 0.05)]
)
def test_a_worker_holding_its_tables_steps_as_with_a_ps(
    opt, clip, tmp_path, local_ps_class
) -> None:
    """(clip: the held tables' gradients count in the global norm as pushed ones do)"""
    want = _worker_steps(opt, "cpu", False, tmp_path, local_ps_class, clip)
    got = _worker_steps(opt, "cpu", True, tmp_path, local_ps_class, clip)
    for name, rows in want.items():
        np.testing.assert_allclose(got[name], rows, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.gpu
@pytest.mark.parametrize("opt", ["SGD", "Momentum", "Adam", "AdaGrad", "RMSProp", "FTRL"])
def test_a_cuda_worker_holding_its_tables_steps_as_the_cpu(opt, tmp_path, local_ps_class) -> None:
    want = _worker_steps(opt, "cpu", True, tmp_path, local_ps_class)
    got = _worker_steps(opt, "cuda", True, tmp_path, local_ps_class)
    for name, rows in want.items():
        np.testing.assert_allclose(got[name], rows, rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_start_screen_says_where_each_table_lives_and_why() -> None:
    from angelps import PSOptions
    from learners.job.job_size import JobSize
    from learners.runs.run_log import banner

    sets = {"angel.sparse.placement": "auto", "angel.train.data.path": "train.libsvm"}
    conf = load_config(None, sets, all_keys())
    plan = TrainPlan.from_config(conf)
    placed = place_tables(plan, TABLES)
    size = JobSize(num_features=1000, num_fields=None, batch_size=128, updates_per_epoch=5)
    text = banner(
        conf, plan, PSOptions.from_config(conf), size, TABLES, "FM", 0, None, placed.where()
    )
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.strip().startswith("embedding "))
    assert lines[i + 1].strip() == (
        "on the workers: auto: BSP, 0.1 MiB a worker within angel.sparse.worker.memory.mb=2048"
    )
    j = next(n for n, line in enumerate(lines) if line.strip().startswith("wide_bias "))
    assert lines[j + 1].strip() == "on the workers: auto: a dense table, with the sparse ones"
