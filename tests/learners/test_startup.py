"""Start-up lines and relative paths: learners.job.startup and learners.job.paths (no Ray)."""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path
from typing import Any

import pytest

from angelconf.config import load_config
from learners.cli import train as train_verb
from learners.job.paths import PATH_KEYS, absolute, absolute_paths
from learners.job.startup import Phases, plural
from learners.keys import all_keys


def test_phase_line_printed_when_the_phase_ends() -> None:
    out = io.StringIO()
    phases = Phases(out=out)
    with phases.phase("starting a private local Ray"):
        assert out.getvalue() == ""
    phases.done("launching 2 shards", 0.44)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("starting a private local Ray ... ")
    assert lines[0].endswith(" s")
    assert lines[1] == "launching 2 shards ... 0.4 s"
    assert list(phases.seconds) == ["starting a private local Ray", "launching 2 shards"]


def test_quiet_and_failed_phases_print_nothing() -> None:
    out = io.StringIO()
    with Phases(quiet=True, out=out).phase("x"):
        pass
    phases = Phases(out=out)
    with pytest.raises(RuntimeError), phases.phase("loading data on 1 worker"):
        raise RuntimeError("boom")
    assert out.getvalue() == ""
    assert phases.seconds == {}


def test_plural() -> None:
    assert plural(1, "worker") == "1 worker"
    assert plural(3, "shard") == "3 shards"


def test_absolute_keeps_urls_and_absolute_paths(tmp_path: Path) -> None:
    base = str(tmp_path)
    assert absolute("data/a.libsvm", base) == os.path.join(base, "data", "a.libsvm")
    assert absolute("./x/../y", base) == os.path.join(base, "y")
    assert absolute("/abs/path", base) == "/abs/path"
    assert absolute("s3://bucket/key", base) == "s3://bucket/key"
    assert absolute("~/m", base) == os.path.join(os.path.expanduser("~"), "m")


def test_absolute_paths_resolves_every_path_key_and_keeps_sources(tmp_path: Path) -> None:
    job = tmp_path / "job.properties"
    job.write_text(
        "angel.train.data.path = data/train.libsvm\n"
        "angel.save.model.path = runs/model\n"
        "angel.log.path = /already/absolute\n"
    )
    conf = load_config(
        job, ["angel.validate.data.path=v.libsvm", "angel.ps.backup.path=bk"], all_keys()
    )
    base = str(tmp_path / "cwd")
    out = absolute_paths(conf, base)
    assert out["angel.train.data.path"] == os.path.join(base, "data", "train.libsvm")
    assert out["angel.save.model.path"] == os.path.join(base, "runs", "model")
    assert out["angel.validate.data.path"] == os.path.join(base, "v.libsvm")
    assert out["angel.ps.backup.path"] == os.path.join(base, "bk")
    assert out["angel.log.path"] == "/already/absolute"
    assert out["angel.load.model.path"] is None  # unset stays unset
    assert out.source("angel.train.data.path") == f"{job}:1"
    assert out.source("angel.validate.data.path") == conf.source("angel.validate.data.path")
    assert not out.is_set("angel.load.model.path")
    # every other key unchanged
    assert {k: out[k] for k in out if k not in PATH_KEYS} == {
        k: conf[k] for k in conf if k not in PATH_KEYS
    }
    assert absolute_paths(out, base) is out  # nothing left to resolve


def test_train_verb_hands_the_learner_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What reaches GraphLearner (and from it every actor) is resolved against the command's
    directory, before any actor starts."""
    seen: dict[str, Any] = {}

    class Spy:
        def __init__(self, conf: Any, address: str | None = None) -> None:
            seen["conf"] = conf

        def train(self, resume: bool = False) -> Any:
            raise KeyboardInterrupt  # stop before anything would run

        def shutdown(self) -> None:
            seen["shutdown"] = True

    import learners.job.learner

    monkeypatch.setattr(learners.job.learner, "GraphLearner", Spy)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.libsvm").write_text("1 1:1\n")
    args = argparse.Namespace(
        conf=None,
        set=["angel.train.data.path=data/t.libsvm", "angel.save.model.path=out/m"],
        address=None,
        summary_json=None,
        resume=False,
    )
    with pytest.raises(KeyboardInterrupt):
        train_verb._train(args)
    conf = seen["conf"]
    assert conf["angel.train.data.path"] == str(tmp_path / "data" / "t.libsvm")
    assert conf["angel.save.model.path"] == str(tmp_path / "out" / "m")
    assert seen["shutdown"]
