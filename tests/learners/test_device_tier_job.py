"""A device tier on a real local Ray (angel.sparse.placement=worker with a capacity below the
tables): the job trains, saves, resumes, predicts and evaluates exactly as with every row on
the shards (same seed, BSP), and its step records and progress say the tier's hit rate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from angelps.checkpoint import files as checkpoint
from tests.learners.test_worker_tables import CASES, _assert_same, _learner, _tables, _train

# a batch of 64 census rows reads at most 90 of the 148 ids: 100 rows a table keep the tier
# full and evicting
TIER = {"angel.sparse.placement": "worker", "angel.worker.table.capacity": "100"}
SMALL = {
    "ml.minibatch.size": 64,
    "ml.inputlayer.optimizer": "Adam",
    "ml.embedding.optimizer": "Adam",
}

# (the CUDA cases ask their worker for a GPU: the cluster has one where the machine does)
pytestmark = pytest.mark.usefixtures("ray_local_gpu")


@pytest.fixture(scope="module")
def census(tmp_path_factory) -> str:
    from tests.learners.test_worker_tables import ROOT

    dst = tmp_path_factory.mktemp("data") / "census.dummy"
    with open(ROOT / "data/census/census_148d_train.dummy") as f, open(dst, "w") as g:
        for _ in range(1200):
            g.write(f.readline())
    return str(dst)


def _steps(log: Path) -> list[dict]:
    (metrics,) = log.glob("*/metrics.jsonl")
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "step"]


@pytest.mark.parametrize(
    "conf",
    ["fm_census.properties", pytest.param("deepfm_census.properties", marks=pytest.mark.slow)],
)
def test_a_device_tier_trains_as_the_shards(tmp_path, census, conf):
    sets = {**SMALL, "angel.log.every.steps": 5}
    ps, ps_w = _train(conf, tmp_path / "ps", census, **sets)
    tier, tier_w = _train(conf, tmp_path / "tier", census, **sets, **TIER)
    _assert_same(ps_w, tier_w)  # (the shards wrote the tiers' tables: flushed first)
    manifest = checkpoint.read_manifest(str(tmp_path / "tier" / "model"))
    # the worker holds the bias whole (its own file), the shards the tiers' tables
    assert manifest["table_shards"] == {"wide_bias": 1}
    assert tier["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
    np.testing.assert_allclose(tier["pred"], ps["pred"], rtol=1e-5, atol=1e-7)
    assert tier["eval"]["valid_auc"] == pytest.approx(ps["eval"]["valid_auc"], abs=1e-6)
    steps = _steps(tmp_path / "tier" / "log")
    assert steps and all(0.0 < r["tier_hit_rate"] < 1.0 for r in steps)
    assert all(r["tier_misses_per_step"] > 0 for r in steps)
    assert any(r["tier_writebacks_per_step"] > 0 for r in steps)
    # the reads waited for the shards' rows (at least their answers' hand-over), within a step
    assert all(0.0 < r["tier_wait_s"] < r["elapsed_s"] for r in steps)
    # of it, the part spent on the shards' answers themselves (the rest: the update thread)
    assert all(0.0 < r["tier_wait_shards_s"] <= r["tier_wait_s"] for r in steps)
    assert all(r["tier_ahead_wait_s"] >= 0.0 for r in steps)
    assert all(r["tier_wait_update_s"] >= 0.0 for r in steps)
    # the tier's traffic with the shards is the step's (ids 8 B, a row 4 B a column at least)
    assert all(r["bytes_per_step"] >= 12 * r["tier_misses_per_step"] for r in steps)
    assert "tier_hit_rate" not in _steps(tmp_path / "ps" / "log")[0]


def test_a_device_tier_resumes_exactly(tmp_path, census):
    conf = "fm_census.properties"
    _, full = _train(conf, tmp_path / "full", census, **SMALL, **TIER)
    _train(conf, tmp_path / "half", census, **SMALL, **TIER, **{"ml.epoch.num": 1})
    shutil.copytree(tmp_path / "half" / "model", tmp_path / "resumed" / "model")
    learner = _learner(conf, tmp_path / "resumed", census, **SMALL, **TIER)
    try:
        result = learner.train(resume=True)
        assert [h["epoch"] for h in result.history] == [0, 1]
    finally:
        learner.shutdown()
    _assert_same(full, _tables(str(tmp_path / "resumed" / "model")))


def test_two_workers_with_device_tiers_train_as_the_shards(tmp_path, census):
    """Each worker's tier holds part of its own share; the owners fetch their misses while
    serving the exchange, and the two train as the shards do."""
    two = {**SMALL, "angel.workergroup.number": 2, "angel.worker.cpus": 0.5}
    tier = {**TIER, "angel.worker.table.capacity": "70"}  # of about 74 rows a worker's share
    ps, ps_w = _train("fm_census.properties", tmp_path / "ps", census, **two)
    got, got_w = _train("fm_census.properties", tmp_path / "tier", census, **two, **tier)
    _assert_same(ps_w, got_w)
    assert got["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
    np.testing.assert_allclose(got["pred"], ps["pred"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("conf", "opt"),
    # (FM with Adam in the default suite, the rest with -m slow: 36 s more on 2 cores; every
    # optimizer's exactness under a tier is pinned without Ray in test_device_tier.py)
    [
        c if c == ("fm_census.properties", "Adam") else pytest.param(*c, marks=pytest.mark.slow)
        for c in CASES
    ],
)
def test_every_optimizer_with_a_tier_below_the_table_trains_as_the_shards(
    tmp_path, census, conf, opt
):
    """The exactness cases of the tables held whole (tests/learners/test_worker_tables.py),
    with a budget of 100 of the 148 rows a table."""
    sets = {"ml.inputlayer.optimizer": opt, "ml.embedding.optimizer": opt, "ml.minibatch.size": 64}
    if opt == "FTRL":
        sets["ml.fclayer.optimizer"] = "Adam"
    ps, ps_w = _train(conf, tmp_path / "ps", census, **sets)
    tier, tier_w = _train(conf, tmp_path / "tier", census, **sets, **TIER)
    _assert_same(ps_w, tier_w)
    assert tier["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
    assert tier["valid_logloss"] == pytest.approx(ps["valid_logloss"], rel=1e-5)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
            ],
        ),
    ],
)
def test_a_tier_fed_ids_deduplicated_on_the_device_trains_as_the_shards(tmp_path, census, device):
    """angel.worker.dedup=device (a CUDA worker's default): the batch's unique ids come down
    once for the tier's host index, its gradients keep them there; on CUDA the update thread
    also evicts and places the misses. The same run as every row on the shards."""
    sets = {**SMALL, "angel.worker.device": device}
    ps, ps_w = _train("fm_census.properties", tmp_path / "ps", census, **SMALL)
    tier, tier_w = _train(
        "fm_census.properties",
        tmp_path / "tier",
        census,
        **sets,
        **TIER,
        **{"angel.worker.dedup": "device"},
    )
    _assert_same(ps_w, tier_w)
    assert tier["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
    np.testing.assert_allclose(tier["pred"], ps["pred"], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "batch", "capacity"), [(2, 64, 70), (4, 16, 30)])
def test_several_workers_with_tiers_train_deepfm_as_the_shards(
    tmp_path, census, workers, batch, capacity
):
    """A share of 74 (37) ids a worker, tiers of 70 (30) rows: every owner evicts (each room
    keeping its rows of the read after the next last: learners/worker/tier_routes.py)."""
    sets = {
        **SMALL,
        "ml.minibatch.size": batch,
        "angel.workergroup.number": workers,
        "angel.worker.cpus": 1 / workers,
        "angel.ps.cpus": 0.25,
    }
    tier = {**TIER, "angel.worker.table.capacity": str(capacity)}
    ps, ps_w = _train("deepfm_census.properties", tmp_path / "ps", census, **sets)
    got, got_w = _train("deepfm_census.properties", tmp_path / "tier", census, **sets, **tier)
    _assert_same(ps_w, got_w)
    assert got["valid_auc"] == pytest.approx(ps["valid_auc"], abs=1e-6)
