"""A prediction output that would overwrite the job's own files is refused before anything
starts (learners/cli/predict.py ``check_out``): exit 2 and one line naming the keys.

``angelps predict --input in.csv --out in.csv`` replaced the input with its predictions,
``--out M`` or ``--out M/manifest.csv`` (M the model of --model) wrote into the checkpoint,
and an output inside an input directory added a file that the next read takes as data; all
with exit 0. Checked through the real command line (``main``); the refusals come before Ray
or torch load, so only the last test trains a model (a few seconds).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from angelconf.config import Config, ConfigError
from learners.cli.main import main
from learners.cli.predict import check_out
from learners.job.action import JobAction
from learners.keys import all_keys

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "a9a" / "a9a_123d_train.libsvm"
ROWS = 300
_OUT, _DATA = "angel.predict.out.path", "angel.predict.data.path"
_LOAD, _SAVE = "angel.load.model.path", "angel.save.model.path"


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The command's directory: an input ``in.csv`` (libsvm lines), an input directory
    ``parts`` and a model directory ``model`` (a checkpoint's files: the refusals come before
    it is read)."""
    monkeypatch.chdir(tmp_path)
    lines = DATA.read_text().splitlines()[:ROWS]
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "part-0").write_text("\n".join(lines[:50]) + "\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.json").write_text('{"format": 1}\n')
    (model / "manifest.csv").write_text("table,rows\n")
    return tmp_path


def _is(key: str, value: Path | str, flag: str) -> str:
    return f"{key}={value} ({flag})"


def _refused(job: Path, capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    """``angelps ARGV`` exits 2 with ``line`` alone, and leaves every file as it was."""
    before = _snapshot(job)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"angelps: error: {line}\n", err
    assert _snapshot(job) == before  # the input, the model: byte for byte, nothing added


def _predict(model: str, data: str, out: str) -> list[str]:
    return ["predict", "--model", model, "--input", data, "--out", out]


def _same_input(out: Path | str, data: Path | str, flag: str = "--input") -> str:
    return (
        f"{_is(_OUT, out, '--out')} is the input {_is(_DATA, data, flag)}: predictions would "
        "replace the data; choose another file"
    )


def _into_input(out: Path | str, data: Path | str) -> str:
    return (
        f"{_is(_OUT, out, '--out')} writes into the input directory "
        f"{_is(_DATA, data, '--input')}: the predictions would be read as data next time; "
        "choose a path outside it"
    )


def _into_model(out: Path | str, model: Path | str, flag: str = "--model", key: str = _LOAD) -> str:
    what = "the model directory" if key == _LOAD else "the model directory that training saves to"
    return (
        f"{_is(_OUT, out, '--out')} writes into {what} {_is(key, model, flag)}: predictions do "
        "not belong in a checkpoint; choose a path outside it"
    )


def test_the_input_file_is_refused(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _same_input(job / "in.csv", job / "in.csv")
    _refused(job, capsys, _predict("model", "in.csv", "in.csv"), line)
    # the same file however it is named: another spelling, a link, a hard link
    _refused(job, capsys, _predict("model", "in.csv", "./parts/../in.csv"), line)
    (job / "link.csv").symlink_to(job / "in.csv")
    line = _same_input(job / "link.csv", job / "in.csv")
    _refused(job, capsys, _predict("model", "in.csv", "link.csv"), line)
    os.link(job / "in.csv", job / "hard.csv")
    line = _same_input(job / "hard.csv", job / "in.csv")
    _refused(job, capsys, _predict("model", "in.csv", "hard.csv"), line)


def test_the_input_file_as_keys_is_refused(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Set by the keys (not --input/--out): the error names them and where they were set."""
    argv = [
        "predict", "--set", f"{_LOAD}=model", "--set", f"{_DATA}=in.csv",
        "--set", f"{_OUT}=in.csv",
    ]  # fmt: skip
    line = (
        f"{_OUT}={job / 'in.csv'} (command line) is the input {_DATA}={job / 'in.csv'} "
        "(command line): predictions would replace the data; choose another file"
    )
    _refused(job, capsys, argv, line)


def test_an_output_in_the_input_directory_is_refused(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = job / "parts"
    _refused(job, capsys, _predict("model", "parts", "parts"), _into_input(parts, parts))
    out = parts / "pred.csv"
    _refused(job, capsys, _predict("model", "parts", str(out)), _into_input(out, parts))
    out = parts / "new" / "sub"  # a directory made there, its predictions.csv read next time
    _refused(job, capsys, _predict("model", "parts", str(out)), _into_input(out, parts))


def test_the_model_directory_is_refused(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = job / "model"
    for out in (model, model / "manifest.csv", model / "pred.parquet", model / "sub"):
        line = _into_model(out, model)
        _refused(job, capsys, _predict("model", "in.csv", str(out)), line)


def test_submit_train_predict_refuses_the_save_path(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train_predict: the checkpoint that training writes is refused before training."""
    save = job / "model"
    argv = [
        "submit", "--conf", str(ROOT / "conf" / "lr_a9a.properties"),
        "--action.type", "train_predict", "--angel.train.data.path", "in.csv",
        "--angel.save.model.path", "model", "--angel.log.path", str(job / "runs"),
        "--angel.predict.data.path", "in.csv", "--angel.predict.out.path", "model/pred.csv",
    ]  # fmt: skip
    said = "writes into the model directory that training saves to"
    line = (
        f"{_OUT}={save / 'pred.csv'} (command line) {said} {_SAVE}={save} (command line): "
        "predictions do not belong in a checkpoint; choose a path outside it"
    )
    _refused(job, capsys, argv, line)
    # angelps train with action.type=train_predict: the same check, on the paths as written
    line = (
        f"{_OUT}=model/pred.csv (command line) {said} {_SAVE}=model (command line): "
        "predictions do not belong in a checkpoint; choose a path outside it"
    )
    _refused(job, capsys, ["train", *argv[1:]], line)
    argv[-1] = "in.csv"
    line = (
        f"{_OUT}={job / 'in.csv'} (command line) is the input {_DATA}={job / 'in.csv'} "
        "(command line): predictions would replace the data; choose another file"
    )
    _refused(job, capsys, argv, line)


def _conf(**values: str) -> Config:
    keys = all_keys()
    return Config({}, {}, keys).with_overrides(values, "test")


@pytest.mark.parametrize(
    ("data", "model", "out", "said"),
    [
        ("s3://b/in.csv", "s3://b/m", "s3://b/in.csv", "is the input"),
        ("s3://b/parts/", "s3://b/m", "s3://b/parts", "writes into the input directory"),
        ("s3://b/parts", "s3://b/m", "s3://b/parts/x.csv", "writes into the input directory"),
        ("s3://b/in.csv", "s3://b/m/", "s3://b/m", "writes into the model directory"),
        ("gs://b/in.csv", "gs://b/m", "gs://b/m/manifest.csv", "writes into the model directory"),
    ],
)
def test_urls_compare_as_strings(data: str, model: str, out: str, said: str) -> None:
    """On object storage: the URLs as strings (a trailing / aside), before any store answers."""
    conf = _conf(**{_DATA: data, _LOAD: model, _OUT: out, "action.type": "predict"})
    with pytest.raises(ConfigError, match=said):
        check_out(conf, JobAction.from_config(conf))


def test_urls_beside_the_input_and_the_model_pass_these_checks() -> None:
    """Only the same URL, or one under the input's or the model's prefix, is refused (and a
    local path is never the same as a URL)."""
    from learners.cli import predict

    assert predict._target("s3://b/out") == "s3://b/out/predictions.csv"
    assert not predict._inside(predict._target("s3://b/mx/p.csv"), "s3://b/m")
    assert not predict._same(predict._target("s3://b/in.csv.csv"), "s3://b/in.csv")
    assert not predict._inside(predict._target("/b/in.csv"), "s3://b")
    assert not predict._same(predict._target("/b/in.csv"), "s3://b/in.csv")


def test_a_separate_output_still_works(
    job: Path, capsys: pytest.CaptureFixture[str], ray_local: None
) -> None:
    """A trained model: the refusals leave it as it was, and an output elsewhere is written."""
    model = job / "trained"
    argv = [
        "train", "--conf", str(ROOT / "conf" / "lr_a9a.properties"),
        "--angel.train.data.path", "in.csv", "--ml.epoch.num", "1",
        "--angel.save.model.path", str(model), "--angel.log.path", str(job / "runs"),
    ]  # fmt: skip
    assert main(argv) == 0
    _refused(job, capsys, _predict(str(model), "in.csv", str(model)), _into_model(model, model))
    line = _same_input(job / "in.csv", job / "in.csv")
    _refused(job, capsys, _predict(str(model), "in.csv", "in.csv"), line)
    before = _snapshot(model), (job / "in.csv").read_bytes()
    capsys.readouterr()
    assert main(_predict(str(model), "in.csv", "pred.csv")) == 0
    assert f"wrote {ROWS} predictions to {job / 'pred.csv'}" in capsys.readouterr().err
    assert len((job / "pred.csv").read_text().splitlines()) == ROWS + 1  # a header, one per row
    assert (_snapshot(model), (job / "in.csv").read_bytes()) == before


def test_an_output_named_like_another_file_type_is_said_to_be_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "in.libsvm"
    data.write_text("1 3:1\n")
    out = tmp_path / "pred.txt"
    conf = _conf(**{_DATA: str(data), _OUT: str(out), "action.type": "predict"})
    assert check_out(conf, JobAction.from_config(conf)) == out / "predictions.csv"
    assert capsys.readouterr().err == (
        f"angelps: note: {_OUT}={out} (test) has no .csv or .parquet suffix: it is made a "
        f"folder (Angel's layout) and the predictions go to {out / 'predictions.csv'}\n"
    )
    folder = tmp_path / "preds"  # a plain folder name: nothing to say
    conf = _conf(**{_DATA: str(data), _OUT: str(folder), "action.type": "predict"})
    assert check_out(conf, JobAction.from_config(conf)) == folder / "predictions.csv"
    assert capsys.readouterr().err == ""
