"""A warm start from a model that is not there names the key that pointed at it, and stops
before Ray starts (it was said after the start-up, naming only the path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_model_to_start_from_is_said_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    none = tmp_path / "none"
    sets = {
        "angel.load.model.path": none,
        "angel.save.model.path": tmp_path / "model",
        "angel.log.path": tmp_path / "log",
    }
    argv = ["train", "--conf", str(ROOT / "conf/lr_a9a.properties")]
    argv += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        f"angelps: error: angel.load.model.path={none} (command line): no checkpoint at {none}\n"
    ), err
    assert "starting a private local Ray" not in err
    assert not (tmp_path / "log").exists()
