"""What ``GraphLearner(...)`` takes: a Config, a mapping of keys, or a job file's path (as the
CLI's --conf); anything else is refused by name. Nothing here starts Ray (the learner starts
it when it first trains, predicts or evaluates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from angelconf.config import ConfigError
from learners.job.learner import GraphLearner

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "conf" / "lr_a9a.properties"


@pytest.mark.parametrize("path", [str(JOB), JOB], ids=["str", "Path"])
def test_a_job_files_path_is_loaded_as_the_cli_loads_it(path: str | Path) -> None:
    learner = GraphLearner(path, quiet=True)
    assert learner.conf.source("ml.learn.rate").startswith(f"{JOB}:")
    assert (
        learner.conf["ml.learn.rate"]
        == GraphLearner.from_properties(JOB, quiet=True).conf["ml.learn.rate"]
    )


def test_a_missing_job_file_is_named() -> None:
    # (a str was taken as a mapping: "dictionary update sequence element #0 has length 1")
    with pytest.raises(ConfigError, match=r"^configuration file nope\.properties does not exist$"):
        GraphLearner("nope.properties")


def test_anything_else_says_what_is_taken() -> None:
    with pytest.raises(TypeError) as e:
        GraphLearner(42)  # type: ignore[arg-type]
    assert str(e.value) == (
        "GraphLearner: expected a Config, a mapping of keys to values or the path of a "
        ".properties file, got int"
    )


def test_save_after_a_failed_train_says_that_train_failed(tmp_path: Path) -> None:
    learner = GraphLearner({"angel.train.data.path": str(tmp_path / "none.libsvm")}, quiet=True)
    with pytest.raises(ConfigError, match="does not exist"):
        learner.train()  # (refused before Ray starts)
    with pytest.raises(RuntimeError) as e:
        learner.save(tmp_path / "m")
    assert str(e.value) == (
        "save(): the last train() failed (ConfigError); nothing to save: fix its cause and "
        "train again, or load a checkpoint"
    )
    assert not (tmp_path / "m").exists()
