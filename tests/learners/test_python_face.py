"""The Python face: ``GraphLearner.load(path)``, predict/evaluate on paths, pyarrow Tables,
pandas DataFrames and numpy arrays, with the metric names training uses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import ray

from angelconf.config import ConfigError
from learners import GraphLearner
from learners.data.problems import DataError
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]
ROWS = 800


def _lr(data: str, out: Path, name: str, epochs: int) -> GraphLearner:
    """conf/lr_a9a.properties on ``data``, its checkpoint and runs under ``out``."""
    return GraphLearner.from_properties(
        ROOT / "conf" / "lr_a9a.properties",
        {
            "angel.train.data.path": data,
            "ml.epoch.num": epochs,
            "angel.save.model.path": str(out / "model"),
            "angel.log.path": str(out / "log"),
            "angel.job.name": name,
        },
        quiet=True,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """LR trained on a slice of a9a and saved; the slice as a file and as parsed rows."""
    tmp = tmp_path_factory.mktemp("face")
    ray_tmp = short_tmp()  # (Ray's socket paths stay under 107 bytes)
    ray.init(
        num_cpus=2,
        resources={"infer": 1},  # for the placement test
        include_dashboard=False,
        _temp_dir=ray_tmp,
        namespace="angelps",
    )
    lines = (ROOT / "data/a9a/a9a_123d_train.libsvm").read_text().splitlines()[:ROWS]
    data = tmp / "a9a.libsvm"
    data.write_text("\n".join(lines) + "\n")
    learner = _lr(str(data), tmp, "face", epochs=2)
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    rows = [line.split() for line in lines]
    labels = np.array([float(r[0]) for r in rows])
    ids = [[int(t.split(":")[0]) - 1 for t in r[1:]] for r in rows]
    values = [[float(t.split(":")[1]) for t in r[1:]] for r in rows]
    dense = np.zeros((ROWS, 123))
    for i, (row_ids, row_values) in enumerate(zip(ids, values, strict=True)):
        dense[i, row_ids] = row_values
    yield {
        "model": tmp / "model",
        "data": str(data),
        "summary": result.summary,
        "labels": labels,
        "ids": ids,
        "values": values,
        "dense": dense,
    }
    ray.shutdown()
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_second_train_is_refused_and_the_model_stays_usable(trained, tmp_path) -> None:
    # (it used to start the shards again under the same names: "is already taken ... is a job
    # with angel.job.name='...' still running?", and left the learner unable to predict or save)
    learner = _lr(trained["data"], tmp_path, "twice", epochs=1)
    try:
        learner.train()
        runs = sorted(p.name for p in (tmp_path / "log").iterdir())
        with pytest.raises(RuntimeError) as e:
            learner.train()
        assert str(e.value) == (
            "train(): this learner already holds a trained or loaded model (predict, evaluate "
            "and save use it); to train again from the start call shutdown() first; to train on "
            "from it, save() it and train a learner with angel.load.model.path set to that path"
        )
        assert sorted(p.name for p in (tmp_path / "log").iterdir()) == runs  # nothing started
        assert learner.evaluate(trained["data"])["valid_auc"] > 0.8
        learner.save(tmp_path / "again")
        assert (tmp_path / "again" / "manifest.json").is_file()
    finally:
        learner.shutdown()
    learner.train()  # after shutdown(): a new job from the start
    learner.shutdown()


def _features(path: str) -> list[list[str]]:
    """The lines of a libsvm file without their labels."""
    return [line.split()[1:] for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_load_is_a_class_method_and_every_input_kind_agrees(trained) -> None:
    learner = GraphLearner.load(trained["model"])
    try:
        from_file = learner.predict(trained["data"])
        table = pa.table(
            {"label": trained["labels"], "ids": trained["ids"], "values": trained["values"]}
        )
        from_table = learner.predict(table)
        table_rows = learner.predict_rows(table)
        from_frame = learner.predict(table.to_pandas())
        from_array = learner.predict(trained["dense"])
        unlabelled = learner.predict(table.drop_columns(["label"]))
        metrics_file = learner.evaluate(trained["data"])
        metrics_array = learner.evaluate(trained["dense"], labels=trained["labels"])
        metrics_frame = learner.evaluate(pd.DataFrame(table.to_pydict()))
        with pytest.raises(ConfigError, match="evaluation needs labels"):
            learner.evaluate(trained["dense"])
        with pytest.raises(DataError, match="labels: 3 labels for 800 rows"):
            learner.predict(trained["dense"], labels=[1, 0, 1])
    finally:
        learner.shutdown()
    bare = Path(trained["data"]).with_suffix(".nolabel")
    bare.write_text("".join(" ".join(r) + "\n" for r in _features(trained["data"])))
    with GraphLearner.load(trained["model"], {"ml.data.has.label": False}) as learner:
        from_bare = learner.predict(bare)
    pred = from_file
    assert isinstance(pred, np.ndarray) and pred.shape == (ROWS,)
    np.testing.assert_allclose(from_bare, pred, rtol=1e-6)
    # a DataFrame in, a DataFrame out: its index and a pred column
    assert isinstance(from_frame, pd.DataFrame) and list(from_frame.columns) == ["pred"]
    assert from_frame.index.equals(table.to_pandas().index)
    for other in (from_table, from_frame["pred"].to_numpy(), from_array, unlabelled):
        np.testing.assert_allclose(other, pred, rtol=1e-6)
    # the labels as given (a -1/+1 column stays -1/+1), with predict_rows
    np.testing.assert_array_equal(table_rows["label"], trained["labels"].astype(np.float32))
    # The names training uses, the same values whichever way the rows came.
    assert {"valid_auc", "valid_logloss", "valid_accuracy", "valid_rows"} <= set(metrics_file)
    assert metrics_file["valid_rows"] == ROWS
    for other in (metrics_array, metrics_frame):
        assert set(other) == set(metrics_file)
        assert other["valid_auc"] == pytest.approx(metrics_file["valid_auc"], rel=1e-9)
    assert set(metrics_file) & set(trained["summary"]) >= {"valid_auc", "valid_logloss"}


@pytest.mark.slow
def test_a_loaded_model_is_placed_as_the_keys_say(trained) -> None:
    """angel.worker.resources and angel.placement.strategy hold for load() as for train()."""
    from ray.util import placement_group_table

    def groups() -> list[str]:
        return [g["state"] for g in placement_group_table().values() if g["state"] != "REMOVED"]

    sets = {"angel.worker.resources": "infer:1", "angel.placement.strategy": "pack"}
    with GraphLearner.load(trained["model"], sets) as learner:
        assert ray.available_resources().get("infer", 0) == 0  # the worker holds it
        assert groups() == ["CREATED"]
        pred = learner.predict(trained["data"])
    assert groups() == []
    assert pred.shape == (ROWS,)
    with pytest.raises(ConfigError, match=r"angel\.worker\.resources"):
        GraphLearner.load(trained["model"], {"angel.worker.resources": "infer:2"})


def test_inputs_follow_the_parquet_column_conventions() -> None:
    from learners.data import DataOptions
    from learners.job.predict_inputs import to_batch

    opts = DataOptions(label_trans="PosNegTrans")
    b = to_batch(pa.table({"label": [0.0, 1.0], "ids": [[3, 1], []]}), opts)
    assert b.indptr.tolist() == [0, 2, 2] and b.ids.tolist() == [3, 1]
    assert b.values.tolist() == [1.0, 1.0]  # no values column: every value is 1
    assert b.labels.tolist() == [-1.0, 1.0]  # the job's label transform applies
    d = to_batch(np.array([[0.0, 2.5, 0.0], [1.0, 0.0, 0.0]]), DataOptions(), labels=[1, 0])
    assert d.ids.tolist() == [1, 0] and d.values.tolist() == [2.5, 1.0]
    assert d.labels.tolist() == [1.0, 0.0] and d.row_index.tolist() == [0, 1]
    with pytest.raises(DataError, match="no column ids"):
        to_batch(pa.table({"x": [1]}), DataOptions())
    with pytest.raises(DataError, match=r"table: row 0: a feature id is negative"):
        to_batch(pa.table({"ids": [[-1]]}), DataOptions())
    with pytest.raises(DataError, match="numpy input: row 1: a value is not finite"):
        to_batch(np.array([[1.0], [np.nan]]), DataOptions())
    with pytest.raises(TypeError, match="got list"):
        to_batch([[1, 2]], DataOptions())
