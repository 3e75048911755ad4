"""A schedule's (or the watched metric's) bad name or value in a train job is bad input: exit 2 before Ray starts, with
the key, the value and where it was set (it was a failure while running, exit 1, naming no
file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job(tmp_path: Path) -> Path:
    conf = tmp_path / "job.properties"
    conf.write_text(
        f"angel.train.data.path = {ROOT / 'data/a9a/a9a_123d_train.libsvm'}\n"
        "ml.data.type = libsvm\nml.feature.index.range = 123\nml.epoch.num = 1\n"
        f"angel.save.model.path = {tmp_path / 'model'}\nangel.log.path = {tmp_path / 'log'}\n"
    )
    return conf


@pytest.mark.parametrize(
    ("line", "sets", "said"),
    [
        (
            "ml.opt.decay.class.name = StandardDecy",
            [],
            "ml.opt.decay.class.name=StandardDecy (job.properties:7): unknown schedule; "
            "valid names (closest first): StandardDecay, ",
        ),
        ("", ["ml.opt.decay.class.name=StepLR"], "StepLR: ml.opt.decay.step.size is required"),
        (
            "ml.opt.decay.class.name = MultiStepLR",
            ["ml.opt.decay.milestones=5,2"],
            "MultiStepLR: ml.opt.decay.milestones=5,2 is not valid: expected a strictly "
            "increasing list of integers >= 0 (set in command line)",
        ),
        ("ml.learn.rate =", [], "job.properties:7: ml.learn.rate has no value; give one"),
        (  # (found only by early stopping or a plateau after an epoch; by nothing at patience 0)
            "ml.early.stop.metric = aucc",
            [],
            "ml.early.stop.metric=aucc (job.properties:7): this model reports no valid_aucc; "
            "valid names: valid_accuracy, valid_auc, valid_count, valid_false_recall, ",
        ),
    ],
)
def test_a_bad_schedule_stops_the_job_before_it_starts(
    job: Path, capsys: pytest.CaptureFixture[str], line: str, sets: list[str], said: str
) -> None:
    job.write_text(job.read_text() + line + "\n")
    argv = ["train", "--conf", str(job)] + [a for s in sets for a in ("--set", s)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"angelps: error: {said}".replace("job.properties", str(job)) in err, err
    assert not (job.parent / "log").exists()  # nothing started
