"""learners.job.rate_plan: each update's step sizes and momentum (momentum cycles applied,
schedules counted in samples or epochs, batch scaling), in one process and in real jobs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import decay
from angelconf.config import ConfigError, load_config
from angelps.rates import StepRates
from learners.job.job_size import JobSize
from learners.job.learner import GraphLearner
from learners.job.loop_options import TrainPlan
from learners.job.rate_plan import (
    RatePlan,
    batch_scale,
    build_rate_plan,
    check_rates_early,
    schedule_total,
)
from learners.keys import all_keys
from learners.models.config import ModelConfig
from learners.models.table_decl import table_specs
from learners.models.tables import model_tables
from tests.learners.test_worker import _head, _worker

ROOT = Path(__file__).resolve().parents[2]


# --- in one process ------------------------------------------------------------------------------


def test_samples_and_epochs_units_read_the_schedule_at_the_samples_seen():
    sched = decay.CosineAnnealingLR(1.0, t_max=4000)
    plan = RatePlan(sched, unit="samples", global_batch=64, epoch_rows=1000)
    plan.start_epoch(2)
    seen = []
    for _ in range(17):  # 16 updates fill the epoch; the 17th is capped at its rows
        r = plan.rates()
        seen.append(r.record()["schedule_at"])
        assert r.lr == sched.lr_at(int(r.record()["schedule_at"]))
        plan.advance()
    assert seen[:3] == [2000, 2064, 2128] and seen[-1] == 3000
    assert sched.count == 0  # a schedule counted in samples keeps no count of updates
    epochs = RatePlan(decay.StepLR(1.0, step_size=1, gamma=0.5), unit="epochs", epoch_rows=100)
    epochs.global_batch = 50
    epochs.start_epoch(1)
    epochs.advance()
    assert epochs.position() == 1.5 and epochs.peek() == 0.5
    smooth = RatePlan(decay.LinearLR(1.0, 0.25, 1.0, total_iters=4), unit="epochs", epoch_rows=100)
    smooth.global_batch = 25
    smooth.start_epoch(1)
    smooth.advance()
    assert smooth.peek() == pytest.approx(0.25 + 0.75 * 1.25 / 4)


def test_state_round_trips_and_old_checkpoints_load():
    plan = RatePlan(decay.StepLR(1.0, step_size=2), unit="updates", on_batch=True)
    for _ in range(3):
        plan.advance()
    state = json.loads(json.dumps(plan.state_dict()))
    again = RatePlan(decay.StepLR(1.0, step_size=2), unit="updates", on_batch=True)
    again.load_state_dict(state)
    assert again.main.count == 3 and again.in_epoch == 3 and again.peek() == plan.peek()
    again.load_state_dict({"count": 5})  # a checkpoint written before rate plans
    assert again.main.count == 5


def test_start_screen_lines_name_each_schedule_its_unit_and_momentum():
    plan = RatePlan(
        decay.OneCycleLR(0.1, total_steps=1000),
        {"embedding": decay.ConstantLearningRate(0.05)},
        "samples",
        True,
        global_batch=10,
        epoch_rows=100,
        scale=2.0,
    )
    main, table = plan.describe()
    assert main.startswith("OneCycleLR(lr=0.1, total_steps=1000, ")
    assert " in samples (ml.opt.decay.unit), x2 (ml.learn.rate.scaling): 0.008, " in main
    assert "; momentum 0.95, " in main
    assert table == (
        "embedding: ConstantLearningRate(lr=0.05, intervals=100) in samples (ml.opt.decay.unit), "
        "x2 (ml.learn.rate.scaling): 0.1, 0.1, 0.1, 0.1, ..."
    )


def test_batch_scaling_and_totals():
    assert batch_scale("linear", 1024, 256) == 4.0
    assert batch_scale("sqrt", 1024, 256) == 2.0
    assert batch_scale("none", 1024, 256) == 1.0
    assert schedule_total("samples", False, 3, 10, 900) == 2700
    assert schedule_total("epochs", True, 3, 10, 900) == 3
    assert schedule_total("updates", True, 3, 10, 900) == 30
    plan = RatePlan(decay.ConstantLearningRate(0.1), scale=4.0)
    assert plan.rates().push == pytest.approx(0.4)


def test_worker_pushes_the_cycled_momentum_and_steps_dense_layers_with_it(tmp_path, local_ps_class):
    """A OneCycleLR copy in the worker: each push carries (lr, momentum) of its update."""
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 256)
    w, ps = _worker(
        path,
        {"ml.inputlayer.optimizer": "Momentum"},
        {"batch_size": 32, "num_features": 123},
        local_ps_class,
    )
    sched = decay.OneCycleLR(0.1, total_steps=8)
    w.begin_epoch(0, RatePlan(sched, on_batch=True))
    out = w.run_steps(6, None)
    assert out.updates == 6
    got = [p["lr"] for p in ps.pushes]
    assert all(isinstance(p, StepRates) for p in got)
    assert [p.lr for p in got] == [sched.lr_at(k) for k in range(6)]
    assert [p.momentum for p in got] == [sched.momentum_at(k) for k in range(6)]
    assert out.last_rates == {"momentum": sched.momentum_at(5)}


def _job_parts(sets: dict, dense_params: int = 10):
    conf = load_config(None, {"angel.train.data.path": "x", **sets}, all_keys())
    plan = TrainPlan.from_config(conf)
    cfg = ModelConfig.from_config(conf, 100, int(conf["ml.fm.field.num"]) or None)
    specs = table_specs(conf, model_tables(cfg))
    size = JobSize(100, cfg.num_fields, 10, 5, train_rows=(50,))
    return conf, plan, size, specs, dense_params


def test_momentum_cycles_need_momentum_on_the_dense_layers_and_each_tables_own():
    deepfm = {
        "ml.model.class.name": "DeepFM",
        "ml.fm.field.num": 4,
        "ml.opt.decay.class.name": "OneCycleLR",
        "ml.embedding.optimizer": "Adam",
        "ml.inputlayer.optimizer": "Momentum",
    }
    with pytest.raises(
        ConfigError,
        match=r"^ml\.opt\.decay\.cycle\.momentum=true: OneCycleLR cycles the momentum, but "
        r"the optimizer of the dense layers \(ml\.fclayer\.optimizer\) is sgd, which has none",
    ):
        build_rate_plan(*_job_parts({**deepfm, "ml.fclayer.optimizer": "SGD"}))
    plan = build_rate_plan(*_job_parts({**deepfm, "ml.fclayer.optimizer": "Adam"}))
    r = plan.rates()
    assert r.dense_momentum == r.momentum == 0.95 and r.push.momentum == 0.95
    # the dense layers on their own schedule, without a cycle: plain SGD is fine for them
    own = {**deepfm, "ml.fclayer.optimizer": "SGD", "ml.opt.decay.dense.class.name": "StepLR"}
    own["ml.opt.decay.dense.step.size"] = 2
    r = build_rate_plan(*_job_parts(own)).rates()
    assert r.dense_momentum is None and r.momentum == 0.95
    with pytest.raises(
        ConfigError,
        match=r"^ml\.opt\.decay\.wide\.cycle\.momentum=true: CyclicLR cycles the momentum, but "
        r"the optimizer of table wide \(ml\.inputlayer\.optimizer\) is adagrad",
    ):
        check_rates_early(
            _job_parts(
                {
                    **deepfm,
                    "ml.inputlayer.optimizer": "AdaGrad",
                    "ml.opt.decay.class.name": "StepLR",
                    "ml.opt.decay.step.size": 2,
                    "ml.opt.decay.wide.class.name": "CyclicLR",
                    "ml.opt.decay.wide.max.lr": 1.0,
                }
            )[0]
        )
    with pytest.raises(ConfigError, match=r"^ml\.learn\.rate\.mlp: this model has no table 'mlp'"):
        check_rates_early(_job_parts({**deepfm, "ml.learn.rate.mlp": 0.1})[0])
    # before the model is built, dense is not yet known to exist: left to build_rate_plan
    check_rates_early(_job_parts({"ml.learn.rate.dense": 0.1})[0])
    with pytest.raises(
        ConfigError,
        match=r"^ml\.learn\.rate\.dense: this model has no table 'dense'; valid "
        r"table names: weight, bias$",
    ):
        build_rate_plan(*_job_parts({"ml.learn.rate.dense": 0.1}, dense_params=0))


# --- real jobs -----------------------------------------------------------------------------------


def _run(tmp_path: Path, name: str, sets: dict, resume: bool = False) -> list[dict]:
    """Train LR on ``sets``; the run's metrics.jsonl records."""
    conf = {
        "angel.log.path": str(tmp_path / name),
        "angel.job.name": name,
        # (not the job file's runs/lr_a9a/model: test modules running at once would share it)
        "angel.save.model.path": "",
        "ml.data.validate.ratio": 0.0,
        "ml.data.use.shuffle": False,
        "angel.log.every.steps": 1,
        "ml.opt.decay.on.batch": True,
        **sets,
    }
    learner = GraphLearner.from_properties(ROOT / "conf" / "lr_a9a.properties", conf, quiet=True)
    try:
        learner.train(resume=resume)
    finally:
        learner.shutdown()
    log = tmp_path / name
    run = log / (log / "latest").read_text().strip()
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.filterwarnings("ignore:ml.opt.decay.alpha. set but not used")
def test_onecycle_momentum_in_a_job_and_without_momentum_an_error(tmp_path, ray_local):
    data = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 400)
    sets = {
        "angel.train.data.path": data,
        "ml.epoch.num": 2,
        "ml.minibatch.size": 100,
        "ml.opt.decay.class.name": "OneCycleLR",
        "ml.learn.rate": 0.05,
    }
    steps = [r for r in _run(tmp_path, "onecycle", sets) if r["kind"] == "step"]
    ref = decay.OneCycleLR(0.05, total_steps=8)
    assert [r["lr"] for r in steps] == [ref.lr_at(k) for k in range(8)]
    assert [r["momentum"] for r in steps] == [ref.momentum_at(k) for k in range(8)]
    with pytest.raises(
        ConfigError,
        match=r"^ml\.opt\.decay\.cycle\.momentum=true: OneCycleLR cycles the momentum, but the "
        r"optimizer of table weight \(ml\.inputlayer\.optimizer\) is sgd, which has none "
        r"\(valid with a momentum cycle: Momentum, Adam\); set ml\.opt\.decay\.cycle\.momentum"
        r"=false or use Momentum or Adam$",
    ):
        _run(tmp_path, "sgd", {**sets, "ml.inputlayer.optimizer": "SGD"})


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:ml.opt.decay.alpha. set but not used")
def test_samples_unit_resumed_with_two_workers_continues_the_curve(tmp_path, ray_local):
    """2 epochs with 1 worker, resumed with 2 workers (twice the global batch): the lr at each
    sample count is the uninterrupted run's."""
    data = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 1000)
    sets = {
        "angel.train.data.path": data,
        "ml.minibatch.size": 50,
        "ml.opt.decay.unit": "samples",
        "ml.opt.decay.class.name": "OneCycleLR",  # (its momentum cycle drives Adam's beta1)
        "ml.learn.rate": 0.05,
    }
    full = _run(tmp_path, "full", {**sets, "ml.epoch.num": 4})
    ckpt = {"angel.save.model.path": str(tmp_path / "ckpt")}
    _run(tmp_path, "first", {**sets, **ckpt, "ml.epoch.num": 2})
    resumed = _run(
        tmp_path,
        "resumed",
        {**sets, **ckpt, "ml.epoch.num": 4, "angel.workergroup.number": 2},
        True,
    )
    curve = {r["schedule_at"]: (r["lr"], r["momentum"]) for r in full if r["kind"] == "step"}
    after = [r for r in resumed if r["kind"] == "step"]
    assert [r["schedule_at"] for r in after] == [2000 + 100 * u for u in range(20)]
    assert [(r["lr"], r["momentum"]) for r in after] == [curve[r["schedule_at"]] for r in after]
    ref = decay.OneCycleLR(0.05, total_steps=4000)  # told 4 epochs x 1000 rows
    assert all(curve[s] == ref.value_at(s) for s in curve)
    assert len(set(curve.values())) > 30 and max(curve) == 3950
    start = next(r for r in resumed if r["kind"] == "start")
    assert start["decay_unit"] == "samples" and start["global_batch"] == 100
    assert not math.isclose(curve[2000][0], curve[3000][0])
    assert np.isfinite([r["loss"] for r in after]).all()


def test_a_schedule_phase_past_the_job_s_end_is_said():
    """A warmup longer than the job trains at a fraction of the step size throughout; a first
    decay past its end never decays: each a warning, none for a schedule the job completes."""
    job = {"ml.opt.decay.on.batch": True, "ml.epoch.num": 2}  # 5 updates an epoch: 10 in all
    warm = {"ml.opt.decay.class.name": "WarmupCosine", "ml.opt.decay.warmup.steps": 50}
    with pytest.warns(UserWarning) as said:
        build_rate_plan(*_job_parts({**job, **warm, "ml.opt.decay.decay.steps": 100}))
    assert [str(w.message) for w in said] == [
        "WarmupCosine: the job ends after 10 updates, before the end of its warmup (update 50); "
        "`angelps schedule --conf JOB` shows the step sizes"
    ]
    per_epoch = {"ml.epoch.num": 2, "ml.opt.decay.class.name": "StepLR"}
    with pytest.warns(UserWarning, match=r"^StepLR: the job ends after 2 epochs, before its "):
        build_rate_plan(*_job_parts({**per_epoch, "ml.opt.decay.step.size": 3}))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (reached: nothing said)
        build_rate_plan(*_job_parts({**per_epoch, "ml.opt.decay.step.size": 1}))
        build_rate_plan(*_job_parts({**job, **warm, "ml.opt.decay.warmup.steps": 4}))
    assert decay.StepLR(1.0, step_size=3).phases() == [(3, "its first decay")]
    wsd = decay.WarmupStableDecay(1.0, warmup_steps=2, stable_steps=5, decay_steps=3)
    assert wsd.phases() == [(2, "the end of its warmup"), (7, "the start of its cooldown")]
    assert decay.Warmup(decay.MultiStepLR(1.0, [4]), 2).phases() == [
        (2, "the end of its warmup"),
        (6, "its first milestone"),
    ]
