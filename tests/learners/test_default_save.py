"""Safe saving by default: a job with no angel.save.model.path saves into its run folder and
keeps its best epoch's checkpoint when it validates; angel.save.model=false saves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _train(tmp_path: Path, **sets: object) -> dict:
    from learners.job.learner import GraphLearner

    data = tmp_path / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(1500)))
    base = {
        "angel.train.data.path": str(data),
        "angel.log.path": str(tmp_path / "runs"),
        "angel.job.name": "safe",
        "angel.save.model.path": "",  # not the job file's: the default applies
        "ml.epoch.num": 2,
        # logloss: the best epoch need not be the last
        "ml.early.stop.metric": "valid_logloss",
    }
    learner = GraphLearner.from_properties(
        ROOT / "conf" / "lr_a9a.properties", {**base, **sets}, quiet=True
    )
    try:
        return learner.train().summary
    finally:
        learner.shutdown()


@pytest.mark.usefixtures("ray_local")
def test_a_job_saves_into_its_run_folder_and_keeps_the_best_epoch(tmp_path, capsys) -> None:
    from learners.runs.run_log import done_line

    s = _train(tmp_path)
    run = Path(s["run_dir"])
    assert s["checkpoint"] == str(run / "model") and s["checkpoint_epoch"] == 2
    assert (run / "model" / "manifest.json").is_file()
    assert s["best_checkpoint"] == str(run / "model.best")
    assert (run / "model.best" / "manifest.json").is_file()
    # the run's resolved configuration beside it
    assert (
        "# program\nml.early.stop.metric = valid_logloss\n"
        in (run / "config.properties").read_text()
    )
    line = done_line(s)
    assert f"(valid_logloss {s['best_value']:.4f}) at {run / 'model.best'}; " in line
    assert line.endswith(f"; checkpoint {run / 'model'} (epoch 2); run {run}")


@pytest.mark.usefixtures("ray_local")
def test_save_model_false_saves_nothing(tmp_path) -> None:
    from learners.runs.run_log import done_line

    s = _train(tmp_path, **{"angel.save.model": "false"})
    assert s["checkpoint"] is None and s["best_checkpoint"] is None
    assert not (Path(s["run_dir"]) / "model").exists()
    assert done_line(s).endswith(f"; no model saved; run {s['run_dir']}")
