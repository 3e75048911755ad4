"""A schedule per table: ml.opt.decay.<table>.* and ml.learn.rate.<table>, falling back to the
global keys; each table follows its own schedule exactly in a job, across resume."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import decay
from angelconf.config import ConfigError, load_config
from learners.job.learner import GraphLearner
from learners.job.rate_plan import RatePlan
from learners.job.table_schedules import table_keys, table_names, table_schedules
from learners.keys import all_keys
from learners.runs.run_log import tb_scalars
from tests.learners.test_worker import _head

ROOT = Path(__file__).resolve().parents[2]


def _conf(sets: dict):
    return load_config(None, sets, all_keys())


def test_own_keys_fall_back_to_the_global_ones():
    conf = _conf(
        {
            "ml.learn.rate": 0.1,
            "ml.opt.decay.class.name": "StepLR",
            "ml.opt.decay.step.size": 3,
            "ml.learn.rate.bias": 0.5,  # the job's StepLR from another rate
            "ml.opt.decay.embedding.class.name": "CosineAnnealingLR",  # none of StepLR's keys
            "ml.opt.decay.embedding.eta.min": 0.01,
            "ml.opt.decay.weight.gamma": 0.5,  # StepLR with step.size 3 and its own gamma
        }
    )
    assert table_keys(conf)["weight"] == {"ml.opt.decay.gamma": "ml.opt.decay.weight.gamma"}
    own = table_schedules(conf, ["weight", "bias", "embedding"], 12)
    assert own["bias"].describe() == "StepLR(lr=0.5, step_size=3, gamma=0.1)"
    assert own["weight"].describe() == "StepLR(lr=0.1, step_size=3, gamma=0.5)"
    assert own["embedding"].describe() == "CosineAnnealingLR(lr=0.1, t_max=12, eta_min=0.01)"
    assert table_schedules(_conf({"ml.opt.decay.class.name": "StepLR"}), ["w"], 4) == {}


def test_unknown_tables_and_bad_own_keys_are_errors_naming_the_key():
    with pytest.raises(
        ConfigError,
        match=r"^ml\.opt\.decay\.embeding\.gamma: this model has no table 'embeding'; "
        r"valid table names: weight, embedding, dense$",
    ):
        table_schedules(
            _conf({"ml.opt.decay.embeding.gamma": 0.5}), ["weight", "embedding"], 4, True
        )
    with pytest.raises(ConfigError, match=r"^StepLR: ml\.opt\.decay\.bias\.step\.size is required"):
        table_schedules(_conf({"ml.opt.decay.bias.class.name": "StepLR"}), ["bias"], 4)
    with pytest.raises(
        ConfigError, match=r"ml\.opt\.decay\.bias\.class\.name=SequentialLR: a table"
    ):
        table_schedules(_conf({"ml.opt.decay.bias.class.name": "SequentialLR"}), ["bias"], 4)
    with pytest.raises(ConfigError, match=r"ml\.learn\.rate\.bias=-1 is not valid"):
        _conf({"ml.learn.rate.bias": -1})
    with pytest.warns(
        UserWarning, match=r"^ml\.opt\.decay\.bias\.max\.lr: set but not used by StepLR"
    ):
        table_schedules(
            _conf(
                {
                    "ml.opt.decay.bias.class.name": "StepLR",
                    "ml.opt.decay.bias.step.size": 2,
                    "ml.opt.decay.bias.max.lr": 0.3,
                }
            ),
            ["bias"],
            4,
        )
    # the job's keys unused by a table's inherited schedule are not reported twice
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conf = _conf({"ml.opt.decay.class.name": "StepLR", "ml.opt.decay.step.size": 2})
        table_schedules(conf, ["bias"], 4)


def test_dense_names_the_dense_layers_and_the_ps_dense_tables():
    assert table_names(["weight", "dense.0.weight", "dense.0.bias"], False) == ["weight", "dense"]
    assert table_names(["weight"], True) == ["weight", "dense"]
    assert table_names(["weight"], False) == ["weight"]
    plan = RatePlan(
        decay.ConstantLearningRate(0.1),
        {"dense": decay.ConstantLearningRate(0.3)},
        on_batch=True,
        ps_dense=("dense.0.weight",),
    )
    r = plan.rates()
    assert (r.lr, r.dense_lr) == (0.1, 0.3)
    assert r.push.of("dense.0.weight") == (0.3, None) and r.push.of("weight") == (0.1, None)
    assert r.record() == {"lr/dense": 0.3}


def test_table_rates_go_to_tensorboard():
    tags = dict(tb_scalars({"kind": "step", "step": 3, "lr": 0.1, "lr/bias": 0.2, "momentum": 0.9}))
    assert tags["train/lr/bias"] == 0.2 and tags["train/momentum"] == 0.9


# --- real jobs -----------------------------------------------------------------------------------


BIAS = decay.CosineAnnealingLR(0.2, t_max=12, eta_min=0.01)
WEIGHT = decay.StepLR(0.05, step_size=3, gamma=0.5)
TWO = {
    "ml.learn.rate": 0.05,
    "ml.opt.decay.class.name": "StepLR",
    "ml.opt.decay.step.size": 3,
    "ml.opt.decay.gamma": 0.5,
    "ml.learn.rate.bias": 0.2,
    "ml.opt.decay.bias.class.name": "CosineAnnealingLR",
    "ml.opt.decay.bias.eta.min": 0.01,
    # (set: a job of fewer epochs, the first part of a resumed one, has the same schedule)
    "ml.opt.decay.bias.t.max": 12,
}


def _job(tmp_path: Path, name: str, data: str, sets: dict, resume: bool = False):
    """LR on ``data`` (4 updates per epoch, 3 epochs unless ``sets`` says otherwise): its
    records and its predictions of ``data``."""
    conf = {
        "angel.train.data.path": data,
        "angel.log.path": str(tmp_path / name),
        "angel.job.name": name,
        # (not the job file's runs/lr_a9a/model: test modules running at once would share it)
        "angel.save.model.path": "",
        "ml.data.validate.ratio": 0.0,
        "ml.data.use.shuffle": False,
        "ml.minibatch.size": 100,
        "ml.epoch.num": 3,
        "angel.log.every.steps": 1,
        "ml.opt.decay.on.batch": True,
        "ml.inputlayer.optimizer": "Momentum",
        **sets,
    }
    learner = GraphLearner.from_properties(ROOT / "conf" / "lr_a9a.properties", conf, quiet=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # lr_a9a's alpha, unused here
            learner.train(resume=resume)
        pred = learner.predict(data)
    finally:
        learner.shutdown()
    log = tmp_path / name
    run = log / (log / "latest").read_text().strip()
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "step"], np.asarray(pred)


def test_a_table_on_its_own_schedule_trains_as_the_job_schedule_would(tmp_path, ray_local):
    """weight frozen: bias alone trains, on its own CosineAnnealingLR beside the job's StepLR,
    and ends exactly where a job whose schedule is that CosineAnnealingLR ends."""
    data = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 400)
    frozen = {"ml.freeze.layers": "weight"}
    steps, pred = _job(tmp_path, "two", data, {**TWO, **frozen})
    alone = {
        "ml.learn.rate": 0.2,
        "ml.opt.decay.class.name": "CosineAnnealingLR",
        "ml.opt.decay.eta.min": 0.01,
        "ml.opt.decay.t.max": 12,
        **frozen,
    }
    steps_alone, pred_alone = _job(tmp_path, "alone", data, alone)
    assert [r["lr"] for r in steps] == [WEIGHT.lr_at(k) for k in range(12)]
    assert [r["lr/bias"] for r in steps] == [BIAS.lr_at(k) for k in range(12)]
    assert [r["lr"] for r in steps_alone] == [r["lr/bias"] for r in steps]
    assert "lr/bias" not in steps_alone[0]
    np.testing.assert_array_equal(pred, pred_alone)
    assert np.ptp(pred) == 0  # (only the bias moved: one prediction for every row)


@pytest.mark.slow
def test_two_tables_on_two_schedules_resume_exactly(tmp_path, ray_local):
    data = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 400)
    full, pred_full = _job(tmp_path, "full", data, TWO)
    ckpt = {"angel.save.model.path": str(tmp_path / "ckpt")}
    _job(tmp_path, "first", data, {**TWO, **ckpt, "ml.epoch.num": 1})
    resumed, pred_resumed = _job(tmp_path, "resumed", data, {**TWO, **ckpt}, resume=True)
    assert [r["step"] for r in resumed] == list(range(5, 13))
    for a, b in zip(full[4:], resumed, strict=True):
        assert (a["lr"], a["lr/bias"]) == (b["lr"], b["lr/bias"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert [r["lr/bias"] for r in full] == [BIAS.lr_at(k) for k in range(12)]
    np.testing.assert_allclose(pred_resumed, pred_full, rtol=1e-6)
