"""Angel's flow on the command line: a job file's keys drive train, predict and evaluate.

One real training run (LR on a slice of a9a, a real checkpoint) serves every test; predictions
come from a real saved model on a local Ray. The bad-input cases answer before Ray starts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import ray

from learners.cli.main import main
from learners.runs.folders import latest_run
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]
ROWS = 1200
LR_CLASS = "com.tencent.angel.ml.classification.LogisticRegression"


@pytest.fixture(scope="module")
def local_ray():
    ray_tmp = short_tmp()  # (Ray's socket paths stay under 107 bytes)
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=ray_tmp, namespace="angelps")
    yield
    ray.shutdown()
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def job_file(tmp_path_factory) -> dict[str, Path]:
    """A job file in Angel's style (qualified class name, action.type) and its data."""
    tmp = tmp_path_factory.mktemp("flow")
    lines = (ROOT / "data/a9a/a9a_123d_train.libsvm").read_text().splitlines(keepends=True)
    data = tmp / "a9a.libsvm"
    data.write_text("".join(lines[:ROWS]))
    conf = tmp / "job.properties"
    conf.write_text(
        f"action.type = train\n"
        f"ml.model.class.name = {LR_CLASS}\n"
        f"angel.train.data.path = {data}\n"
        "ml.data.type = libsvm\nml.feature.index.range = 123\nml.data.validate.ratio = 0.1\n"
        "ml.epoch.num = 2\nml.minibatch.size = 128\nml.inputlayer.optimizer = Adam\n"
        "ml.learn.rate = 0.05\n"
        f"angel.save.model.path = {tmp / 'model'}\n"
        f"angel.log.path = {tmp / 'log'}\n"
        "angel.job.name = flow\n"
    )
    return {"tmp": tmp, "data": data, "conf": conf, "model": tmp / "model"}


@pytest.fixture(scope="module")
def job(job_file, local_ray) -> dict[str, Path]:
    """The job file's model, trained (a real checkpoint)."""
    argv = ["train", "--conf", str(job_file["conf"]), "--angel.job.name", "flow_train"]
    assert main(argv) == 0
    return job_file


def _read_pred(path: Path) -> pa.Table:
    return pacsv.read_csv(path)


@pytest.mark.slow
def test_predict_runs_from_the_job_file_keys_alone(job, capsys) -> None:
    """angel.load.model.path, angel.predict.data.path, angel.predict.out.path in the file."""
    conf = job["tmp"] / "predict.properties"
    out = job["tmp"] / "pred.csv"
    # (the job file with its action.type changed: a key given twice in a file is refused)
    base = job["conf"].read_text().replace("action.type = train\n", "")
    conf.write_text(
        base + f"action.type = predict\nangel.load.model.path = {job['model']}\n"
        f"angel.predict.data.path = {job['data']}\nangel.predict.out.path = {out}\n"
    )
    assert main(["predict", "--conf", str(conf)]) == 0
    table = _read_pred(out)
    assert table.column_names == ["pred", "label"]
    assert table.num_rows == ROWS
    # Input order: the labels are the file's first column, as it wrote them (-1 stays -1).
    first = [line.split()[0] for line in job["data"].read_text().splitlines()]
    assert table["label"].to_pylist() == [float(y) for y in first]
    assert set(first) == {"-1", "+1"}
    pred = table["pred"].to_numpy()
    assert ((pred > 0) & (pred < 1)).all()
    # The same job through submit (action.type=predict), flags overriding keys.
    out2 = job["tmp"] / "pred2.parquet"
    assert main(["submit", "--conf", str(conf), "--angel.predict.out.path", str(out2)]) == 0
    import pyarrow.parquet as pq

    np.testing.assert_allclose(pq.read_table(out2)["pred"].to_numpy(), pred, rtol=1e-6)
    # --out wins over angel.predict.out.path; a directory gets predictions.csv (Angel's layout).
    outdir = job["tmp"] / "preddir"
    assert main(["predict", "--conf", str(conf), "--out", str(outdir)]) == 0
    np.testing.assert_allclose(
        _read_pred(outdir / "predictions.csv")["pred"].to_numpy(), pred, rtol=1e-6
    )
    assert "wrote 1200 predictions" in capsys.readouterr().err


@pytest.mark.slow
def test_evaluate_reports_the_training_metric_names(job, capsys) -> None:
    capsys.readouterr()
    argv = ["evaluate", "--conf", str(job["conf"]), "--angel.load.model.path", str(job["model"])]
    assert main([*argv, "--angel.predict.data.path", str(job["data"]), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["valid_rows"] == ROWS
    assert 0.8 < metrics["valid_auc"] < 1.0
    assert {"valid_logloss", "valid_accuracy", "valid_loss"} <= set(metrics)
    summary = json.loads(
        [x for x in (_latest(job["tmp"] / "log") / "metrics.jsonl").read_text().splitlines() if x][
            -1
        ]
    )
    trained = {k for k in summary if k.startswith("valid_")}
    assert {"valid_auc", "valid_logloss", "valid_accuracy"} <= trained & set(metrics)


@pytest.mark.slow
def test_train_predict_trains_then_writes_predictions(job, tmp_path) -> None:
    out = tmp_path / "tp.csv"
    argv = ["train", "--conf", str(job["conf"]), "--action.type", "train_predict"]
    argv += ["--ml.epoch.num", "1", "--angel.save.model.path", str(tmp_path / "m")]
    argv += ["--angel.job.name", "flow_tp", "--angel.log.path", str(tmp_path / "log")]
    argv += ["--angel.predict.data.path", str(job["data"]), "--angel.predict.out.path", str(out)]
    assert main(argv) == 0
    assert _read_pred(out).num_rows == ROWS
    assert (tmp_path / "m" / "manifest.json").exists()


def _bad(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("angelps: error: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    return err


def test_unknown_action_type_names_key_value_and_choices(job_file, capsys) -> None:
    err = _bad(["train", "--conf", str(job_file["conf"]), "--action.type", "inference"], capsys)
    assert (
        "action.type=inference is not valid: expected one of train, predict, evaluate, "
        "train_predict" in err
    )
    err = _bad(["train", "--conf", str(job_file["conf"]), "--set", "action.type=predict"], capsys)
    assert "action.type=predict (command line) does not train: run angelps predict" in err


def test_predict_without_a_model_path(job_file, capsys) -> None:
    out = job_file["tmp"] / "never.csv"
    argv = [
        "predict",
        "--conf",
        str(job_file["conf"]),
        "--input",
        str(job_file["data"]),
        "--out",
        str(out),
    ]
    err = _bad(argv, capsys)
    assert "angel.load.model.path is not set: predict needs a saved model" in err
    err = _bad([*argv, "--model", str(job_file["tmp"] / "nothing")], capsys)
    assert f"angel.load.model.path={job_file['tmp'] / 'nothing'} (--model): no saved model" in err
    assert not out.exists()


def test_output_directory_missing_or_not_writable(job_file, tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "m").mkdir()
    base = ["predict", "--conf", str(job_file["conf"]), "--model", str(tmp_path / "m")]
    base += ["--input", str(job_file["data"])]
    missing = tmp_path / "no" / "such" / "p.csv"
    err = _bad([*base, "--angel.predict.out.path", str(missing)], capsys)
    assert f"angel.predict.out.path={missing} (command line): the directory" in err
    assert "does not exist" in err
    locked = tmp_path / "locked"
    locked.mkdir()
    kept = locked / "p.csv"
    kept.write_text("old\n")
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            # Root writes anywhere: the check's write is refused as any other user's would be.
            mkdtemp = tempfile.mkdtemp

            def refuse(*args: Any, dir: Any = None, **kw: Any) -> str:
                if dir is not None and Path(dir) == locked:
                    raise PermissionError(13, "Permission denied")
                return mkdtemp(*args, dir=dir, **kw)

            monkeypatch.setattr(tempfile, "mkdtemp", refuse)
        err = _bad([*base, "--out", str(kept)], capsys)
        assert (
            f"angel.predict.out.path={kept} (--out): cannot write there ({locked}: "
            "Permission denied); choose a folder you can write to"
        ) in err
    finally:
        locked.chmod(0o700)
    assert kept.read_text() == "old\n"


@pytest.mark.slow
def test_a_model_that_is_not_the_jobs_model(job, tmp_path, capsys) -> None:
    out = tmp_path / "p.csv"
    out.write_text("kept\n")
    argv = ["predict", "--conf", str(job["conf"]), "--model", str(job["model"])]
    argv += ["--input", str(job["data"]), "--out", str(out)]
    argv += ["--ml.model.class.name", "FactorizationMachines"]
    err = _bad(argv, capsys)
    assert (
        f"angel.load.model.path={job['model']} holds a LogisticRegression model, but "
        "ml.model.class.name=FactorizationMachines (command line)" in err
    )
    assert out.read_text() == "kept\n"


def test_undeclared_option_is_an_error_with_a_suggestion(job_file, capsys) -> None:
    err = _bad(["train", "--conf", str(job_file["conf"]), "--ml.epoch.nums", "3"], capsys)
    assert "unknown option --ml.epoch.nums (did you mean --ml.epoch.num?)" in err
    err = _bad(["conf", "--ml.epoch.num"], capsys)
    assert "--ml.epoch.num needs a value" in err


def test_key_options_are_set_like_set(capsys) -> None:
    assert main(["conf", "--ml.epoch.num", "7", "--ml.model.class.name=" + LR_CLASS]) == 0
    lines = {x.split()[0]: x for x in capsys.readouterr().out.splitlines()}
    assert lines["ml.epoch.num"].split()[2] == "7"
    assert lines["ml.epoch.num"].endswith("# command line")


def test_the_migration_guides_job_file_loads_and_every_key_it_names_exists(tmp_path) -> None:
    import re

    from angelconf.config import KeyIndex, load_config
    from learners.keys import all_keys

    text = (ROOT / "docs" / "angel-migration.md").read_text()
    (block,) = re.findall(r"```properties\n(.*?)```", text, re.S)
    f = tmp_path / "job.properties"
    f.write_text(block)
    conf = load_config(f, [], all_keys())
    assert conf["action.type"] == "train" and conf["ml.opt.decay.alpha"] == 0.001
    # every key the page names, in the tables (`key`) and in Angel's submit lines (--key)
    named = set(re.findall(r"`((?:angel|ml|action)\.[a-z0-9.\-]*[a-z0-9])`", text))
    named |= set(re.findall(r"--((?:angel|ml|action)\.[a-z0-9.\-]*[a-z0-9])", text))
    assert {"angel.app.submit.class", "ml.model.size", "angel.deploy.mode"} <= named
    index = KeyIndex(all_keys())
    assert sorted(n for n in named if index.find(n) is None) == []
    # Angel's own submit line of the page runs through the loader as it is
    angel = re.findall(r"```bash\n(\./bin/angel-submit \\\n.*?)```", text, re.S)[0]
    pairs = re.findall(r"--([a-z][a-z0-9.\-]*) (\S+)", angel)
    load_config(None, dict(pairs), all_keys())


def test_angels_qualified_class_names_are_aliases() -> None:
    from learners.models.registry import ANGEL_CLASSES, model_name
    from learners.models.zoo import MODELS, model_class

    assert model_class(LR_CLASS) is MODELS["LogisticRegression"]
    assert model_class("com.tencent.angel.ml.regression.RobustRegression").task == "regression"
    assert model_name("COM.TENCENT.ANGEL.ML.CLASSIFICATION.DEEPFM") == "DeepFM"
    assert set(ANGEL_CLASSES.values()) == (set(MODELS) - {"DNN"}) | {"AngelModel"}
    with pytest.raises(
        ValueError, match=r"com\.tencent\.angel\.ml\.classification\.FM is not a known"
    ):
        model_class("com.tencent.angel.ml.classification.FM")


def _latest(log: Path) -> Path:
    """The newest run's directory under ``log``."""
    run = latest_run(log)
    assert run is not None, f"no run under {log}"
    return run
