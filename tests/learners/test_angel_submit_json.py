"""Angel's documented submit commands with their JSON graph (``angel.ml.conf`` and the
AngelModel class), run unchanged through ``angelps submit``: the resource and runtime keys of
the docs' commands as written, Angel's JSON examples (tests/data/angel_json/), our data paths
and one epoch on a slice of the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
JSONS = ROOT / "tests" / "data" / "angel_json"
ANGEL_MODEL = "com.tencent.angel.ml.core.graphsubmit.AngelModel"
ROWS = 1500


def _slice(tmp: Path, src: str) -> Path:
    lines = (ROOT / "data" / src).read_text().splitlines(keepends=True)
    out = tmp / Path(src).name
    out.write_text("".join(lines[:ROWS]))
    return out


@pytest.mark.parametrize(
    ("graph", "data", "auc"),
    [
        pytest.param("lr.json", "a9a/a9a_123d_train.libsvm", 0.8, marks=pytest.mark.slow),
        pytest.param("fm.json", "census/census_148d_train.dummy", 0.75, marks=pytest.mark.slow),
        ("deepfm.json", "census/census_148d_train.dummy", 0.75),
        pytest.param(
            "wideanddeep.json", "census/census_148d_train.dummy", 0.7, marks=pytest.mark.slow
        ),
    ],
)
def test_a_documented_json_job_runs_unchanged(graph, data, auc, ray_local, tmp_path, capsys):
    name = graph.removesuffix(".json")
    argv = [
        "--angel.job.name", name,
        "--action.type", "train",
        "--angel.app.submit.class", "com.tencent.angel.ml.core.graphsubmit.GraphRunner",
        "--angel.train.data.path", str(_slice(tmp_path, data)),
        "--angel.save.model.path", str(tmp_path / "model"),
        "--angel.log.path", str(tmp_path / "log"),
        "--ml.model.class.name", ANGEL_MODEL,
        "--angel.ml.conf", str(JSONS / graph),
        "--ml.epoch.num", "1",
        "--angel.workergroup.number", "1",
        "--angel.worker.memory.gb", "2",
        "--angel.worker.task.number", "1",
        "--angel.ps.number", "1",
        "--angel.ps.memory.gb", "1",
        "--angel.output.path.deleteonexist", "true",
        "--angel.task.data.storage.level", "memory",
        "--angel.task.memorystorage.max.gb", "1",
        "--angel.worker.env", "LD_PRELOAD=./libopenblas.so",
    ]  # fmt: skip
    out = tmp_path / "summary.json"
    assert main(["submit", *argv, "--summary-json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    s = json.loads(out.read_text())
    assert s["model"] == "AngelModel" and s["epochs"] == 1 and s["valid_auc"] > auc, s
