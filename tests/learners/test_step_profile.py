"""learners/worker/step_profile.py: torch's profiler over a few of a worker's updates
(``angel.worker.profile.updates``), its files, and its keys' checks."""

from __future__ import annotations

import json

import pytest
import torch

from angelconf.config import ConfigError, load_config
from decay.angel import StandardDecay
from learners.job.loop_options import TrainPlan
from learners.keys import all_keys
from tests.learners.test_worker import DEEPFM, ROOT, _head, _worker


def test_a_worker_profiles_the_updates_asked_for_and_writes_both_files(
    tmp_path, local_ps_class
) -> None:
    path = _head(ROOT / "data/census/census_148d_train.dummy", tmp_path / "c.dummy", 640)
    sets = {
        **DEEPFM,
        "angel.log.path": str(tmp_path / "logs"),
        "angel.worker.profile.updates": 3,
        "angel.worker.profile.skip": 2,
    }
    w, _ = _worker(path, sets, {"log_dir": str(tmp_path / "logs")}, local_ps_class, fields=13)
    w.begin_epoch(0, StandardDecay(0.1))
    w.run_steps(8, None)  # (updates 2, 3 and 4 profiled; the 5th's start ends it)
    summary = json.loads((tmp_path / "logs/profile-worker0.json").read_text())
    assert summary["updates"] == 3
    # DeepFM's forward and backward alone call dozens of operators an update
    assert summary["ops_per_update"] > 20
    assert summary["op_self_cpu_us_per_update"] > 0
    names = [t["name"] for t in summary["top"]]
    assert len(names) == 20 and all(isinstance(n, str) for n in names)
    table = (tmp_path / "logs/profile-worker0.txt").read_text()
    assert table.startswith("3 updates of the training thread") and "aten::addmm" in table
    w.run_steps(2, None)  # (done: profiles once)
    assert w.profile.summary == summary


def test_a_profile_spans_chunks_leaving_out_the_time_between_them(tmp_path, local_ps_class) -> None:
    path = _head(ROOT / "data/census/census_148d_train.dummy", tmp_path / "c.dummy", 1280)
    sets = {**DEEPFM, "angel.worker.profile.updates": 5, "angel.worker.profile.skip": 1}
    w, _ = _worker(path, sets, {"log_dir": str(tmp_path)}, local_ps_class, fields=13)
    w.begin_epoch(0, StandardDecay(0.1))
    w.run_steps(3, None)  # (updates 1 and 2 profiled, then the chunk ends)
    assert w.profile.summary is None and not (tmp_path / "profile-worker0.txt").exists()
    for _ in range(200):  # (the driver's work between chunks: not in the profile)
        torch.ones(4).add_(1)
    w.run_steps(3, None)  # (updates 3, 4 and 5: done)
    summary = w.profile.summary
    assert summary is not None and summary["updates"] == 5
    assert (tmp_path / "profile-worker0.txt").exists()
    # the 200 ones above are not counted (the updates call it a few times at most)
    assert w.profile._totals["aten::ones"][0] < 50


def test_no_profile_by_default(tmp_path, local_ps_class) -> None:
    path = _head(ROOT / "data/census/census_148d_train.dummy", tmp_path / "c.dummy", 256)
    w, _ = _worker(path, DEEPFM, {"log_dir": str(tmp_path)}, local_ps_class, fields=13)
    w.begin_epoch(0, StandardDecay(0.1))
    w.run_steps(3, None)
    assert w.profile.summary is None and not list(tmp_path.glob("profile-*"))


@pytest.mark.parametrize("key", ["angel.worker.profile.updates", "angel.worker.profile.skip"])
def test_a_negative_count_is_refused_naming_the_key(key: str) -> None:
    with pytest.raises(ConfigError) as e:
        TrainPlan.from_config(load_config(None, {key: -1}, all_keys()))
    assert key in str(e.value) and "-1" in str(e.value)
