"""Angel's documented JSON graphs trained on Angel's data, on a local Ray.

Each JSON of tests/data/angel_json/ (as Angel's docs publish it; the data path comes from the
job, as with angel-submit) trains here and reaches the validation AUC of the built-in model of
the same name trained with the keys the JSON sets (same data, epochs and seed), to 0.002. A
graph model trains, checkpoints, resumes, predicts and evaluates like a built-in one, the saved
model carrying its graph (no JSON needed to predict).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv
import pytest

from angelconf.config import Config, load_config
from learners.cli.main import main
from learners.job.learner import GraphLearner
from learners.keys import all_keys
from learners.models.angel_json import apply_angel_json

ROOT = Path(__file__).resolve().parents[2]
JSONS = ROOT / "tests" / "data" / "angel_json"
CENSUS = ROOT / "data" / "census" / "census_148d_train.dummy"
A9A = ROOT / "data" / "a9a" / "a9a_123d_train.libsvm"
_SLOW = pytest.mark.slow


def _auc(conf: Config) -> float:
    learner = GraphLearner(conf, quiet=True)
    try:
        return float(learner.train().history[-1]["valid_auc"])
    finally:
        learner.shutdown()


@pytest.mark.parametrize(
    ("json_name", "data", "builtin", "extra", "builtin_keys"),
    [
        # lr.json: 10 epochs of 200 updates (Angel's criteo job); 2 here keep the test short
        pytest.param(
            "lr.json", A9A, "LogisticRegression", {"ml.epoch.num": 2}, {}, marks=_SLOW, id="lr"
        ),
        pytest.param("fm.json", CENSUS, "FactorizationMachines", {}, {}, marks=_SLOW, id="fm"),
        # deepfm.json regularises its embedding alone (reg2 0.01); the built-in model has one
        # ml.reg.l2 for every table, its closest equivalent
        pytest.param(
            "deepfm.json",
            CENSUS,
            "DeepFM",
            {},
            {"ml.model.hidden.layers": "100,100", "ml.reg.l2": 0.01},
            id="deepfm",
        ),
        pytest.param(
            "wideanddeep.json",
            CENSUS,
            "WideAndDeep",
            {},
            {"ml.model.hidden.layers": "100,100"},
            marks=_SLOW,
            id="wideanddeep",
        ),
    ],
)
def test_a_documented_json_reaches_the_built_in_models_auc(
    ray_local, tmp_path, json_name, data, builtin, extra, builtin_keys
) -> None:
    job: dict[str, Any] = {
        "angel.train.data.path": str(data),
        "angel.log.path": str(tmp_path / "log"),
        **extra,
    }
    graph = apply_angel_json(
        load_config(None, {**job, "angel.ml.conf": str(JSONS / json_name)}, all_keys())
    )
    assert graph["ml.model.class.name"] == "AngelModel"
    # The built-in model: every key the JSON set, the network named by its class instead.
    keys = {k: graph[k] for k in graph if graph.is_set(k)}
    for k in ("angel.ml.conf", "ml.model.graph"):
        keys.pop(k)
    keys.update({"ml.model.class.name": builtin, **builtin_keys})
    auc_graph, auc_builtin = _auc(graph), _auc(load_config(None, keys, all_keys()))
    assert auc_graph > 0.85
    assert abs(auc_graph - auc_builtin) <= 0.002, (auc_graph, auc_builtin)


def test_a_graph_model_trains_resumes_predicts_and_evaluates(
    ray_local, tmp_path, monkeypatch, capfd
) -> None:
    """Angel's DeepFM JSON named by a relative path in a job file, as Angel's submit names it."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(JSONS / "deepfm.json", tmp_path / "deepfm.json")
    lines = CENSUS.read_text().splitlines(keepends=True)
    (tmp_path / "census.dummy").write_text("".join(lines[:6000]))
    (tmp_path / "job.properties").write_text(
        "ml.model.class.name = com.tencent.angel.ml.core.graphsubmit.AngelModel\n"
        "angel.ml.conf = deepfm.json\n"
        "angel.train.data.path = census.dummy\n"
        "angel.save.model.path = model\nangel.log.path = log\n"
    )
    train = ["train", "--conf", "job.properties", "--summary-json", "s.json"]
    assert main([*train, "--ml.epoch.num", "2"]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["checkpoint_epoch"] == 2
    capfd.readouterr()
    assert main([*train, "--ml.epoch.num", "3", "--resume"]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert (summary["model"], summary["checkpoint_epoch"]) == ("AngelModel", 3)
    out = capfd.readouterr().out
    assert "epoch 3/3" in out and "epoch 1/3" not in out  # resumed after epoch 2
    # Prediction and evaluation from the saved model alone: its graph travels with it.
    (tmp_path / "deepfm.json").unlink()
    base = ["--model", "model", "--input", "census.dummy"]
    assert main(["predict", *base, "--out", "pred.csv"]) == 0
    table = pacsv.read_csv(tmp_path / "pred.csv")
    assert table.num_rows == 6000
    pred = table.column("pred").to_numpy()
    assert ((pred > 0) & (pred < 1)).all()
    assert main(["evaluate", *base, "--json"]) == 0
    metrics = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert metrics["valid_auc"] > 0.85


@pytest.mark.slow
def test_the_driver_of_a_json_job_never_loads_torch(tmp_path) -> None:
    """As tests/test_layering.py for a built-in model: a whole job on a private Ray, in a fresh
    interpreter; the graph's tables come from its description, the torch module only on the
    workers."""
    code = (
        "import sys\n"
        "from learners.cli.main import main\n"
        "rc = main(['submit', '--angel.ml.conf', 'tests/data/angel_json/deepfm.json',\n"
        f"           '--angel.train.data.path', '{CENSUS}', '--ml.epoch.num', '1',\n"
        f"           '--angel.log.path', '{tmp_path}'])\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout[-2000:] + out.stderr[-2000:]


@pytest.mark.slow
def test_a_custom_graph_trains(ray_local, tmp_path) -> None:
    """Layers composed as no built-in model composes them, with a per-layer optimizer."""
    doc = {
        "data": {"format": "dummy", "indexrange": 148, "numfield": 13, "validateratio": 0.1},
        "train": {"epoch": 3, "numupdateperepoch": 40, "lr": 0.01},
        "default_optimizer": "adam",
        "default_transfunc": "relu",
        "layers": [
            {"name": "wide", "type": "SimpleInputLayer", "outputdim": 1, "transfunc": "identity"},
            {"name": "emb", "type": "Embedding", "numfactors": 8, "outputdim": 104},
            {"name": "fm", "type": "BiInnerSumCross", "inputlayer": "emb", "outputdim": 1},
            {"name": "bi", "type": "BiInteractionCross", "inputlayer": "emb", "outputdim": 8},
            {"name": "pairs", "type": "BiInnerCross", "inputlayer": "emb", "outputdim": 78},
            {"name": "cat", "type": "ConcatLayer", "inputlayers": ["emb", "bi", "pairs"]},
            {
                "name": "mlp",
                "type": "FCLayer",
                "inputlayer": "cat",
                "outputdims": [64, 1],
                "transfuncs": ["relu", "identity"],
                "optimizer": {"type": "adam", "gamma": 0.999},
            },
            {"name": "sum", "type": "SumPooling", "inputlayers": ["wide", "fm", "mlp"]},
            {"name": "loss", "type": "SimpleLossLayer", "inputlayer": "sum"},
        ],
    }
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(doc))
    keys = {
        "angel.ml.conf": str(path),
        "angel.train.data.path": str(CENSUS),
        "angel.log.path": str(tmp_path / "log"),
    }
    assert _auc(apply_angel_json(load_config(None, keys, all_keys()))) > 0.89
