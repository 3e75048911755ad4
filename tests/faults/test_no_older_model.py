"""Fault matrix: a checkpoint without its manifest is never replaced by an older model silently.

On a real local Ray: LogisticRegression trains two epochs on a slice of a9a (``model`` holds
epoch 1, ``model.prev`` epoch 0). With ``model/manifest.json`` removed, or ``model`` gone (a
save stopped between its renames), every reader (evaluate, predict, export, ``GraphLearner.load``,
``angel.load.model.path``) refuses it with exit 2 and one line naming the path and the hint to
pass ``model.prev`` explicitly; passing it works; ``train --resume`` falls back to it and says so.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from angelconf.config import ConfigError
from learners.cli.main import main
from learners.job.learner import GraphLearner

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")
_LOAD = "angel.load.model.path"

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, ray_local):
    """(directory, data file) of a 2-epoch run with checkpoints model, model.prev."""
    d = tmp_path_factory.mktemp("older")
    data = d / "a9a.libsvm"
    with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
        data.write_text("".join(next(f) for _ in range(2000)))
    learner = GraphLearner.from_properties(CONF, _sets(d, data, 2), quiet=True)
    try:
        learner.train()
    finally:
        learner.shutdown()
    return d, data


def _sets(d: Path, data: Path, epochs: int) -> dict[str, object]:
    return {
        "angel.train.data.path": str(data),
        "angel.save.model.path": str(d / "model"),
        "angel.log.path": str(d / "log"),
        "angel.job.name": "older",
        "ml.epoch.num": epochs,
    }


def _copy(trained, tmp_path: Path, how: str) -> Path:
    for name in ("model", "model.prev"):
        shutil.copytree(trained[0] / name, tmp_path / name)
    model = tmp_path / "model"
    if how == "no-manifest":
        (model / "manifest.json").unlink()
    else:  # a save stopped between its renames: model renamed to model.prev, nothing at model
        shutil.rmtree(tmp_path / "model.prev")
        os.rename(model, tmp_path / "model.prev")
    return model


def _models(d: Path) -> list[str]:
    return sorted(p for p in os.listdir(d) if p.startswith("model"))


def _epoch(model: Path) -> int:
    return json.loads((model / "manifest.json").read_text())["extra"]["learner"]["epoch"]


def _hint(model: Path) -> str:
    prev = f"{model}.prev"
    return (
        f"; an older checkpoint is at {prev}: pass {prev} explicitly to use it "
        "(train --resume falls back to it by itself and says so)"
    )


def _refusal(model: Path, how: str, hint: bool = True) -> str:
    what = (
        f"{model} is not a checkpoint: it has no manifest.json"
        if how == "no-manifest"
        else f"no checkpoint at {model}"
    )
    return what + (_hint(model) if hint else "")


@pytest.mark.parametrize("how", ["no-manifest", "mid-commit"])
def test_every_reader_refuses_a_checkpoint_without_its_manifest(trained, tmp_path, capsys, how):
    model = _copy(trained, tmp_path, how)
    before = _models(tmp_path)
    data = str(trained[1])
    verbs = {
        "evaluate": ["evaluate", "--model", str(model), "--input", data],
        "predict": ["predict", "--model", str(model), "--input", data, "--out", "p.csv"],
        "export": ["export", "--model", str(model), "--out", str(tmp_path / "m.pt")],
    }
    for verb, args in verbs.items():
        if verb == "predict":
            args[-1] = str(tmp_path / "p.csv")
        assert main(args) == 2, verb
        err = capsys.readouterr().err
        if how == "mid-commit" and verb != "export":
            want = f"{_LOAD}={model} (--model): no saved model there (no such directory)"
        elif how == "mid-commit":
            want = f"--model {model}: no saved model there (no such directory)"
        else:
            want = _refusal(model, how, hint=False)
        assert err == f"angelps: error: {want}{_hint(model)}\n", verb
    with pytest.raises(ConfigError) as e:
        GraphLearner.load(str(model))
    assert str(e.value) == _refusal(model, how)
    # angel.load.model.path (warm start) refuses it too, before a step is taken.
    args = ["train", "--conf", CONF]
    sets = {**_sets(tmp_path, trained[1], 1), "angel.save.model.path": str(tmp_path / "new")}
    sets["angel.load.model.path"] = str(model)
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    assert main(args) == 2
    assert capsys.readouterr().err.endswith(f"{_hint(model)}\n")
    assert _models(tmp_path) == before  # nothing written, nothing moved
    assert not (tmp_path / "new").exists()
    # Asked for explicitly, the older model is read.
    assert main(["evaluate", "--model", f"{model}.prev", "--input", data]) == 0


@pytest.mark.slow
def test_resume_falls_back_to_prev_and_says_so(trained, tmp_path, capsys):
    model = _copy(trained, tmp_path, "mid-commit")  # model.prev: epoch 1's checkpoint
    args = ["train", "--conf", CONF, "--resume"]
    for k, v in _sets(tmp_path, trained[1], 3).items():
        args += ["--set", f"{k}={v}"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"angelps: note: resuming from {model}.prev (the latest save did not complete)\n" in err
    assert (_epoch(model), _epoch(tmp_path / "model.prev")) == (2, 1)  # epoch 2 trained
