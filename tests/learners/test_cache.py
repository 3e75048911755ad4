"""The worker cache (learners/worker/cache.py) and the prefetch depth: rules in one process, then BSP
bit-identical with and without the cache on a real local Ray."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from angelconf.config import ConfigError, load_config
from angelps.rates import StepRates
from learners.keys import all_keys
from learners.worker.cache import RowCache
from learners.worker.feed import FeedOptions
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def _cache(staleness: int, workers: int = 1, capacity: int = 100, admit: int = 1) -> RowCache:
    return RowCache({"w": 1, "v": 2}, 50, capacity, False, admit, staleness, workers, CPU)


def _rows(keys: np.ndarray, base: float) -> dict[str, np.ndarray]:
    k = keys.astype(np.float32)
    return {"w": (k + base)[:, None], "v": np.stack([k + base, -k - base], axis=1)}


def _read(cache: RowCache, keys: np.ndarray, clock: int, shard: dict, use: int | None = None):
    """One read through the cache against a 'shard' (key -> value): what it pulled, and rows."""
    sp = cache.split(keys, clock, use)
    pulled_keys = keys[~sp.hit]
    pulled = {t: shard[t][pulled_keys] for t in ("w", "v")}
    return pulled_keys, cache.fill(sp, pulled)


def _shard(base: float) -> dict[str, np.ndarray]:
    return _rows(np.arange(50), base)


def test_bsp_one_worker_serves_rows_it_has_not_pushed_since():
    c = _cache(0)
    keys = np.array([1, 2, 3])
    pulled, rows = _read(c, keys, 0, _shard(0.0))
    np.testing.assert_array_equal(pulled, keys)  # nothing cached yet
    c.note_push({"w": (np.array([2]), np.ones((1, 1), np.float32))}, 0.1, 0)
    # clock 1: row 2 was pushed (its cached copy is stale), 1 and 3 were not (current)
    pulled, rows = _read(c, keys, 1, _shard(0.0))
    np.testing.assert_array_equal(pulled, [2])
    np.testing.assert_array_equal(rows["w"].numpy()[:, 0], [1.0, 2.0, 3.0])
    assert (c.stats.lookups, c.stats.hits) == (6, 2)
    # no local update under BSP: the cached row 2 now is the pulled value
    np.testing.assert_array_equal(c.rows["w"][c.slot_of[2] - 1].numpy(), [2.0])


def test_bsp_several_workers_serve_only_rows_of_this_clock():
    c = _cache(0, workers=2)
    keys = np.array([4, 5])
    _read(c, keys, 3, _shard(0.0))
    pulled, _ = _read(c, keys, 3, _shard(0.0))  # same clock (a validation pass): served
    assert pulled.size == 0
    pulled, _ = _read(c, keys, 4, _shard(1.0))  # the clock moved: others may have pushed
    np.testing.assert_array_equal(pulled, keys)


@pytest.mark.parametrize("s", [1, 2, 3])
def test_ssp_never_serves_a_row_more_than_s_clocks_old(s):
    """A row is pulled at clock 0 and then read at every clock: it is served while its copy is
    at most s clocks old, refetched after, and never older than s at use."""
    c = _cache(s)
    key = np.array([7])
    fetched_at = []
    for clock in range(12):
        pulled, _ = _read(c, key, clock, _shard(float(clock)))
        if pulled.size:
            fetched_at.append(clock)
        assert clock - c.fetched[c.slot_of[7] - 1] <= s
    assert fetched_at == list(range(0, 12, s + 1))
    # a prefetch used later counts from its use clock
    pulled, _ = _read(c, key, 11, _shard(0.0), use=11 + s + 1)
    assert pulled.size == 1


def test_ssp_applies_own_updates_locally():
    c = _cache(2)
    keys = np.array([1, 2])
    _read(c, keys, 0, _shard(0.0))
    c.note_push({"v": (np.array([2]), np.array([[1.0, -2.0]], np.float32))}, 0.5, 0)
    pulled, rows = _read(c, keys, 1, _shard(9.0))
    assert pulled.size == 0
    np.testing.assert_allclose(rows["v"].numpy(), [[1.0, -1.0], [1.5, -1.0]])
    # a table on a schedule of its own steps with its own rate (StepRates), the rest with lr
    c.note_push(
        {
            "v": (np.array([1]), np.array([[1.0, 1.0]], np.float32)),
            "w": (np.array([1]), np.array([[1.0]], np.float32)),
        },
        StepRates(0.5, None, {"v": (0.25, None)}),
        1,
    )
    _, rows = _read(c, keys, 2, _shard(9.0))
    np.testing.assert_allclose(rows["v"].numpy()[0], [0.75, -1.25])
    np.testing.assert_allclose(rows["w"].numpy()[0], [0.5])


@pytest.mark.parametrize("name", ["momentum", "adam", "adagrad", "rmsprop"])
def test_ssp_local_updates_use_the_tables_optimizer(name):
    # The cached copy follows the shards' own optimizer code (angelps.optim.apply), with the
    # optimizer state the cache keeps for its rows, not a plain SGD step of the gradient.
    from angelps.optim import apply, slot_widths
    from angelps.table import OptimizerSpec

    spec = OptimizerSpec(name)
    c = RowCache({"w": 1, "v": 2}, 50, 100, False, 1, 2, 1, CPU, {"v": spec})
    keys = np.array([1, 2])
    _read(c, keys, 0, _shard(0.0))
    w = np.array([[2.0, -2.0]], np.float32)  # row 2 as pulled
    state = {k: np.zeros((1, n), np.float32) for k, n in slot_widths(spec, 2).items()}
    for clock, (g, lr) in enumerate([([1.0, -2.0], 0.5), ([0.25, 3.0], 0.1)]):
        grad = np.array([g], np.float32)
        c.note_push({"v": (np.array([2]), grad)}, lr, clock)
        apply(spec, w, state, grad, lr)
    pulled, rows = _read(c, keys, 2, _shard(9.0))
    assert pulled.size == 0
    np.testing.assert_allclose(rows["v"].numpy()[1], w[0], rtol=1e-6)
    assert not np.allclose(w[0], [2.0 - 0.5 - 0.025, -2.0 + 1.0 - 0.3])  # not SGD's result


def test_admission_by_frequency_and_capacity():
    c = _cache(2, capacity=3, admit=2)
    _read(c, np.array([1, 2, 3, 4]), 0, _shard(0.0))
    assert c.size == 0  # seen once
    _read(c, np.array([1, 2, 3, 4]), 1, _shard(0.0))
    assert c.size == 3 and c.slot_of[4] == 0  # seen twice, room for three
    st = c.take_stats()
    assert (st.lookups, st.hits) == (8, 0) and c.stats.lookups == 0


def _feed(**sets) -> FeedOptions:
    return FeedOptions.from_config(load_config(None, sets, all_keys()))


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        ({"angel.worker.cache.capacity": "0"}, r"capacity=0 is not valid.*> 0"),
        ({"angel.worker.cache.capacity": "-5"}, r"capacity=-5 is not valid"),
        ({"angel.worker.cache.capacity": "lots"}, r"capacity=lots is not valid: expected a row"),
        ({"angel.worker.cache.capacity": "99999999999"}, r"capacity=99999999999 is absurd"),
        ({"angel.worker.cache.capacity": "100000GB"}, r"larger than this machine's memory"),
        ({"angel.worker.prefetch.depth": 2}, r"prefetch.depth=2 needs bounded staleness"),
        (
            {"angel.worker.prefetch.depth": 3, "angel.staleness": 2},
            r"prefetch.depth=3 is above angel.staleness=2.*valid: 1 .. 2",
        ),
    ],
)
def test_bad_feed_options_name_the_key(sets, match):
    with pytest.raises(ConfigError, match=match):
        _feed(**sets)


def test_capacity_in_bytes_and_rows():
    assert _feed(**{"angel.worker.cache.capacity": "64MB"}).capacity == 64 * 10**6
    f = _feed(**{"angel.worker.cache.capacity": "1000", "angel.staleness": 2})
    assert (f.capacity, f.capacity_bytes, f.prefetch_depth) == (1000, False, 1)
    c = RowCache({"w": 1, "v": 7}, 10**6, 6000, True, 1, 0, 1, CPU)
    assert c.capacity == 6000 // (4 * 8 + 28)
    with pytest.raises(ConfigError, match="holds no row of 60 bytes"):
        RowCache({"w": 1, "v": 7}, 10, 30, True, 1, 0, 1, CPU)


# --- on a real local Ray ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    import ray

    tmp = short_tmp()  # Ray's socket paths must stay under 107 bytes
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, _temp_dir=tmp, namespace="angelps")
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _train(tmp_path: Path, name: str, **sets) -> tuple[dict, list[dict]]:
    from learners.job.learner import GraphLearner

    src = ROOT / "data/census/census_148d_train.dummy"
    data = tmp_path / "c.dummy"
    if not data.exists():
        data.write_text("".join(src.read_text().splitlines(keepends=True)[:3000]))
    base = {
        "angel.train.data.path": str(data),
        "ml.data.type": "dummy",
        "ml.model.class.name": "FactorizationMachines",
        "ml.fm.rank": 4,
        "ml.feature.index.range": 148,
        "ml.fm.field.num": 13,
        "ml.minibatch.size": 256,
        "ml.epoch.num": 2,
        "ml.learn.rate": 0.1,
        "ml.data.validate.ratio": 0.2,
        "angel.log.path": str(tmp_path / name),
        "angel.log.every.steps": 3,
        "angel.job.name": f"cache-{name}",
        **sets,
    }
    learner = GraphLearner(load_config(None, base, all_keys()))
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    lines = [
        json.loads(x)
        for x in (Path(result.summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    return result.summary, [x for x in lines if x["kind"] == "step"]


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_bsp_with_the_cache_is_bit_identical(tmp_path, local_ray, workers):
    on = {"angel.worker.cache.enable": True, "angel.worker.cache.admit.frequency": 1}
    w = {"angel.workergroup.number": workers}
    off_sum, off_steps = _train(tmp_path, f"off{workers}", **w)
    on_sum, on_steps = _train(tmp_path, f"on{workers}", **w, **on)
    for k in ("valid_auc", "valid_logloss", "train_loss"):
        assert on_sum[k] == off_sum[k], k
    assert [s["loss"] for s in on_steps] == [s["loss"] for s in off_steps]
    assert all("cache_hit_rate" in s for s in on_steps)
    assert not any("cache_hit_rate" in s for s in off_steps)
    assert all(s["bytes_per_step"] > 0 for s in on_steps + off_steps)


@pytest.mark.slow
def test_ssp_with_prefetch_and_cache_learns_like_bsp(tmp_path, local_ray):
    """Staleness 2, two batches in flight, the cache on: it serves rows (hit rate > 0), moves
    fewer bytes per step, and reaches BSP's validation AUC closely on the same epochs."""
    bsp, bsp_steps = _train(tmp_path, "bsp")
    ssp, ssp_steps = _train(
        tmp_path,
        "ssp",
        **{
            "angel.staleness": 2,
            "angel.worker.prefetch.depth": 2,
            "angel.worker.cache.enable": True,
        },
    )
    assert abs(ssp["valid_auc"] - bsp["valid_auc"]) < 0.01
    rates = [s["cache_hit_rate"] for s in ssp_steps]
    # (None: a chunk that looked nothing up, the last one of the job)
    assert sum(r for r in rates if r is not None) / len(rates) > 0.3
    late = slice(len(bsp_steps) // 2, None)
    assert sum(s["bytes_per_step"] for s in ssp_steps[late]) < 0.85 * sum(
        s["bytes_per_step"] for s in bsp_steps[late]
    )
