"""GraphLearner end to end on a real local Ray: LR on a9a, every model on a small slice, the CLI."""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import ray

from learners.cli import train as cli_train
from learners.cli.main import main
from learners.job.learner import GraphLearner
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    tmp = short_tmp()  # Ray's socket paths must stay under 107 bytes
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, _temp_dir=tmp, namespace="angelps")
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _learner(conf: str, tmp_path: Path, **overrides) -> GraphLearner:
    sets = {
        "angel.log.path": str(tmp_path / "log"),
        "angel.save.model.path": str(tmp_path / "model"),
        "angel.job.name": f"t{abs(hash((conf, str(tmp_path)))) % 10**8}",
        **overrides,
    }
    return GraphLearner.from_properties(ROOT / "conf" / conf, sets, quiet=True)


def test_lr_a9a_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    learner = _learner("lr_a9a.properties", tmp_path, **{"ml.epoch.num": 3})
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    s = result.summary
    assert s["epochs"] == 3 and len(result.history) == 3
    assert s["valid_auc"] >= 0.899
    assert 0.3 < s["valid_logloss"] < 0.36
    assert s["valid_accuracy"] > 0.83
    assert s["train_samples_per_s"] > 0 and s["elapsed_s"] > 0
    # StandardDecay per epoch: epoch k trains at 0.02 / sqrt(1 + 0.5 (k + 1)).
    lrs = [h["lr"] for h in result.history]
    assert lrs == pytest.approx([0.02 / math.sqrt(1 + 0.5 * (k + 1)) for k in range(3)])
    run = tmp_path / "log" / (tmp_path / "log" / "latest").read_text().strip()
    assert Path(s["run_dir"]) == run and (run / "summary.json").is_file()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    epochs = [x for x in lines if x["kind"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]  # counted from 1, as the console does
    assert lines[0]["kind"] == "start" and lines[0]["epoch_base"] == 1
    for key in (
        "epoch",
        "step",
        "lr",
        "loss",
        "samples_per_s",
        "pull_s",
        "compute_s",
        "push_s",
        "wait_s",
    ):
        assert key in steps[0]
    # 29,304 training rows (every 10th of 32,561 validates) / 256 = 115 updates per epoch, logged every 50 updates.
    assert [x["step"] for x in steps if x["epoch"] == 1] == [50, 100, 115]
    assert steps[-1]["step"] == 345
    assert "valid_auc" in epochs[-1] and "train_loss" in epochs[-1]


def _slice(src: str, dst: Path, n: int) -> str:
    with open(ROOT / src) as f, open(dst, "w") as g:
        for _ in range(n):
            g.write(f.readline())
    return str(dst)


# (conf, data file, rows, metric, floor): every model learns something real on a small slice.
CASES = [
    ("svm_a9a.properties", "data/a9a/a9a_123d_train.libsvm", 4000, "valid_auc", 0.85),
    ("mlr_census.properties", "data/census/census_148d_train.dummy", 4000, "valid_auc", 0.85),
    ("fm_census.properties", "data/census/census_148d_train.dummy", 4000, "valid_auc", 0.85),
    ("deepfm_census.properties", "data/census/census_148d_train.dummy", 4000, "valid_auc", 0.85),
    (
        "wideanddeep_census.properties",
        "data/census/census_148d_train.dummy",
        4000,
        "valid_auc",
        0.85,
    ),
    ("nfm_census.properties", "data/census/census_148d_train.dummy", 4000, "valid_auc", 0.85),
    ("pnn_census.properties", "data/census/census_148d_train.dummy", 4000, "valid_auc", 0.85),
    ("dnn_w6a.properties", "data/w6a/w6a_300d_train.libsvm", 6000, "valid_auc", 0.9),
    ("linreg_abalone.properties", "data/abalone/abalone_8d_train.libsvm", 4177, "valid_r2", 0.3),
    ("robustreg_abalone.properties", "data/abalone/abalone_8d_train.libsvm", 4177, "valid_r2", 0.3),
    ("softmax_dna.properties", "data/dna/dna.scale", 2000, "valid_accuracy", 0.85),
]


# The quickest two run by default; every model runs with -m slow.
FAST = {"fm_census.properties", "softmax_dna.properties"}


@pytest.mark.parametrize(
    ("conf", "src", "rows", "metric", "floor"),
    [c if c[0] in FAST else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
)
def test_model_learns_on_a_slice(tmp_path, conf, src, rows, metric, floor):
    path = _slice(src, tmp_path / Path(src).name, rows)
    # abalone anneals to zero over the run: 3 epochs of it are too short a schedule
    epochs = 10 if "abalone" in conf else 3
    learner = _learner(conf, tmp_path, **{"angel.train.data.path": path, "ml.epoch.num": epochs})
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    value = result.summary[metric]
    assert value is not None and value >= floor, result.history
    assert all(np.isfinite(h["train_loss"]) for h in result.history)


def test_cli_train_writes_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "s" / "summary.json"
    args = argparse.Namespace(
        conf="conf/lr_a9a.properties",
        set=[
            "ml.epoch.num=1",
            f"angel.log.path={tmp_path / 'log'}",
            f"angel.save.model.path={tmp_path / 'model'}",
            "angel.job.name=t_cli",
        ],
        address=None,
        summary_json=str(out),
        resume=False,
    )
    assert cli_train._train(args) == 0
    s = json.loads(out.read_text())
    for key in (
        "epochs",
        "valid_auc",
        "valid_logloss",
        "valid_accuracy",
        "train_samples_per_s",
        "elapsed_s",
    ):
        assert key in s
    assert s["epochs"] == 1
    assert "done: 1 epochs" in capsys.readouterr().out


def _train_and_predict(learner: GraphLearner, resume: bool, data: str):
    try:
        result = learner.train(resume=resume)
        pred = learner.predict(data)
    finally:
        learner.shutdown()
    return result, pred


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [{}, {"angel.workergroup.number": 2, "ml.model.dropout": 0.2}],
    ids=["one-worker", "two-workers-dropout"],
)
def test_resume_matches_an_uninterrupted_run(tmp_path, extra):
    """BSP + fixed seed: stop after epoch 1, resume, and end where a 3-epoch run ends (with
    two workers, each continues its own dropout stream)."""
    data = _slice("data/census/census_148d_train.dummy", tmp_path / "c.dummy", 1500)
    common = {"angel.train.data.path": data, "ml.data.use.shuffle": True, "ml.seed": 5, **extra}
    full, pred_full = _train_and_predict(
        _learner(
            "deepfm_census.properties",
            tmp_path / "a",
            **common,
            **{"ml.epoch.num": 3, "angel.save.model.path": str(tmp_path / "ckpt_a")},
        ),
        False,
        data,
    )
    _train_and_predict(
        _learner(
            "deepfm_census.properties",
            tmp_path / "b",
            **common,
            **{"ml.epoch.num": 1, "angel.save.model.path": str(tmp_path / "ckpt_b")},
        ),
        False,
        data,
    )
    resumed, pred_resumed = _train_and_predict(
        _learner(
            "deepfm_census.properties",
            tmp_path / "c",
            **common,
            **{"ml.epoch.num": 3, "angel.save.model.path": str(tmp_path / "ckpt_b")},
        ),
        True,
        data,
    )
    assert [h["epoch"] for h in resumed.history] == [0, 1, 2]
    for a, b in zip(full.history, resumed.history, strict=True):
        assert a["lr"] == b["lr"]
        assert a["valid_logloss"] == pytest.approx(b["valid_logloss"], rel=1e-6)
        assert a["valid_auc"] == pytest.approx(b["valid_auc"], rel=1e-6)
    np.testing.assert_allclose(pred_resumed, pred_full, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_saved_model_predicts_and_evaluates(tmp_path, capsys):
    data = _slice("data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 3000)
    model = tmp_path / "model"
    learner = _learner(
        "lr_a9a.properties",
        tmp_path,
        **{"angel.train.data.path": data, "ml.epoch.num": 2, "angel.save.model.path": str(model)},
    )
    try:
        result = learner.train()
        direct = learner.predict(data)
        learner.save(tmp_path / "copy")
    finally:
        learner.shutdown()
    assert (model / "manifest.json").exists()
    copy = json.loads((tmp_path / "copy" / "manifest.json").read_text())["extra"]["learner"]
    assert copy["model"] == "LogisticRegression" and copy["num_features"] == 123
    conf = str(ROOT / "conf" / "lr_a9a.properties")
    out = tmp_path / "pred.csv"
    assert (
        main(["predict", "--conf", conf, "--model", str(model), "--input", data, "--out", str(out)])
        == 0
    )
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(out)
    assert table.column_names == ["pred", "label"]
    assert table.num_rows == 3000
    np.testing.assert_allclose(table["pred"].to_numpy(), direct, rtol=1e-6)
    # Labels in input order, as the file wrote them (a9a's first line is -1).
    assert table["label"].to_numpy()[0] == -1.0
    # Without --conf the saved model's own data settings apply; Parquet by the suffix.
    outp = tmp_path / "pred.parquet"
    assert main(["predict", "--model", str(model), "--input", data, "--out", str(outp)]) == 0
    import pyarrow.parquet as pq

    np.testing.assert_allclose(pq.read_table(outp)["pred"].to_numpy(), direct, rtol=1e-6)
    capsys.readouterr()
    assert main(["evaluate", "--conf", conf, "--model", str(model), "--input", data, "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["valid_rows"] == 3000
    assert 0.85 < metrics["valid_auc"] < 1.0
    # The model saved after the last epoch: its validation rows are part of the input.
    assert result.summary["epochs"] == 2


def test_resume_without_checkpoint_is_a_config_error(tmp_path):
    from angelconf.config import ConfigError

    learner = _learner(
        "lr_a9a.properties", tmp_path, **{"angel.save.model.path": str(tmp_path / "none")}
    )
    try:
        none = tmp_path / "none"
        said = f"--resume: angel.save.model.path={none} (program): no checkpoint at {none}"
        with pytest.raises(ConfigError) as e:
            learner.train(resume=True)
        assert str(e.value) == said
    finally:
        learner.shutdown()


def test_save_path_equal_to_the_log_dir_fails_before_any_actor(tmp_path):
    """The first checkpoint would replace metrics.jsonl: refused at once (ConfigError, exit 2)."""
    from angelconf.config import ConfigError

    log = tmp_path / "log"
    log.mkdir()
    (log / "metrics.jsonl").write_text("{}\n")
    learner = _learner("lr_a9a.properties", tmp_path, **{"angel.save.model.path": str(log)})
    try:
        with pytest.raises(ConfigError, match=r"is the log directory \(angel\.log\.path="):
            learner.train()
        assert learner.actors.workers is None and learner.actors.ps is None
    finally:
        learner.shutdown()
    assert (log / "metrics.jsonl").read_text() == "{}\n"


def _dense_arrays(blob: bytes) -> dict[str, bytes]:
    """The arrays of a worker's dense_state() but its RNG state, as bytes."""
    from learners.worker.dense import read_dense

    arrays, _meta = read_dense(blob)
    return {k: v.tobytes() for k, v in arrays.items() if k != "rng/torch"}


@pytest.mark.slow
def test_two_workers_keep_identical_dense_replicas(tmp_path):
    data = _slice("data/census/census_148d_train.dummy", tmp_path / "c.dummy", 4000)
    learner = _learner(
        "deepfm_census.properties",
        tmp_path,
        **{"angel.train.data.path": data, "ml.epoch.num": 2, "angel.workergroup.number": 2},
    )
    try:
        result = learner.train()
        digests = [_dense_arrays(blob) for blob in learner.actors.workers.execute("dense_state")]
    finally:
        learner.shutdown()
    assert result.summary["workers"] == 2
    assert result.summary["global_batch"] == 512
    # The MLP's gradients are all-reduced at every update: both replicas are the same model
    # (the same layers and optimizer state, byte for byte; each worker has its own RNG stream).
    assert digests[0].keys() == digests[1].keys()
    for name, value in digests[0].items():
        assert value == digests[1][name], name
    assert result.summary["valid_auc"] > 0.85


@pytest.mark.filterwarnings("ignore:ml.opt.decay.alpha. set but not used")
def test_plateau_and_early_stopping_on_a_frozen_model(tmp_path):
    """Nothing trains (every table frozen), so the metric never improves: ReduceLROnPlateau
    halves the lr after each bad epoch and early stopping ends the run after 2 of them."""
    data = _slice("data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 600)
    learner = _learner(
        "lr_a9a.properties",
        tmp_path,
        **{
            "angel.train.data.path": data,
            "ml.epoch.num": 10,
            "ml.freeze.layers": "weight,bias",
            "ml.learn.rate": 0.1,
            "ml.opt.decay.class.name": "ReduceLROnPlateau",
            "ml.opt.decay.patience": 0,
            "ml.opt.decay.factor": 0.5,
            "ml.opt.decay.mode": "min",
            "ml.early.stop.metric": "valid_logloss",
            "ml.early.stop.patience": 2,
        },
    )
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    assert [h["lr"] for h in result.history] == [0.1, 0.1, 0.05]
    assert result.summary["stopped_early"] is True
    assert result.summary["epochs"] == 3
    # All-zero weights: every prediction is 0.5.
    assert result.summary["valid_logloss"] == pytest.approx(np.log(2), rel=1e-6)


def test_plateau_mode_must_match_the_metric(tmp_path):
    from angelconf.config import ConfigError

    data = _slice("data/a9a/a9a_123d_train.libsvm", tmp_path / "a.libsvm", 300)
    learner = _learner(
        "lr_a9a.properties",
        tmp_path,
        **{
            "angel.train.data.path": data,
            "ml.opt.decay.class.name": "ReduceLROnPlateau",
            "ml.opt.decay.mode": "min",
        },
    )
    try:
        with pytest.raises(ConfigError, match=r"set ml\.opt\.decay\.mode=max"):
            learner.train()
    finally:
        learner.shutdown()


@pytest.mark.slow
def test_dense_layers_on_the_ps(tmp_path):
    """angel.dense.placement=ps: the MLP lives in dense PS tables and still learns."""
    data = _slice("data/census/census_148d_train.dummy", tmp_path / "c.dummy", 4000)
    learner = _learner(
        "nfm_census.properties",
        tmp_path,
        **{"angel.train.data.path": data, "ml.epoch.num": 2, "angel.dense.placement": "ps"},
    )
    try:
        result = learner.train()
        names = sorted(t.name for t in learner.actors.tables)
    finally:
        learner.shutdown()
    assert "dense.mlp.0.weight" in names and "dense.mlp.0.bias" in names
    assert result.summary["valid_auc"] > 0.85


def test_bad_model_name_fails_before_any_actor(tmp_path, capsys):
    """The CLI maps it to exit code 2 with the valid names, closest first."""
    from learners.cli.main import main

    code = main(
        [
            "train",
            "--conf",
            str(ROOT / "conf" / "lr_a9a.properties"),
            "--set",
            "ml.model.class.name=DeepFMM",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "ml.model.class.name=DeepFMM (command line) is not a known model" in err
    assert "closest first): DeepFM," in err


def test_unknown_early_stop_metric_names_the_valid_ones(tmp_path):
    from angelconf.config import ConfigError

    learner = _learner(
        "softmax_dna.properties",
        tmp_path,
        **{"ml.epoch.num": 2, "ml.early.stop.patience": 1, "ml.early.stop.metric": "auc"},
    )
    try:
        with pytest.raises(ConfigError, match="reports no valid_auc; valid names: valid_accuracy"):
            learner.train()
    finally:
        learner.shutdown()


def test_angel_updates_per_epoch_sizes_the_batch(tmp_path):
    """ml.num.update.per.epoch (Angel's way): batch = ceil(rows / updates); 1800 rows / 5."""
    learner = _learner(
        "softmax_dna.properties",
        tmp_path,
        **{"ml.epoch.num": 1, "ml.num.update.per.epoch": 5},
    )
    try:
        result = learner.train()
    finally:
        learner.shutdown()
    assert result.summary["updates_per_epoch"] == 5
    assert result.summary["global_batch"] == 360
