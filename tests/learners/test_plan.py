"""TrainPlan from a job configuration, and the job's size from the workers' data summaries."""

from __future__ import annotations

import pytest

from angelconf.config import load_config
from learners.job.job_size import JobSize
from learners.job.loop_options import KEYS, TrainPlan
from learners.keys import all_keys


def _plan(**sets) -> TrainPlan:
    return TrainPlan.from_config(load_config(None, sets, all_keys()))


def _summary(train_rows: int, max_id: int = 9) -> dict:
    part = {"rows": train_rows, "nnz": 0, "max_id": max_id, "min_nnz": 0, "max_nnz": 0}
    return {"train": part, "valid": {**part, "rows": 1}, "skipped_lines": 2}


def test_defaults_come_from_the_key_declarations():
    plan = _plan()
    declared = {k.name: k.default for k in KEYS}
    assert plan.epochs == declared["ml.epoch.num"]
    assert plan.minibatch_size == declared["ml.minibatch.size"] == 128
    assert plan.updates_per_epoch is None  # not set: ml.minibatch.size sizes the batches
    assert (plan.device, plan.worker_gpus) == ("cpu", 0.0)
    assert plan.log_dir == "runs"  # each run in its own runs/<angel.job.name>-<time>
    assert (plan.keep_last, plan.save_failure, plan.save_model) == (1, "stop", True)
    # unset keep.best: kept when the job validates (ml.data.validate.ratio 0.05 by default)
    assert plan.keep_best is True
    no_split = {"ml.data.validate.ratio": 0}
    assert _plan(**no_split).keep_best is False
    assert _plan(**no_split, **{"angel.validate.data.path": "v"}).keep_best is True
    assert _plan(**{"angel.save.model.keep.best": False}).keep_best is False
    off = {"angel.save.model": False, "angel.save.model.path": "m"}
    assert (_plan(**off).save_model, _plan(**off).save_path) == (False, None)


def test_cuda_device_reserves_one_gpu_per_worker():
    plan = _plan(**{"angel.worker.device": "cuda", "ml.freeze.layers": "Embedding,MLP"})
    assert (plan.device, plan.worker_gpus) == ("cuda", 1.0)
    assert plan.frozen == ("embedding", "mlp")
    inference = plan.for_inference("ps")
    assert (inference.device, inference.worker_gpus, inference.workers) == ("cpu", 0.0, 1)
    assert inference.dense_placement == "ps" and not inference.amp


def test_job_size_takes_the_smallest_part():
    plan = _plan(**{"ml.minibatch.size": 10, "ml.grad.accum.steps": 2})
    size = JobSize.of_parts(plan, [_summary(95), _summary(120, max_id=41)], -1, -1)
    assert (size.num_features, size.num_fields, size.batch_size) == (42, None, 10)
    assert size.updates_per_epoch == 5  # ceil(95 / 10) // 2
    assert size.train_rows == (95, 120) and size.skipped_lines == 4
    assert size.skipped_first is None
    second = {**_summary(120), "skipped_first": "b.libsvm:7: bad value"}
    size = JobSize.of_parts(plan, [_summary(95), second], -1, -1)
    assert size.skipped_first == "b.libsvm:7: bad value"  # the first worker that skipped one
    angel = _plan(**{"ml.num.update.per.epoch": 4})
    assert JobSize.of_parts(angel, [_summary(95)], 148, 13).batch_size == 24
    with pytest.raises(ValueError, match="worker 1 has no training rows"):
        JobSize.of_parts(plan, [_summary(95), _summary(0)], -1, -1)
