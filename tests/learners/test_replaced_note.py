"""Training afresh where another model's checkpoint is says that it will be replaced (Angel's
angel.output.path.deleteonexist, true by default), before it is: it was replaced silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _train(conf: str, tmp_path: Path) -> list[str]:
    argv = ["train", "--conf", str(ROOT / f"conf/{conf}.properties"), "--set", "ml.epoch.num=1"]
    argv += ["--set", f"angel.save.model.path={tmp_path / 'model'}"]
    argv += ["--set", f"angel.log.path={tmp_path / 'log'}"]
    return argv


def test_a_checkpoint_of_another_model_is_said_to_be_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_train("fm_census", tmp_path)) == 0
    capsys.readouterr()
    assert main(_train("lr_census", tmp_path)) == 0
    model = tmp_path / "model"
    assert (
        f"angelps: note: {model} holds a FactorizationMachines checkpoint (epoch 1); this "
        f"LogisticRegression job replaces it at its first save (kept as {model}.prev until the "
        f"save after; its best epoch's, {model}.best, is replaced too). To keep it, stop and set "
        "angel.save.model.path to another folder, or angel.output.path.deleteonexist=false\n"
    ) in capsys.readouterr().err
    assert main(_train("lr_census", tmp_path)) == 0  # the same model: nothing to say
    assert "holds a" not in capsys.readouterr().err
