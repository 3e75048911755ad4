"""A warning for every relative path key when the job runs on a Ray cluster (--address,
RAY_ADDRESS, ray job submit): such paths mean the driver's directory only."""

from __future__ import annotations

import os

import pytest

from angelconf.config import load_config
from learners.job.paths import relative_notes
from learners.keys import all_keys

SETS = {
    "angel.train.data.path": "data/a9a.libsvm",
    "angel.save.model.path": "models/lr",
    "angel.predict.out.path": "/abs/pred.csv",
    "angel.load.model.path": "s3://bucket/model",
}


def test_every_relative_path_key_is_named_under_an_address(monkeypatch) -> None:
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    conf = load_config(None, SETS, all_keys())
    assert relative_notes(conf, None) == []  # a private local Ray: one machine
    notes = relative_notes(conf, "ray://head:10001")
    tail = (
        f" is relative to {os.getcwd()} on this machine; actors on other nodes do not see it: "
        "give an absolute path on a shared file system, or a URL"
    )
    assert notes == [
        f"angelps: note: angel.train.data.path=data/a9a.libsvm (program){tail}",
        f"angelps: note: angel.save.model.path=models/lr (program){tail}",
        f"angelps: note: angel.log.path (unset: runs){tail}",
    ]
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert relative_notes(conf, None) == notes


def test_under_ray_job_submit_the_working_directory_is_named(monkeypatch) -> None:
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    conf = load_config(None, SETS, all_keys())
    notes = relative_notes(conf, None)
    assert [n.split(" is relative")[0] for n in notes] == [
        "angelps: note: angel.train.data.path=data/a9a.libsvm (program)",
        "angelps: note: angel.save.model.path=models/lr (program)",
    ]
    assert "the working directory Ray made for this job (deleted with it)" in notes[0]


@pytest.mark.parametrize("verb", ["train", "predict"])
def test_the_command_line_prints_them(verb, monkeypatch, capsys, tmp_path) -> None:
    from learners.cli.main import main

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = [verb, "--address", "ray://nowhere:1", "--angel.save.model.path", "m"]
    argv += ["--conf", os.devnull] if verb == "train" else []
    assert main(argv) == 2  # (no data: refused after the notes, before any Ray)
    err = capsys.readouterr().err
    assert "angelps: note: angel.save.model.path=m (command line) is relative to " in err
