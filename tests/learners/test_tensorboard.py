"""Optional TensorBoard event files next to metrics.jsonl (angel.log.tensorboard)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learners.run_log import RunLog


def test_step_and_epoch_scalars_reach_the_event_file(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    log = RunLog(tmp_path, quiet=True, tensorboard=True)
    log.record({"kind": "step", "epoch": 0, "step": 50, "lr": 0.1, "loss": 0.5, "pull_s": 0.01})
    log.record({"kind": "step", "epoch": 0, "step": 100, "lr": 0.05, "loss": 0.4, "pull_s": 0.02})
    log.record({"kind": "epoch", "epoch": 0, "lr": 0.05, "valid_auc": 0.9, "stopped": True})
    log.record({"kind": "summary", "valid_auc": 0.9})
    log.close()

    acc = event_accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"step/lr", "step/loss", "step/pull_s", "epoch/lr", "epoch/valid_auc"} <= tags
    assert "epoch/stopped" not in tags  # booleans are not curves
    loss = acc.Scalars("step/loss")
    assert [e.step for e in loss] == [50, 100]
    assert [e.value for e in loss] == pytest.approx([0.5, 0.4])
    assert acc.Scalars("epoch/valid_auc")[0].value == pytest.approx(0.9)
    # metrics.jsonl is written as before.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["step", "step", "epoch", "summary"]


def test_without_tensorboard_no_event_file(tmp_path: Path) -> None:
    log = RunLog(tmp_path, quiet=True)
    log.record({"kind": "step", "epoch": 0, "step": 1, "loss": 0.5})
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
