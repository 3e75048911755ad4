"""Bad input: a training input with no rows says so (exit 2), not "lower angel.workergroup.number"."""

from __future__ import annotations

from pathlib import Path

import pytest

from angelconf.config import ConfigError, load_config
from learners.cli.main import main
from learners.job.job_size import JobSize
from learners.job.loop_options import TrainPlan
from learners.keys import all_keys


def _summary(train: int, valid: int) -> dict[str, object]:
    part = {"rows": train, "nnz": 0, "max_id": -1, "min_nnz": 0, "max_nnz": 0}
    return {"train": part, "valid": {**part, "rows": valid}, "skipped_lines": 0}


def test_no_training_rows_names_the_input_not_the_worker_count() -> None:
    plan = TrainPlan.from_config(load_config(None, {}, all_keys()))
    with pytest.raises(ConfigError) as e:
        JobSize.of_parts(plan, [_summary(0, 0), _summary(0, 0)], -1, -1)
    assert str(e.value) == (
        "angel.train.data.path: the training input has no rows (its lines are all blank)"
    )
    with pytest.raises(ConfigError) as e:
        JobSize.of_parts(plan, [_summary(0, 1)], -1, -1)
    assert str(e.value) == (
        "angel.train.data.path: the training input has no rows left for training (its 1 "
        "row(s) all went to validation: ml.data.validate.ratio)"
    )


@pytest.mark.slow  # starts a private Ray
def test_train_on_blank_lines_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "blank.libsvm"
    data.write_text("\n\n   \n")
    conf = tmp_path / "job.properties"
    conf.write_text(
        f"angel.train.data.path = {data}\nml.data.type = libsvm\nml.model.class.name = "
        f"LogisticRegression\nangel.log.path = {tmp_path / 'log'}\n"
    )
    args = ["train", "--conf", str(conf)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        "angelps: error: angel.train.data.path: the training input has no rows (its lines are "
        "all blank)\n"
    ), err
    assert "lower angel.workergroup.number" not in err
