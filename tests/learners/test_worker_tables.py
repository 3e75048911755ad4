"""Sparse tables held by the workers (angel.sparse.placement=worker) on a real local Ray: the
same training as with shard actors (same seed, BSP), checkpoints in the shards' format that
load either way, and the keys it refuses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import ray

from angelconf.config import ConfigError
from angelps.checkpoint import files as checkpoint
from learners.job.learner import GraphLearner
from learners.runs.export import export_state_dict
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    tmp = short_tmp()  # Ray's socket paths must stay under 107 bytes
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, _temp_dir=tmp, namespace="angelps")
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def census(tmp_path_factory) -> str:
    dst = tmp_path_factory.mktemp("data") / "census.dummy"
    with open(ROOT / "data/census/census_148d_train.dummy") as f, open(dst, "w") as g:
        for _ in range(1200):
            g.write(f.readline())
    return str(dst)


def _learner(conf: str, tmp: Path, data: str, **sets: object) -> GraphLearner:
    keys = {
        "angel.train.data.path": data,
        "angel.log.path": str(tmp / "log"),
        "angel.save.model.path": str(tmp / "model"),
        "angel.job.name": "held",
        "ml.epoch.num": 2,
        "ml.seed": 3,
        **sets,
    }
    return GraphLearner.from_properties(ROOT / "conf" / conf, keys, quiet=True)


def _train(conf: str, tmp: Path, data: str, **sets: object) -> tuple[dict, dict]:
    """Train; (the summary with the live workers' predictions of ``data`` under ``pred``
    and their ``evaluate`` metrics under ``eval``, every table of the last checkpoint)."""
    learner = _learner(conf, tmp, data, **sets)
    try:
        result = learner.train()
        summary = {**result.summary, "pred": learner.predict(data)}
        summary["eval"] = learner.evaluate(data)
    finally:
        learner.shutdown()
    return summary, _tables(str(tmp / "model"))


def _tables(path: str) -> dict[str, tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """Every table of a checkpoint: (keys, rows, state), keys ascending over all its files."""
    manifest = checkpoint.read_manifest(path)
    out = {}
    for spec in manifest["tables"]:
        name = spec["name"]
        parts = [
            checkpoint.read_table_file(
                checkpoint.table_file(manifest["root"], name, j),
                checkpoint.file_entry(manifest, name, j),
            )
            for j in range(checkpoint.table_shards(manifest, name))
        ]
        keys = np.concatenate([p[0] for p in parts])
        order = np.argsort(keys)
        w = np.concatenate([p[1] for p in parts])[order]
        state = {k: np.concatenate([p[2][k] for p in parts])[order] for k in parts[0][2]}
        out[name] = (keys[order], w, state)
    return out


def _assert_same(a: dict, b: dict, rtol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name][0], b[name][0], err_msg=name)
        np.testing.assert_allclose(a[name][1], b[name][1], rtol=rtol, atol=1e-7, err_msg=name)
        for slot in a[name][2]:
            np.testing.assert_allclose(
                a[name][2][slot], b[name][2][slot], rtol=rtol, atol=1e-7, err_msg=f"{name}.{slot}"
            )


CASES = [
    ("fm_census.properties", "Momentum"),
    ("fm_census.properties", "Adam"),
    ("fm_census.properties", "FTRL"),
    ("deepfm_census.properties", "Momentum"),
    ("deepfm_census.properties", "Adam"),
    ("deepfm_census.properties", "FTRL"),
]
#: The default suite's cases: every optimizer and both models once (the other three, with -m
#: slow, cost 62 s on 2 cores; the optimizers' exactness on held tables is also pinned by
#: tests/learners/test_sparse_placement.py without Ray, every optimizer)
QUICK = {("fm_census.properties", "Adam"), ("fm_census.properties", "FTRL")}
QUICK.add(("deepfm_census.properties", "Momentum"))


@pytest.mark.parametrize(
    ("conf", "opt"), [c if c in QUICK else pytest.param(*c, marks=pytest.mark.slow) for c in CASES]
)
def test_one_worker_holding_the_tables_trains_as_the_shards(tmp_path, census, conf, opt):
    sets = {"ml.inputlayer.optimizer": opt, "ml.embedding.optimizer": opt}
    if opt == "FTRL":
        sets["ml.fclayer.optimizer"] = "Adam"
    ps, ps_w = _train(conf, tmp_path / "ps", census, **sets)
    held, held_w = _train(
        conf, tmp_path / "held", census, **sets, **{"angel.sparse.placement": "worker"}
    )
    _assert_same(ps_w, held_w)
    assert held["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
    assert held["valid_logloss"] == pytest.approx(ps["valid_logloss"], rel=1e-5)


@pytest.mark.parametrize(
    ("conf", "opt"),
    [
        ("fm_census.properties", "Adam"),
        pytest.param("deepfm_census.properties", "Momentum", marks=pytest.mark.slow),
    ],
)
def test_two_workers_exchanging_rows_train_as_the_shards(tmp_path, census, conf, opt):
    """Each worker owns the rows the partitioner gives it; rows and gradients cross over
    gloo all-to-alls; the owners apply one update per step on the sum (as a BSP shard)."""
    sets = {
        "ml.inputlayer.optimizer": opt,
        "ml.embedding.optimizer": opt,
        "angel.workergroup.number": 2,
        "angel.worker.cpus": 0.5,
    }
    ps, ps_w = _train(conf, tmp_path / "ps", census, **sets)
    held, held_w = _train(
        conf, tmp_path / "held", census, **sets, **{"angel.sparse.placement": "worker"}
    )
    manifest = checkpoint.read_manifest(str(tmp_path / "held" / "model"))
    assert manifest["table_shards"] == {"wide": 2, "embedding": 2, "wide_bias": 2}
    _assert_same(ps_w, held_w)
    assert held["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
    # predict and evaluate on the live workers: every read is an exchange between them
    np.testing.assert_allclose(held["pred"], ps["pred"], rtol=1e-5, atol=1e-7)
    assert held["eval"]["valid_auc"] == pytest.approx(ps["eval"]["valid_auc"], abs=1e-6)


@pytest.mark.slow
def test_four_workers_exchanging_rows_train_as_the_shards(tmp_path, census):
    """Four CPU workers (on two cores) own a quarter of every table each."""
    sets = {
        "ml.inputlayer.optimizer": "FTRL",
        "ml.embedding.optimizer": "FTRL",
        "angel.workergroup.number": 4,
        "angel.worker.cpus": 0.25,
        "angel.ps.cpus": 0.25,
    }
    ps, ps_w = _train("fm_census.properties", tmp_path / "ps", census, **sets)
    held, held_w = _train(
        "fm_census.properties",
        tmp_path / "held",
        census,
        **sets,
        **{"angel.sparse.placement": "worker"},
    )
    manifest = checkpoint.read_manifest(str(tmp_path / "held" / "model"))
    assert manifest["table_shards"] == {"wide": 4, "embedding": 4, "wide_bias": 4}
    _assert_same(ps_w, held_w)
    assert held["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
    np.testing.assert_allclose(held["pred"], ps["pred"], rtol=1e-5, atol=1e-7)


def test_checkpoints_cross_between_shards_and_workers(tmp_path, census):
    """A shard checkpoint resumes on a worker that holds the tables (and ends where an
    uninterrupted shard run ends); the worker's checkpoint predicts from shards as the
    workers did, and starts a two-worker job as it starts a two-shard-free job."""
    conf, sets = "fm_census.properties", {"ml.inputlayer.optimizer": "Momentum"}
    _, full = _train(conf, tmp_path / "full", census, **sets)
    _train(conf, tmp_path / "half", census, **sets, **{"ml.epoch.num": 1})
    shutil.copytree(tmp_path / "half" / "model", tmp_path / "resumed" / "model")
    learner = _learner(
        conf, tmp_path / "resumed", census, **sets, **{"angel.sparse.placement": "worker"}
    )
    try:
        result = learner.train(resume=True)
        assert [h["epoch"] for h in result.history] == [0, 1]
        live = learner.predict(census)
    finally:
        learner.shutdown()
    resumed = _tables(str(tmp_path / "resumed" / "model"))
    _assert_same(full, resumed)
    # angelps export reads the workers' files as the shards'
    a = export_state_dict(str(tmp_path / "full" / "model"), 1 << 30)
    b = export_state_dict(str(tmp_path / "resumed" / "model"), 1 << 30)
    for name in ("ps.wide", "ps.embedding", "ps.wide_bias"):
        np.testing.assert_allclose(b[name].numpy(), a[name].numpy(), rtol=1e-5, atol=1e-7)
    loaded = GraphLearner.load(tmp_path / "resumed" / "model")  # shards, one worker
    try:
        np.testing.assert_allclose(loaded.predict(census), live, rtol=1e-6)
    finally:
        loaded.shutdown()
    # Into another worker count: the same start as the shards'.
    two = {"angel.workergroup.number": 2, "angel.worker.cpus": 0.5, "ml.epoch.num": 1}
    start = {"angel.load.model.path": str(tmp_path / "resumed" / "model")}
    _, a = _train(conf, tmp_path / "two_ps", census, **sets, **two, **start)
    _, b = _train(
        conf,
        tmp_path / "two_held",
        census,
        **sets,
        **two,
        **start,
        **{"angel.sparse.placement": "worker"},
    )
    _assert_same(a, b)


def test_worker_placement_refuses_what_it_cannot_run(tmp_path, census):
    for key, value, shown in [
        ("angel.staleness", 2, "2"),
        ("angel.worker.cache.enable", True, "true"),
        ("angel.ps.admission.min.count", 3, "3"),
        ("angel.ps.eviction.ttl.updates", 10, "10"),
    ]:
        sets = {key: value, "angel.sparse.placement": "worker"}
        with pytest.raises(ConfigError) as e:
            _learner("fm_census.properties", tmp_path, census, **sets)
        assert str(e.value).startswith(
            f"angel.sparse.placement=worker cannot run with {key}={shown}: "
        )
        assert str(e.value).endswith(
            f"; set {key} to its default, or angel.sparse.placement=ps (or auto)"
        )
    with pytest.raises(ConfigError) as e:
        _learner(
            "fm_census.properties",
            tmp_path,
            census,
            **{"angel.worker.cache.enable": True, "angel.sparse.placement": "worker"},
        )
    assert str(e.value) == (
        "angel.sparse.placement=worker cannot run with angel.worker.cache.enable=true: a "
        "worker reads the rows it holds directly; no cache; set angel.worker.cache.enable to "
        "its default, or angel.sparse.placement=ps (or auto)"
    )
