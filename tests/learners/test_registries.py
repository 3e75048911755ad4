"""Adding a model from outside the package: one file and one registration, trained on real Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from angelconf.config import ConfigError
from learners.job.learner import GraphLearner
from learners.models import registry
from learners.models.registry import ModelEntry, model_entry, register

ROOT = Path(__file__).resolve().parents[2]
TOY = ModelEntry(
    "ToyLinear",
    tables="tests.learners.toy_model:toy_tables",
    module_class="tests.learners.toy_model:ToyLinear",
    angel_classes=("com.example.ToyLinear",),
)


@pytest.fixture
def toy_registered():
    register(TOY)
    yield TOY
    registry.MODELS.pop(TOY.name)
    for alias in TOY.angel_classes:
        registry.ANGEL_CLASSES.pop(alias)


def test_a_registered_toy_model_trains_saves_and_predicts(
    toy_registered, ray_local, tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)  # the workers import the toy's module from the job's directory
    sets = {
        "ml.model.class.name": "com.example.ToyLinear",
        "ml.epoch.num": 2,
        "angel.log.path": str(tmp_path / "log"),
        "angel.save.model.path": str(tmp_path / "model"),
        "angel.job.name": "toy-model",
    }
    learner = GraphLearner.from_properties(ROOT / "conf" / "lr_a9a.properties", sets, quiet=True)
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    assert result.summary["valid_auc"] > 0.88  # as LogisticRegression on a9a
    assert {p.name for p in (tmp_path / "model").iterdir() if p.is_dir()} >= {
        "toy_weight",
        "toy_bias",
    }
    loaded = GraphLearner.load(str(tmp_path / "model"))
    try:
        pred = loaded.predict(str(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm"))
    finally:
        loaded.shutdown()
    values = next(iter(pred.values())) if isinstance(pred, dict) else pred
    assert len(values) > 1000 and ((values > 0) & (values < 1)).all()


def test_registering_a_taken_name_or_a_bad_task_is_refused(toy_registered):
    with pytest.raises(ValueError, match="'toylinear' is already registered"):
        register(ModelEntry("toylinear", "m:t", "m:C"))
    with pytest.raises(ValueError, match="task 'ranking' is not binary, multiclass or regression"):
        register(ModelEntry("Other", "m:t", "m:C", task="ranking"))
    assert model_entry("COM.EXAMPLE.TOYLINEAR") is TOY


def test_an_entry_whose_class_cannot_load_names_it():
    bad = ModelEntry("Broken", "tests.learners.toy_model:nope", "no.such.module:Model")
    with pytest.raises(ConfigError, match=r"cannot load tests\.learners\.toy_model:nope"):
        bad.table_function()
    with pytest.raises(ConfigError, match=r"cannot load no\.such\.module:Model"):
        bad.load_class()


# --- an optimizer added from outside the package ---------------------------------------------


@pytest.fixture
def toy_optimizer():
    import importlib

    from angelps.optimizers.registry import unregister

    mod = importlib.import_module("tests.learners.toy_optimizer")  # registers signsgd
    yield mod
    unregister("signsgd")
    import sys

    sys.modules.pop("tests.learners.toy_optimizer", None)


def test_a_registered_toy_optimizer_trains_on_the_shards(
    toy_optimizer, ray_local, tmp_path, monkeypatch
):
    import numpy as np

    from angelps.optim import apply
    from angelps.table import OptimizerSpec

    spec = OptimizerSpec("SignSGD")
    assert spec.impl == "tests.learners.toy_optimizer"  # what a shard imports to run it
    w = np.array([[1.0, 2.0]], np.float32)
    apply(spec, w, {}, np.array([[0.3, -5.0]], np.float32), 0.5)
    np.testing.assert_array_equal(w, [[0.5, 2.5]])

    monkeypatch.chdir(ROOT)
    sets = {
        "ml.inputlayer.optimizer": "SignSGD",
        "ml.learn.rate": 0.002,
        "ml.epoch.num": 1,
        "angel.log.path": str(tmp_path / "log"),
        "angel.save.model.path": str(tmp_path / "model"),
        "angel.job.name": "toy-optimizer",
    }
    learner = GraphLearner.from_properties(ROOT / "conf" / "lr_a9a.properties", sets, quiet=True)
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    assert result.summary["valid_auc"] > 0.85
    manifest = (tmp_path / "model" / "manifest.json").read_text()
    assert '"impl": "tests.learners.toy_optimizer"' in manifest


def test_an_unknown_optimizer_name_lists_the_registered_ones(toy_optimizer):
    from angelconf.config import load_config
    from learners.keys import all_keys

    with pytest.raises(
        ConfigError, match=r"ml\.embedding\.optimizer=Adamw is not valid: .*SignSGD"
    ):
        load_config(None, ["ml.embedding.optimizer=Adamw"], all_keys())
