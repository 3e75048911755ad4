"""The workers compute each update's rates from their own count: the rate plan reaches them once
(and again only after a metric-driven schedule moved), no schedule state comes back, the
driver's copy follows from the applied updates, and a resumed job repeats the same rates."""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from pathlib import Path

import pytest

import decay
from learners.job.learner import GraphLearner
from learners.job.rate_plan import RatePlan
from learners.worker.chunk_stats import StepStats
from learners.worker.group import WorkerGroup
from tests.learners.test_worker import _head, _PoisonOnce, _worker

ROOT = Path(__file__).resolve().parents[2]


# --- in one process ------------------------------------------------------------------------------


def test_step_stats_carry_no_schedule_state():
    names = {f.name for f in dataclasses.fields(StepStats)}
    assert "sched_state" not in names
    assert not any("sched" in n or "count" in n for n in names)


@pytest.mark.parametrize("on_batch", [True, False], ids=["per-update", "per-epoch"])
def test_a_plan_sent_once_gives_the_rates_of_the_drivers_count(tmp_path, local_ps_class, on_batch):
    """One plan for three epochs (a skipped update in the first): the worker's pushes read the
    schedule at its own count, and the driver's copy, advanced by the updates each chunk
    reports and ended after each epoch, stands where the worker's does."""
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 128)
    w, ps = _worker(
        path,
        {"ml.inputlayer.optimizer": "SGD"},
        {"batch_size": 32, "num_features": 123, "decay_on_batch": on_batch},
        _PoisonOnce(local_ps_class),
    )
    sched = decay.StepLR(0.5, step_size=2, gamma=0.5)
    driver = RatePlan(copy.deepcopy(sched), on_batch=on_batch)
    w.set_rates(RatePlan(sched, on_batch=on_batch))
    w_plan = w.sched
    assert w_plan is not None
    reported = []
    for epoch in range(3):
        driver.start_epoch(epoch)
        assert w.begin_epoch(epoch) == 4
        out = w.run_steps(4, None)
        reported.append((out.updates, out.skipped))
        driver.advance(out.updates)
        driver.end_epoch()
        assert w.sched is w_plan  # (never replaced: no plan arrived after the first)
    assert reported == [(3, 1), (4, 0), (4, 0)]
    # The worker has not ended epoch 2 yet (its next begin_epoch does); otherwise the same.
    w_plan.start_epoch(3)
    driver.start_epoch(3)
    assert w_plan.state_dict() == driver.state_dict()
    if on_batch:  # the count of applied updates: the skipped one did not advance it
        counts = list(range(11))
    else:
        counts = [0] * 3 + [1] * 4 + [2] * 4
    assert [p["lr"] for p in ps.pushes] == [sched.lr_at(k) for k in counts]


def test_an_epoch_is_counted_once_by_the_per_epoch_schedules():
    """The driver ends an epoch after validating; a worker's copy ends it when the next one
    starts; a plan restored from a checkpoint (written after its epoch ended) does not count
    that epoch again."""
    driver = RatePlan(decay.StepLR(1.0, step_size=1, gamma=0.5))
    worker = copy.deepcopy(driver)
    for epoch in range(3):
        driver.start_epoch(epoch)
        worker.start_epoch(epoch)
        driver.advance(4)
        worker.advance(4)
        assert driver.peek() == worker.peek() == 0.5**epoch
        driver.end_epoch()
        driver.end_epoch()  # (once only)
    assert driver.main.count == 3 and worker.main.count == 2  # (the worker's epoch 2 not ended)
    resumed = RatePlan(decay.StepLR(1.0, step_size=1, gamma=0.5))
    resumed.load_state_dict(driver.state_dict())
    resumed.start_epoch(3)
    worker.start_epoch(3)
    assert resumed.main.count == worker.main.count == 3
    assert resumed.peek() == worker.peek() == 0.125
    on_batch = RatePlan(decay.StepLR(1.0, step_size=1, gamma=0.5), on_batch=True)
    on_batch.advance(5)
    on_batch.start_epoch(1)  # per-update decay: an epoch is no step
    assert on_batch.main.count == 5 and on_batch.in_epoch == 0


def test_a_bare_schedule_at_a_later_epoch_starts_there(tmp_path, local_ps_class):
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 64)
    w, _ = _worker(
        path, {}, {"batch_size": 32, "num_features": 123, "decay_on_batch": False}, local_ps_class
    )
    sched = decay.StepLR(0.5, step_size=1, gamma=0.5)
    w.begin_epoch(2, sched)
    w.run_steps(2, None)
    assert sched.count == 0  # (per-epoch decay: the driver's count, which it did not change)
    w.begin_epoch(3)
    assert sched.count == 1  # epoch 2 ended


def test_begin_epoch_without_a_plan_says_so(tmp_path, local_ps_class):
    path = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 64)
    w, _ = _worker(path, {}, {"batch_size": 32, "num_features": 123}, local_ps_class)
    with pytest.raises(RuntimeError, match=r"^begin_epoch: no rate plan yet \(set_rates first\)$"):
        w.begin_epoch(0)


# --- in real jobs --------------------------------------------------------------------------------


def _job(tmp_path: Path, name: str, data: str, sets: dict, resume: bool = False):
    conf = {
        "angel.train.data.path": data,
        "angel.log.path": str(tmp_path / name),
        "angel.job.name": name,
        # (not the job file's runs/lr_a9a/model: test modules running at once would share it)
        "angel.save.model.path": "",
        "ml.data.validate.ratio": 0.25,
        "ml.data.use.shuffle": True,
        "ml.minibatch.size": 100,
        "ml.epoch.num": 4,
        "angel.log.every.steps": 1,
        "ml.inputlayer.optimizer": "Momentum",
        **sets,
    }
    learner = GraphLearner.from_properties(ROOT / "conf" / "lr_a9a.properties", conf, quiet=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # lr_a9a's alpha, unused here
            result = learner.train(resume=resume)
    finally:
        learner.shutdown()
    log = tmp_path / name
    run = log / (log / "latest").read_text().strip()
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "step"], result.history


@pytest.fixture
def calls(monkeypatch):
    """Every call the driver makes to its workers: (method, arguments)."""
    seen: list[tuple[str, tuple]] = []
    execute = WorkerGroup.execute

    def spy(self, method, *args, **kwargs):
        seen.append((method, args))
        return execute(self, method, *args, **kwargs)

    monkeypatch.setattr(WorkerGroup, "execute", spy)
    return seen


PLATEAU = {
    "ml.learn.rate": 0.5,
    "ml.opt.decay.class.name": "ReduceLROnPlateau",
    "ml.opt.decay.on.batch": True,
    "ml.opt.decay.patience": 0,
    # an improvement must halve the loss: every epoch after the first reduces the rate
    "ml.opt.decay.threshold": 0.5,
    "ml.opt.decay.factor": 0.5,
    "ml.early.stop.metric": "valid_logloss",
}


def test_the_plan_goes_out_once_and_after_each_plateau_step(tmp_path, ray_local, calls):
    data = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 400)
    cosine = {"ml.opt.decay.class.name": "CosineAnnealingLR", "ml.opt.decay.on.batch": True}
    steps, _ = _job(tmp_path, "cosine", data, cosine)
    sent = [args for m, args in calls if m == "set_rates"]
    assert len(sent) == 1 and isinstance(sent[0][0], RatePlan)
    assert [args for m, args in calls if m == "begin_epoch"] == [(e,) for e in range(4)]
    # 300 training rows, batch 100: 3 updates an epoch, 12 in all, each at its own count
    expect = decay.CosineAnnealingLR(0.02, t_max=12)  # (lr_a9a's rate; told the job's length)
    assert [r["lr"] for r in steps] == [expect.lr_at(k) for k in range(12)]
    calls.clear()
    steps, history = _job(tmp_path, "plateau", data, PLATEAU)
    assert [m for m, _ in calls].count("set_rates") == 1 + 4  # at the start, after each epoch
    # the first metric is the best yet; each later one reduces the rate for the next epoch
    assert [h["lr"] for h in history] == [0.5, 0.5, 0.25, 0.125]
    assert [r["lr"] for r in steps] == [0.5] * 6 + [0.25] * 3 + [0.125] * 3


def test_per_update_plateau_resumed_repeats_the_rates_and_metrics(tmp_path, ray_local):
    """Per-update decay with a metric-driven schedule: stopped after epoch 2 and resumed, the
    job ends where an uninterrupted one ends, update for update."""
    data = _head(ROOT / "data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 400)
    ckpt = {"angel.save.model.path": str(tmp_path / "ckpt")}
    full, full_h = _job(tmp_path, "full", data, PLATEAU)
    _job(tmp_path, "first", data, {**PLATEAU, **ckpt, "ml.epoch.num": 2})
    resumed, resumed_h = _job(tmp_path, "resumed", data, {**PLATEAU, **ckpt}, resume=True)
    assert [r["step"] for r in resumed] == list(range(7, 13))
    for a, b in zip(full[6:], resumed, strict=True):
        assert a["lr"] == b["lr"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert [h["lr"] for h in resumed_h] == [h["lr"] for h in full_h]
    for a, b in zip(full_h, resumed_h, strict=True):
        assert a["valid_logloss"] == pytest.approx(b["valid_logloss"], rel=1e-6)
    assert [h["lr"] for h in full_h] == [0.5, 0.5, 0.25, 0.125]  # (the plateau reduced it)
