"""Which optimizer keys a job reads (learners/job/optimizer_use.py): each optimizer's
``reads`` is what its update does (a field it does not list changes nothing of two updates, a
field it lists changes them), and a key that none of the job's optimizers reads is named."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from angelconf.config import load_config
from angelps.optimizer_keys import OPTIMIZER_KEYS
from angelps.optimizers.base import NUMPY
from angelps.optimizers.builtin import BUILTIN
from angelps.table import OptimizerSpec
from learners.job.optimizer_use import unused_optimizer_keys
from learners.keys import all_keys

#: Another valid value of every field (the base spec below has L1 and L2 on, so both act).
OTHER = {
    "l1": 0.05,
    "l2": 0.07,
    "momentum": 0.5,
    "beta1": 0.6,
    "beta2": 0.7,
    "eps": 0.3,
    "rho": 0.4,
    "ftrl_alpha": 0.2,
    "ftrl_beta": 0.5,
}


def test_every_optimizer_field_has_another_value_here():
    assert sorted(OTHER) == sorted(OPTIMIZER_KEYS)


def _two_updates(spec: OptimizerSpec) -> list[np.ndarray]:
    opt = next(o for o in BUILTIN if o.name == spec.name)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3)).astype(np.float64)
    state = {n: np.zeros((6, 3 if c is None else c)) for n, c in opt.slots.items()}
    for _ in range(2):  # (momentum acts from the second: v starts at 0)
        opt.update(NUMPY, spec, w, state, rng.standard_normal((6, 3)), 0.1)
    return [w, *state.values()]


@pytest.mark.parametrize("opt", BUILTIN, ids=lambda o: o.display)
def test_reads_is_what_the_update_reads(opt):
    base = OptimizerSpec(opt.name, l1=0.01, l2=0.02)
    before = _two_updates(base)
    assert opt.reads is not None
    for field, value in OTHER.items():
        after = _two_updates(replace(base, **{field: value}))
        same = all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
        assert same == (field not in opt.reads), field


def _unused(sets: dict[str, object]) -> list[str]:
    return unused_optimizer_keys(load_config(None, sets, all_keys()))


def test_a_key_no_optimizer_of_the_job_reads_is_named():
    assert _unused({"ml.reg.l1": 0.01, "ml.embedding.optimizer": "Adam"}) == [
        "ml.embedding.optimizer=Adam (program): set but not used: LogisticRegression has no "
        "embedding tables or layers",
        "ml.reg.l1=0.01 (program): set but not used by the job's optimizers "
        "(ml.inputlayer.optimizer=Momentum); it is read by SGD, AdaGrad, RMSProp, FTRL",
    ]
    # The workers' dense layers run torch.optim's semantics: L1 is not applied there.
    deep = {"ml.model.class.name": "DeepFM", "ml.fm.field.num": 13, "ml.reg.l1": 0.1}
    assert _unused({**deep, "ml.fclayer.optimizer": "AdaGrad"}) == [
        "ml.reg.l1=0.1 (program): set but not used by the job's optimizers "
        "(ml.inputlayer.optimizer=Momentum, ml.embedding.optimizer=Momentum, "
        "ml.fclayer.optimizer=AdaGrad); it is read by SGD, AdaGrad, RMSProp, FTRL; the dense "
        "layers on the workers (angel.dense.placement=worker) do not apply it"
    ]
    # On the PS they do; and keys an optimizer of the job reads are not named.
    ps = {**deep, "ml.fclayer.optimizer": "AdaGrad", "angel.dense.placement": "ps"}
    assert _unused(ps) == []
    assert _unused({"ml.inputlayer.optimizer": "FTRL", "ml.reg.l1": 0.1}) == []
    assert _unused({"ml.opt.momentum.momentum": 0.5, "ml.reg.l2": 0.1}) == []


def test_what_is_not_known_here_is_not_checked():
    # A JSON graph's layers may each name their own optimizer; a plain mapping says not
    # which keys were set.
    assert unused_optimizer_keys({"ml.reg.l1": 0.1}) == []


def test_a_device_tier_key_without_tables_on_the_workers_is_named():
    from learners.job.sparse_keys import unused_placement_keys

    def unused(sets: dict[str, object]) -> list[str]:
        return unused_placement_keys(load_config(None, sets, all_keys()))

    # (the default placement is ps: a tier's budget alone made no tier, unsaid)
    assert unused({"angel.worker.table.capacity": "1000000"}) == [
        "angel.worker.table.capacity=1000000 (program): set but not used with "
        "angel.sparse.placement=ps (the sparse tables stay on the shards): set "
        "angel.sparse.placement=worker or auto for tables on the workers"
    ]
    assert unused({"angel.sparse.placement": "worker", "angel.sparse.worker.memory.mb": 100}) == [
        "angel.sparse.worker.memory.mb=100.0 (program): set but not used with "
        "angel.sparse.placement=worker (it sizes auto's choice only)"
    ]
    assert unused({"angel.sparse.placement": "auto", "angel.worker.table.capacity": "2GB"}) == []
    assert unused({"angel.sparse.placement": "worker", "angel.worker.table.capacity": "2GB"}) == []
    # auto with a key that keeps the tables on the shards (SSP): the tier's keys are said too
    ssp = {"angel.sparse.placement": "auto", "angel.staleness": 1}
    assert unused({**ssp, "angel.worker.table.eviction": "lfu"}) == [
        "angel.worker.table.eviction=lfu (program): set but not used with "
        "angel.sparse.placement=auto (it keeps the sparse tables on the shards: angel.staleness=1: "
        "tables on the workers are updated once per step by their owners (BSP))"
    ]
