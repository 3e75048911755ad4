"""The worker's training step, in one process over an in-process PS (no Ray).

Accumulation equivalence (seed 002), skipped updates, clipping, frozen layers, checkpoints of
the worker-side state.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from angelconf.config import load_config
from angelps import OptimizerSpec
from decay.angel import StandardDecay
from learners.data import DataOptions
from learners.job.job_size import JobSize
from learners.job.loop_options import TrainPlan
from learners.keys import all_keys
from learners.models.config import ModelConfig
from learners.models.table_decl import table_specs
from learners.worker.train_worker import TrainWorker

ROOT = Path(__file__).resolve().parents[2]


def _head(src: Path, dst: Path, n: int) -> str:
    with open(src) as f, open(dst, "w") as g:
        for _ in range(n):
            g.write(f.readline())
    return str(dst)


@pytest.fixture(scope="module")
def census_256(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("census")
    return _head(ROOT / "data/census/census_148d_train.dummy", d / "c.dummy", 256)


def _worker(path: str, sets: dict, setup: dict, ps_cls, fields=None) -> tuple[TrainWorker, object]:
    """A worker over ``path`` with batch 64, seed 3, no shuffling and per-batch decay, unless
    ``setup`` says otherwise (batch_size, num_features: the job's size; the rest: the plan)."""
    conf = load_config(
        None,
        {"angel.train.data.path": path, "ml.data.validate.ratio": 0.0, **sets},
        all_keys(),
    )
    setup = dict(setup)
    size = JobSize(
        num_features=setup.pop("num_features", 148),
        num_fields=fields,
        batch_size=setup.pop("batch_size", 64),
        updates_per_epoch=1,
    )
    shuffle = setup.pop("shuffle", False)
    plan = replace(
        TrainPlan.from_config(conf),
        **{"seed": 3, "decay_on_batch": True, "frozen": (), "torch_threads": 1, **setup},
    )
    data = replace(DataOptions.from_config(conf), use_shuffle=shuffle)
    w = TrainWorker(plan, data, 0, 1)
    model = ModelConfig.from_config(conf, size.num_features, size.num_fields)
    decls = w.build(model, size, OptimizerSpec.from_conf(conf, "ml.fclayer.optimizer"))
    ps = ps_cls(table_specs(conf, decls))
    w.set_ps(ps)
    return w, ps


DEEPFM = {
    "ml.data.type": "dummy",
    "ml.model.class.name": "DeepFM",
    "ml.fm.rank": 4,
    "ml.model.hidden.layers": "8",
    "ml.inputlayer.optimizer": "Adam",
    "ml.embedding.optimizer": "Adam",
    "ml.fclayer.optimizer": "Adam",
}


def test_accumulation_equals_the_larger_batch(census_256, local_ps_class):
    """k micro-batches of b = one batch of k·b: same step sizes, same weights (float tolerance)."""
    big, ps_big = _worker(census_256, DEEPFM, {"batch_size": 64}, local_ps_class, 13)
    acc, ps_acc = _worker(census_256, DEEPFM, {"batch_size": 16, "accum": 4}, local_ps_class, 13)
    s_big, s_acc = StandardDecay(0.05, alpha=0.5), StandardDecay(0.05, alpha=0.5)
    big.begin_epoch(0, s_big)
    acc.begin_epoch(0, s_acc)
    out_big = big.run_steps(4, None)
    out_acc = acc.run_steps(4, None)
    # The schedule advanced once per update, never per micro-batch.
    assert s_big.count == s_acc.count == 4
    assert out_big.updates == out_acc.updates == 4
    assert [p["lr"] for p in ps_big.pushes] == [p["lr"] for p in ps_acc.pushes]
    assert [p["lr"] for p in ps_acc.pushes] == pytest.approx(
        [0.05 / np.sqrt(1 + 0.5 * k) for k in (1, 2, 3, 4)]
    )
    for name in ps_big.w:
        np.testing.assert_allclose(ps_acc.w[name], ps_big.w[name], rtol=1e-4, atol=1e-6)
    for p, q in zip(big.model.parameters(), acc.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert out_big.samples == out_acc.samples == 256
    # The weights did move.
    assert np.abs(ps_big.w["embedding"]).sum() > 0
    assert not np.allclose(ps_big.w["wide"], 0)


class _PoisonOnce:
    """A LocalPS whose second pull returns a NaN row: that update must be skipped."""

    def __init__(self, base):
        self.base = base
        self.pulls = 0

    def __call__(self, specs):
        ps = self.base(specs)
        orig = ps.pull_many

        def pull_many(req):
            self.pulls += 1
            out = orig(req)
            if self.pulls == 2:
                out["weight"][0, 0] = np.nan
            return out

        ps.pull_many = pull_many
        return ps


def test_skipped_update_does_not_advance_the_schedule(tmp_path, local_ps_class):
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 128)
    poison = _PoisonOnce(local_ps_class)
    w, ps = _worker(
        path, {"ml.inputlayer.optimizer": "SGD"}, {"batch_size": 32, "num_features": 123}, poison
    )
    sched = StandardDecay(1.0, alpha=1.0)
    w.begin_epoch(0, sched)
    out = w.run_steps(4, None)
    assert out.skipped == 1 and out.updates == 3
    assert sched.count == 3
    assert len(ps.pushes) == 3
    assert ps.clocks == 1  # the skipped step still ended at the PS (BSP peers do not wait)
    # The three applied updates used lr_at(0), lr_at(1), lr_at(2): nothing was consumed by the skip.
    assert [p["lr"] for p in ps.pushes] == pytest.approx(
        [1 / np.sqrt(2), 1 / np.sqrt(3), 1 / np.sqrt(4)]
    )
    assert np.isfinite(ps.w["weight"]).all()


def test_clipping_bounds_the_pushed_gradient(tmp_path, local_ps_class):
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 64)
    w, ps = _worker(
        path,
        {"ml.inputlayer.optimizer": "SGD"},
        {"batch_size": 64, "num_features": 123, "clip": 0.01},
        local_ps_class,
    )
    w.begin_epoch(0, StandardDecay(0.1, alpha=0.0))
    w.run_steps(1, None)
    g = ps.pushes[0]["grads"]
    norm = np.sqrt(sum(float(np.square(v).sum()) for _, v in g.values()))
    assert norm == pytest.approx(0.01, rel=1e-3)


def test_frozen_layers_are_untouched(census_256, local_ps_class):
    sets = {**DEEPFM, "ml.freeze.layers": "embedding,mlp"}
    w, ps = _worker(census_256, sets, {"frozen": ("embedding", "mlp")}, local_ps_class, 13)
    emb0 = ps.w["embedding"].copy()
    mlp0 = copy.deepcopy(w.model.mlp.state_dict())
    wide0 = ps.w["wide"].copy()
    w.begin_epoch(0, StandardDecay(0.05))
    w.run_steps(4, None)
    np.testing.assert_array_equal(ps.w["embedding"], emb0)
    for k, v in w.model.mlp.state_dict().items():
        assert torch.equal(v, mlp0[k])
    assert all("embedding" not in p["grads"] for p in ps.pushes)
    # No optimizer state for frozen layers; the wide part trained.
    assert w.opt is None
    assert not np.array_equal(ps.w["wide"], wide0)


def test_dense_state_round_trip(census_256, local_ps_class):
    w, _ = _worker(census_256, DEEPFM, {}, local_ps_class, 13)
    w.begin_epoch(0, StandardDecay(0.05))
    w.run_steps(2, None)
    blob = w.dense_state()
    # safetensors: the ecosystem reads it; model/<name> is the module's own state_dict
    from safetensors.torch import load

    tensors = load(blob)
    for name, v in w.model.state_dict().items():
        assert torch.equal(tensors[f"model/{name}"], v)
    assert any(k.startswith("opt/") for k in tensors) and "rng/torch" in tensors
    w2, _ = _worker(census_256, DEEPFM, {"seed": 99}, local_ps_class, 13)
    w2.load_dense_state(blob)
    for p, q in zip(w.model.parameters(), w2.model.parameters(), strict=True):
        assert torch.equal(p, q)
    s1, s2 = w.opt.state_dict(), w2.opt.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for k in s1["state"]:
        for name, v in s1["state"][k].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(s2["state"][k][name]))


def test_loss_scale_is_divided_out(census_256, local_ps_class):
    """A loss scale (as under AMP) changes nothing but the size of the raw gradients."""
    plain, ps_plain = _worker(census_256, DEEPFM, {}, local_ps_class, 13)
    scaled, ps_scaled = _worker(census_256, DEEPFM, {}, local_ps_class, 13)
    scaled.loss_scale = 1024.0
    plain.begin_epoch(0, StandardDecay(0.05))
    scaled.begin_epoch(0, StandardDecay(0.05))
    plain.run_steps(3, None)
    scaled.run_steps(3, None)
    for name in ps_plain.w:
        np.testing.assert_allclose(ps_scaled.w[name], ps_plain.w[name], rtol=1e-5, atol=1e-7)
    for p, q in zip(plain.model.parameters(), scaled.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_amp_halves_the_loss_scale_on_a_skipped_update(tmp_path, local_ps_class):
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 128)
    w, ps = _worker(
        path,
        {"ml.inputlayer.optimizer": "SGD"},
        {"batch_size": 32, "num_features": 123},
        _PoisonOnce(local_ps_class),
    )
    # The dynamic loss-scale rule runs on CPU too (autocast itself is CUDA-only: on a CPU worker
    # it changes nothing, and torch warns of it where no CUDA is available).
    w.amp, w.loss_scale = True, 2.0**16
    w.begin_epoch(0, StandardDecay(1.0, alpha=1.0))
    if torch.cuda.is_available():
        out = w.run_steps(4, None)
    else:
        with pytest.warns(UserWarning, match="CUDA is not available"):
            out = w.run_steps(4, None)
    assert out.skipped == 1
    assert w.loss_scale == 2.0**15
    assert w.good_steps == 2  # reset by the skip, then two good updates
    assert np.isfinite(ps.w["weight"]).all()


def test_streaming_trains_like_in_memory(tmp_path, local_ps_class):
    """ml.data.stream reads batches from disk chunk by chunk: without shuffling, the same
    batches (and validation rows) as in memory, so the same weights."""
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 700)
    sets = {"ml.data.validate.ratio": 0.1, "ml.data.chunk.rows": 100}
    mem, ps_mem = _worker(path, sets, {"batch_size": 64, "num_features": 123}, local_ps_class)
    st, ps_st = _worker(
        path,
        {**sets, "ml.data.stream": True},
        {"batch_size": 64, "num_features": 123},
        local_ps_class,
    )
    assert len(st.part.train) == 0  # nothing held in memory
    assert st.data_summary()["train"] == mem.data_summary()["train"]
    np.testing.assert_array_equal(st.part.valid.row_index, mem.part.valid.row_index)
    n_mem = mem.begin_epoch(0, StandardDecay(0.1))
    n_st = st.begin_epoch(0, StandardDecay(0.1))
    assert n_mem == n_st == 10  # 630 training rows / 64
    mem.run_steps(n_mem, None)
    st.run_steps(n_st, None)
    np.testing.assert_array_equal(ps_st.w["weight"], ps_mem.w["weight"])
    np.testing.assert_array_equal(ps_st.w["bias"], ps_mem.w["bias"])


class _CountingPS:
    """A LocalPS class that counts pull_many calls and fused push_pull calls."""

    def __init__(self, base):
        self.base = base
        self.pulls = 0
        self.fused = 0

    def __call__(self, specs):
        ps = self.base(specs)
        pull_many, fused = ps.pull_many, ps.push_pull_async

        def counted_pull(req):
            self.pulls += 1
            return pull_many(req)

        def counted_fused(updates, lr, req):
            self.fused += 1
            return fused(updates, lr, req)

        ps.pull_many, ps.push_pull_async = counted_pull, counted_fused
        return ps


def test_prefetch_across_chunks_and_epochs_changes_nothing_but_round_trips(
    census_256, local_ps_class
):
    """A chunk's last push fetching the next chunk's first rows (also across an epoch, with
    shuffling) trains exactly as separate push and pull calls: same pushes, same weights."""
    sets = {**DEEPFM, "ml.fm.rank": 4}
    runs = {}
    for mode in ("plain", "prefetch"):
        counter = _CountingPS(local_ps_class)
        w, ps = _worker(census_256, sets, {"shuffle": True}, counter, 13)
        sched = StandardDecay(0.05, alpha=0.5)
        for epoch in range(3):
            n = w.begin_epoch(epoch, sched)  # 256 rows / 64 = 4 updates
            assert n == 4
            if mode == "plain":
                w.run_steps(4, None)
            else:
                w.run_steps(1, None, True, None)
                w.run_steps(3, None, epoch < 2, epoch + 1 if epoch < 2 else None)
        runs[mode] = (ps, w, counter)
    (ps_a, w_a, c_a), (ps_b, w_b, c_b) = runs["plain"], runs["prefetch"]
    assert [p["lr"] for p in ps_a.pushes] == [p["lr"] for p in ps_b.pushes]
    for pa, pb in zip(ps_a.pushes, ps_b.pushes, strict=True):
        for name, (ids, g) in pa["grads"].items():
            np.testing.assert_array_equal(pb["grads"][name][0], ids)
            np.testing.assert_array_equal(pb["grads"][name][1], g)
    for name in ps_a.w:
        np.testing.assert_array_equal(ps_a.w[name], ps_b.w[name])
    for p, q in zip(w_a.model.parameters(), w_b.model.parameters(), strict=True):
        assert torch.equal(p, q)
    # plain: a pull to start each epoch; prefetch: only the very first one (every pull_many
    # is counted, those inside a fused push_pull too).
    assert (c_a.fused, c_b.fused) == (9, 11)
    assert (c_a.pulls - c_a.fused, c_b.pulls - c_b.fused) == (3, 1)
