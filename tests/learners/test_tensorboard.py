"""Optional TensorBoard event files next to metrics.jsonl (angel.log.tensorboard): train/* and
valid/* on the global update, seconds per phase as time/*, no counters, the keys once as text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from angelconf.config import load_config
from learners.keys import all_keys
from learners.runs.run_log import RunLog, tb_scalars

STEP = {
    "kind": "step",
    "epoch": 0,
    "step": 50,
    "updates": 50,
    "lr": 0.1,
    "loss": 0.5,
    "samples_per_s": 1000.0,
    "pull_s": 0.01,
    "elapsed_s": 1.2,
    "skipped": 0,
}
EPOCH = {
    "kind": "epoch",
    "epoch": 0,
    "step": 115,
    "lr": 0.05,
    "train_loss": 0.45,
    "train_samples_per_s": 900.0,
    "skipped_updates": 0,
    "valid_auc": 0.9,
    "valid_logloss": float("nan"),
    "valid_rows": 300,
    "valid_count": 300.0,
    "stopped": True,
}


def test_which_fields_become_which_tags():
    assert tb_scalars(STEP) == [
        ("train/lr", 0.1),
        ("train/loss", 0.5),
        ("train/samples_per_s", 1000.0),
        ("time/pull_s", 0.01),
    ]
    # Not a NaN, not a count, not a flag, not the epoch's own bookkeeping.
    assert tb_scalars(EPOCH) == [("train/epoch_loss", 0.45), ("valid/auc", 0.9)]
    assert tb_scalars({"kind": "summary", "valid_auc": 0.9}) == []


def test_scalars_on_the_global_update_and_the_keys_as_text(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    conf = load_config(None, {"ml.learn.rate": 0.1, "angel.job.name": "tb"}, all_keys())
    log = RunLog(tmp_path, quiet=True, tensorboard=True)
    log.config_text(conf)
    log.record(STEP)
    log.record({**STEP, "step": 100, "loss": 0.4})
    log.record(EPOCH)
    log.write_summary({"valid_auc": 0.9})
    log.close()

    acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {
        "train/lr",
        "train/loss",
        "train/samples_per_s",
        "time/pull_s",
        "train/epoch_loss",
        "valid/auc",
    }
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [50, 100]
    assert [e.value for e in loss] == pytest.approx([0.5, 0.4])
    assert [(e.step, e.value) for e in acc.Scalars("valid/auc")] == [(115, pytest.approx(0.9))]
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| ml.learn.rate | 0.1 | program |" in text and "| angel.job.name | tb |" in text
    # metrics.jsonl and summary.json are written as before.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["step", "step", "epoch", "summary"]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"valid_auc": 0.9}


def test_without_tensorboard_no_event_file(tmp_path: Path) -> None:
    log = RunLog(tmp_path, quiet=True)
    log.record({"kind": "step", "epoch": 0, "step": 1, "loss": 0.5})
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
