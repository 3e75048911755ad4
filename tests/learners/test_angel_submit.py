"""Angel jobs as pasted: the keys of Angel's documented submit commands run through
``angelps submit`` (learners/angel_keys.py).

The commands are those of Angel's algorithm docs (docs/algo/lr_on_angel_en.md,
fm_on_angel_en.md, deepfm_on_angel_en.md, daw_on_angel_en.md): every ``--key value`` (and the
FM doc's ``-Dkey=value``) kept as written, with our data paths, one epoch on a slice of the
data. Their ``angel.ml.conf`` JSON graph is left out (the JSON is read elsewhere); the built-in
model class of the same name and the JSON's data keys stand in for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from angelconf.config import ConfigError, load_config
from learners.angel_keys import angel_notes, resolve
from learners.cli.main import main
from learners.keys import all_keys

ROOT = Path(__file__).resolve().parents[2]
ROWS = 1500


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("angel_data")
    out = {}
    for name, src in (
        ("a9a", "a9a/a9a_123d_train.libsvm"),
        ("census", "census/census_148d_train.libsvm"),
        ("census_dummy", "census/census_148d_train.dummy"),
    ):
        lines = (ROOT / "data" / src).read_text().splitlines(keepends=True)
        out[name] = tmp / Path(src).name
        out[name].write_text("".join(lines[:ROWS]))
    out["tmp"] = tmp
    return out


def _resources(tmp: Path, name: str) -> list[str]:
    """The resource and runtime arguments every documented command carries, as written."""
    return [
        "--angel.job.name", name,
        "--action.type", "train",
        "--angel.app.submit.class", "com.tencent.angel.ml.core.graphsubmit.GraphRunner",
        "--angel.save.model.path", str(tmp / name / "model"),
        "--angel.log.path", str(tmp / name / "log"),
        "--angel.workergroup.number", "1",
        "--angel.worker.memory.gb", "2",
        "--angel.worker.task.number", "1",
        "--angel.ps.number", "1",
        "--angel.ps.memory.gb", "1",
        "--angel.output.path.deleteonexist", "true",
        "--angel.task.data.storage.level", "memory",
        "--angel.task.memorystorage.max.gb", "1",
        "--angel.worker.env", "LD_PRELOAD=./libopenblas.so",
        "--ml.optimizer.json.provider", "com.tencent.angel.ml.core.PSOptimizerProvider",
    ]  # fmt: skip


def _summary(argv: list[str], tmp: Path, name: str, capsys) -> dict:
    out = tmp / f"{name}.json"
    assert main(["submit", *argv, "--summary-json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return json.loads(out.read_text())


@pytest.mark.slow
def test_angel_documented_submit_commands_run_unchanged(data, ray_local, capsys) -> None:
    tmp = data["tmp"]
    lr = [
        *_resources(tmp, "lr"),
        "--ml.model.class.name", "com.tencent.angel.ml.classification.LogisticRegression",
        "--angel.train.data.path", str(data["a9a"]),
        "--ml.data.type", "libsvm", "--ml.feature.index.range", "123",
        "--ml.model.type", "T_FLOAT_DENSE", "--ml.epoch.num", "1",
        "--ml.data.validate.ratio", "0.1", "--ml.learn.rate", "0.5",
    ]  # fmt: skip
    s = _summary(lr, tmp, "lr", capsys)
    assert s["model"] == "LogisticRegression" and s["epochs"] == 1 and s["valid_auc"] > 0.8

    # FM's doc submits with -Dkey=value (and a few -Dkey value)
    fm = [
        "-Dml.epoch.num=1",
        "-Dangel.app.submit.class=com.tencent.angel.ml.core.graphsubmit.GraphRunner",
        "-Dml.model.class.name=com.tencent.angel.ml.classification.FactorizationMachines",
        "-Dml.feature.index.range=148", "-Dml.model.size=148",
        "-Dml.data.validate.ratio=0.1", "-Dml.data.type=libsvm", "-Dml.learn.rate=0.1",
        "-Dml.reg.l2=0.03", "-Daction.type=train", "-Dml.fm.field.num=13", "-Dml.fm.rank=8",
        "-Dml.inputlayer.optimizer=ftrl",
        f"-Dangel.train.data.path={data['census']}",
        f"-Dangel.save.model.path={tmp / 'fm' / 'model'}",
        f"-Dangel.log.path={tmp / 'fm' / 'log'}",
        "-Dangel.workergroup.number", "1", "-Dangel.worker.memory.gb", "2",
        "-Dangel.worker.task.number", "1", "-Dangel.ps.number", "1",
        "-Dangel.ps.memory.gb", "1", "-Dangel.output.path.deleteonexist", "true",
        "-Dangel.task.data.storage.level", "memory",
        "-Dangel.task.memorystorage.max.gb", "1",
        "-Dangel.worker.env", "LD_PRELOAD=./libopenblas.so", "-Dangel.job.name=fm",
        "-Dml.optimizer.json.provider", "com.tencent.angel.ml.core.PSOptimizerProvider",
    ]  # fmt: skip
    s = _summary(fm, tmp, "fm", capsys)
    assert s["model"] == "FactorizationMachines" and s["valid_auc"] > 0.75

    for name, cls in (("deepfm", "DeepFM"), ("daw", "WideAndDeep")):
        argv = [
            *_resources(tmp, name),
            "--ml.model.class.name", f"com.tencent.angel.ml.classification.{cls}",
            "--angel.train.data.path", str(data["census_dummy"]),
            # the data and model sections of the doc's JSON, as keys
            "--ml.data.type", "dummy", "--ml.feature.index.range", "148",
            "--ml.model.size", "148", "--ml.model.type", "T_DOUBLE_SPARSE_LONGKEY",
            "--ml.fm.field.num", "13", "--ml.fm.rank", "8",
            "--ml.data.validate.ratio", "0.1", "--ml.epoch.num", "1",
            "--ml.learn.rate", "0.1",
        ]  # fmt: skip
        s = _summary(argv, tmp, name, capsys)
        assert s["model"] == cls and s["valid_auc"] > 0.7, s


def _conf(sets: dict[str, str]):
    return load_config(None, sets, all_keys())


def test_angel_keys_map_onto_ours() -> None:
    conf = resolve(
        _conf(
            {
                "angel.ps.memory.gb": "1.5",
                "angel.workergroup.number": "2",
                "angel.worker.task.number": "3",
                "ml.model.type": "T_FLOAT_DENSE",
                "ml.model.size": "123",
                "angel.worker.max-attempts": "4",
                "angel.task.data.storage.level": "disk",
                "ml.lr.reg.l2": "0.01",
            }
        )
    )
    assert conf["angel.ps.memory"] == 1536
    assert conf["angel.workergroup.number"] == 6
    assert conf["angel.ps.partitioner"] == "range"
    assert conf["ml.feature.index.range"] == 123
    assert conf["angel.worker.max.restarts"] == 3
    assert conf["ml.data.stream"] is True and conf["ml.reg.l2"] == 0.01
    again = resolve(conf)  # idempotent: the task number is not applied twice
    assert again["angel.workergroup.number"] == 6 and again["angel.ps.memory"] == 1536
    sparse = resolve(_conf({"ml.model.type": "T_DOUBLE_SPARSE_LONGKEY"}))
    assert sparse["angel.ps.partitioner"] == "hash"


def test_angel_key_notes_say_what_each_does() -> None:
    conf = _conf({"angel.deploy.mode": "YARN", "angel.ps.memory.mb": "2048"})
    assert angel_notes(conf) == [
        "note: angel.ps.memory.mb=2048 (program) sets angel.ps.memory (Angel's key)",
        "note: angel.deploy.mode=YARN (program) has no effect here: Ray decides where actors "
        "run (--address or RAY_ADDRESS; none: a local Ray)",
    ]


def test_a_bound_set_beside_its_target_is_said_to_be_checked_not_to_set_it() -> None:
    """ml.model.size fills ml.feature.index.range only when that key is not set."""
    assert angel_notes(_conf({"ml.model.size": "123"})) == [
        "note: ml.model.size=123 (program) sets ml.feature.index.range (Angel's key)"
    ]
    assert angel_notes(_conf({"ml.model.size": "100", "ml.feature.index.range": "123"})) == [
        "note: ml.model.size=100 (program) is checked against ml.feature.index.range=123 "
        "(program), which sets the size (Angel's key)"
    ]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"angel.ps.memory.mb": "1024", "angel.ps.memory": "2048"},
            r"^angel.ps.memory.mb=1024 \(program\) sets angel.ps.memory=1024, but "
            r"angel.ps.memory=2048 \(program\): keep one$",
        ),
        (
            {"angel.ps.memory.mb": "1024", "angel.ps.memory.gb": "2"},
            r"^angel.ps.memory.mb=1024 \(program\) and angel.ps.memory.gb=2.0 \(program\) "
            r"disagree: both set angel.ps.memory; keep one$",
        ),
        (
            {"ml.data.posneg.ratio": "5"},
            r"^ml.data.posneg.ratio=5.0 \(program\): Angel's key: resampling .* only -1",
        ),
        (
            {"ml.model.size": "200", "ml.feature.index.range": "123"},
            r"^ml.model.size=200 \(program\) is larger than the feature index range 123: ",
        ),
        (
            {"ml.model.size": "200", "ml.feature.num": "123"},
            r"^ml.model.size=200 \(program\) is larger than the feature index range 123: ",
        ),
    ],
)
def test_angel_keys_that_disagree_are_one_line_errors(sets, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(_conf(sets))


def test_every_unknown_key_is_reported_at_once(tmp_path, capsys) -> None:
    job = tmp_path / "job.properties"
    job.write_text("ml.epoch.nmu = 3\nangel.deploy.mode = YARN\nangel.foo.bar = 1\n")
    assert main(["conf", "--conf", str(job), "--set", "ml.lern.rate=1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"angelps: error: 3 unknown keys: {job}:1: ml.epoch.nmu (did you mean ml.epoch.num?); "
        f"{job}:3: angel.foo.bar; command line: ml.lern.rate (did you mean ml.learn.rate?); "
        "`angelps conf --keys` lists every key"
    )


def test_every_unknown_option_is_reported_at_once(capsys) -> None:
    argv = ["conf", "--ml.epoch.nums", "3", "-Dangel.app.submit.clas=x", "--angel.zzz", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "angelps: error: 3 unknown options: --ml.epoch.nums (did you mean --ml.epoch.num?); "
        "--angel.app.submit.clas (did you mean --angel.app.submit.class?); --angel.zzz; a "
        "declared key is accepted as --KEY VALUE, -DKEY=VALUE or --set KEY=VALUE "
        "(`angelps conf --keys` lists every key)"
    )


def test_minus_d_options_set_keys(capsys) -> None:
    argv = ["conf", "-Dml.epoch.num=7", "-Dangel.ps.memory.mb", "512"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "ml.epoch.num" in captured.out and "= 7 " in captured.out
    assert "angel.ps.memory " in captured.out and "= 512" in captured.out
    assert "angelps: note: angel.ps.memory.mb=512 (command line) sets angel.ps.memory" in (
        captured.err
    )


def test_deleteonexist_false_refuses_existing_outputs(tmp_path, capsys) -> None:
    data = tmp_path / "d.libsvm"
    data.write_text("1 1:1\n0 2:1\n")
    model = tmp_path / "model"
    model.mkdir()  # empty: a path angelps would write its checkpoint into
    argv = [
        "submit", "--angel.train.data.path", str(data), "--angel.save.model.path", str(model),
        "--angel.output.path.deleteonexist", "false", "--angel.log.path", str(tmp_path / "l"),
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"angelps: error: angel.save.model.path={model} (command line) already exists and "
        "angel.output.path.deleteonexist=false (command line): remove it, choose another "
        "path, or set angel.output.path.deleteonexist=true"
    )
    out = tmp_path / "pred.csv"
    out.write_text("pred\n")
    argv = [
        "predict", "--model", str(model), "--input", str(data), "--out", str(out),
        "-Dangel.output.path.deleteonexist=false",
    ]  # fmt: skip
    assert main(argv) == 2
    assert "angel.predict.out.path" in capsys.readouterr().err and out.read_text() == "pred\n"


def test_inctrain_is_train_from_the_loaded_model() -> None:
    from learners.job.action import JobAction

    action = JobAction.from_config(_conf({"action.type": "inctrain", "angel.load.model.path": "m"}))
    assert action.action == "train" and action.model_path == "m"
    with pytest.raises(ConfigError, match=r"^action.type=inctrain trains on from a saved"):
        JobAction.from_config(_conf({"action.type": "inctrain"}))


def test_unknown_options_file_keys_and_sets_come_in_one_message(tmp_path, capsys) -> None:
    job = tmp_path / "job.properties"
    job.write_text("ml.epoch.nmu = 3\nangel.deploy.mode = YARN\n")
    argv = ["conf", "--conf", str(job), "--set", "ml.lern.rate=1", "-Dangel.zzz=1"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"angelps: error: 3 unknown keys: {job}:1: ml.epoch.nmu (did you mean ml.epoch.num?); "
        "--set: ml.lern.rate (did you mean ml.learn.rate?); --angel.zzz; a declared key is "
        "accepted as --KEY VALUE, -DKEY=VALUE or --set KEY=VALUE (`angelps conf --keys` lists "
        "every key)"
    )


def test_train_takes_the_job_as_keys_alone(data, ray_local, capsys) -> None:
    """As Angel's submit: `angelps train --KEY VALUE ...` without a job file (--conf)."""
    tmp = data["tmp"]
    assert main(["train"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "angelps: error: angel.train.data.path is not set: expected the path of the training "
        "data (in the job file, --conf FILE, or on the command line: --angel.train.data.path PATH)"
    )
    out = tmp / "keys_only.json"
    argv = [
        "train", "--angel.train.data.path", str(data["a9a"]), "--ml.epoch.num", "1",
        "--ml.feature.index.range", "123", "--ml.data.validate.ratio", "0.1",
        "--angel.save.model.path", str(tmp / "keys_only" / "model"),
        "--angel.log.path", str(tmp / "keys_only" / "log"), "--summary-json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    s = json.loads(out.read_text())
    assert s["model"] == "LogisticRegression" and s["epochs"] == 1 and s["valid_auc"] > 0.8
    # A job stopped by its data (found by the workers, once Ray and the run folder are up)
    # leaves no empty run behind, and `latest` still names the run above (plot draws it).
    log = tmp / "keys_only" / "log"
    runs = sorted(p.name for p in log.iterdir())
    bad = tmp / "bad.libsvm"
    bad.write_text("1 3:1\n1 4:x\n")
    argv[2] = str(bad)
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"angelps: error: {bad}:2: ")
    assert sorted(p.name for p in log.iterdir()) == runs
    assert (log / "latest").read_text().strip() == Path(s["run_dir"]).name
    # Resumed on other data: where from and the epochs left, and a warning naming both paths.
    other = tmp / "other.libsvm"
    other.write_text("".join(data["a9a"].read_text().splitlines(keepends=True)[:600]))
    argv[2] = str(other)
    argv[argv.index("--ml.epoch.num") + 1] = "2"
    assert main([*argv, "--resume"]) == 0
    said = capsys.readouterr()
    model = tmp / "keys_only" / "model"
    assert f"  resume   {model} after epoch 1: epochs 2..2 left of 2\n" in said.out
    assert (
        f"angelps: warning: angel.train.data.path={other} (command line) is not the data the "
        f"checkpoint trained on ({data['a9a']}): the epochs left read other data, and the best "
        "epoch is chosen across both"
    ) in said.err


def test_one_class_validation_says_the_auc_is_not_there(data, ray_local, capsys) -> None:
    """Labels of one class: the AUC is undefined, so no best epoch is kept and early stopping
    never acts; said once, not silently."""
    tmp = data["tmp"]
    neg = tmp / "neg.libsvm"
    lines = data["a9a"].read_text().splitlines(keepends=True)
    neg.write_text("".join([line for line in lines if line.startswith("-1")][:800]))
    argv = [
        "train", "--angel.train.data.path", str(neg), "--ml.epoch.num", "2",
        "--ml.feature.index.range", "123", "--ml.data.validate.ratio", "0.2",
        "--angel.save.model.path", str(tmp / "neg" / "model"),
        "--angel.log.path", str(tmp / "neg" / "log"),
    ]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    warning = (
        "angelps: warning: valid_auc (ml.early.stop.metric) is not reported (the validation "
        "rows hold one class only, where the AUC is undefined): no best epoch is kept and early "
        "stopping does not act; check the labels, or watch another metric (valid_logloss)"
    )
    assert err.count(warning) == 1
