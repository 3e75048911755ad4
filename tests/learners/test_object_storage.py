"""Every path key on object storage: a local S3 server (moto, 127.0.0.1, a free port) holds the
data, the checkpoints, the predictions and the run logs of real jobs on a local Ray.

The same job trained from local files and from s3:// gives the same metrics and predictions
(BSP, the same seed); the kept checkpoints (keep.last, keep.best) are copies at the local
layout's names, loadable, and pruning removes nothing but them; a bad bucket, bad credentials or
an unreachable endpoint is one line naming the key, exit 2, before Ray starts and with nothing
written. A run logged to s3:// is named by its URL, and `angelps plot` draws it from there as
from its local copy.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from angelps import fs
from angelps.checkpoint import files as checkpoint
from angelps.checkpoint import remote as checkpoint_remote
from learners.cli.main import main
from learners.job.saved_model import dense_blob
from learners.runs.folders import log_root
from learners.runs.retention import Checkpoints
from tests.learners.store_jobs import ROWS, bad, job, local_ray, metrics, predict, sample, train
from tests.object_store import make_bucket, require_auth, s3_server, upload_tree

# (whole jobs on the S3 emulator: the e2e tier, which CI runs after the default suite)
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The server's environment (set for this module: Ray's workers inherit it), a bucket
    ``angel`` holding ``data/a9a/part-0.libsvm``, and the same data locally (``local``)."""
    tmp = tmp_path_factory.mktemp("objstore")
    data = sample(tmp)
    with s3_server() as env, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        make_bucket(env, "angel")
        upload_tree(env, str(data), "s3://angel/data/a9a")
        yield {**env, "local": str(tmp), "data": str(data)}


@pytest.fixture(scope="module")
def ray_s3(s3) -> Iterator[None]:
    """A local Ray started after the S3 environment is set, so that its workers have it."""
    with local_ray():
        yield


@pytest.fixture(scope="module")
def s3_run(s3, ray_s3, tmp_path_factory) -> dict[str, Any]:
    """One job with every path on s3:// (its log under ``s3://angel/log``), trained once for
    the tests that read what it left: its summary and what it printed (out, err)."""
    tmp = tmp_path_factory.mktemp("s3run")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        summary = train(job(tmp, "s3://angel/data/a9a", "s3://angel/model", "s3://angel/log"))
    return {"summary": summary, "out": out.getvalue(), "err": err.getvalue()}


def test_train_predict_on_s3_equal_the_local_run(s3, s3_run, tmp_path) -> None:
    local = train(job(tmp_path, s3["data"], str(tmp_path / "model"), str(tmp_path / "log")))
    remote = s3_run["summary"]
    assert metrics(remote) == metrics(local)
    # The checkpoint is committed on S3 (pointer + generation), the run's log uploaded.
    names = [n for n, _ in fs.list_dir("s3://angel/model")]
    assert "LATEST.json" in names and any(n.startswith("gen-") for n in names)
    run = fs.read_bytes("s3://angel/log/latest").decode().strip()
    rows = fs.read_bytes(f"s3://angel/log/{run}/metrics.jsonl").decode().splitlines()
    assert sum(json.loads(r)["kind"] == "epoch" for r in rows) == 2
    # Predictions from the S3 model, of S3 data, to S3, equal the local model's.
    predict(str(tmp_path / "model"), s3["data"], str(tmp_path / "pred.csv"))
    predict("s3://angel/model", "s3://angel/data/a9a", "s3://angel/pred/out.csv")
    want = pacsv.read_csv(tmp_path / "pred.csv")
    got = pacsv.read_csv(pa.BufferReader(fs.read_bytes("s3://angel/pred/out.csv")))
    assert got.equals(want)


def test_a_run_logged_to_s3_is_named_by_its_url(s3_run) -> None:
    run = fs.read_bytes("s3://angel/log/latest").decode().strip()
    assert re.fullmatch(r"objstore-\d{8}-\d{6}(-\d+)?", run)
    url = f"s3://angel/log/{run}"
    # The done line, the job's summary (--summary-json) and the run's own summary name the URL.
    done = s3_run["out"].strip().splitlines()[-1]
    assert re.fullmatch(
        r"done: 2 epochs, [0-9.]+ s, valid_auc 0\.\d{4}, valid_logloss 0\.\d{4}, "
        r"valid_accuracy 0\.\d{4}; best epoch 2 \(valid_auc 0\.\d{4}\) at "
        rf"s3://angel/model\.best; checkpoint s3://angel/model \(epoch 2\); run {url}",
        done,
    ), done
    assert s3_run["summary"]["run_dir"] == url
    assert json.loads(fs.read_bytes(f"{url}/summary.json"))["run_dir"] == url
    last = fs.read_bytes(f"{url}/metrics.jsonl").decode().splitlines()[-1]
    assert json.loads(last)["kind"] == "summary" and json.loads(last)["run_dir"] == url
    # The staging folder is no part of what the user is told (nothing failed).
    staging = log_root("s3://angel/log")
    assert (Path(staging) / run / "metrics.jsonl").is_file()
    assert staging not in s3_run["out"] + s3_run["err"]


def _plot(capsys, out: Path, *args: str) -> bytes:
    assert main(["plot", *args, "--out", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote {out}\n"
    return out.read_bytes()


def test_plot_of_a_run_on_s3_equals_the_plot_of_its_local_copy(s3_run, tmp_path, capsys) -> None:
    url = s3_run["summary"]["run_dir"]
    run = posixpath.basename(url)
    want = _plot(capsys, tmp_path / "local.png", str(Path(log_root("s3://angel/log")) / run))
    assert want[:8] == b"\x89PNG\r\n\x1a\n" and len(want) > 20_000
    forms = {
        "run": [url],
        "metrics": [f"{url}/metrics.jsonl"],
        "root": ["s3://angel/log/"],
        "latest": ["--log-dir", "s3://angel/log"],
        "name": [run, "--log-dir", "s3://angel/log"],
    }
    got = {k: _plot(capsys, tmp_path / f"{k}.png", *args) for k, args in forms.items()}
    assert {k: v == want for k, v in got.items()} == dict.fromkeys(forms, True)


_START = {"kind": "start", "run": "r1", "job": "lr", "updates_per_epoch": 2}
_EPOCH = {"kind": "epoch", "epoch": 0, "step": 2, "lr": 0.1, "train_loss": 0.5, "valid_auc": 0.8}


def _plot_error(capsys, tmp_path: Path, *args: str) -> str:
    """The one error line of ``angelps plot ARGS``: exit 2, no image."""
    out = tmp_path / "never.png"
    code = main(["plot", *args, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert not out.exists()
    return err[0]


def test_plot_on_s3_errors_are_one_line_naming_the_path(s3, tmp_path, capsys) -> None:
    # A log root without `latest`, one run in it, and a run whose metrics file is damaged.
    good = json.dumps(_START) + "\n" + json.dumps(_EPOCH) + "\n"
    fs.write_bytes("s3://angel/plots/r1/metrics.jsonl", good.encode())
    fs.write_bytes("s3://angel/plots/bad/metrics.jsonl", (good + "not json\n").encode())
    assert _plot(capsys, tmp_path / "r1.png", "s3://angel/plots/r1")[:4] == b"\x89PNG"
    err = "angelps: error: "
    assert _plot_error(capsys, tmp_path, "s3://angel/plots/nope") == (
        f"{err}s3://angel/plots/nope: no such run, run directory or metrics file"
    )
    assert _plot_error(capsys, tmp_path, "nope", "--log-dir", "s3://angel/plots") == (
        f"{err}nope: no such run, run directory or metrics file; runs under s3://angel/plots: "
        "bad, r1"
    )
    assert _plot_error(capsys, tmp_path, "--log-dir", "s3://angel/plots") == (
        f"{err}no runs under s3://angel/plots (no s3://angel/plots/latest): name a run, a run "
        "directory or a metrics.jsonl file, or point --log-dir at angel.log.path"
    )
    assert _plot_error(capsys, tmp_path, "s3://angel/plots/bad") == (
        f"{err}s3://angel/plots/bad/metrics.jsonl:3: not a JSON object (Expecting value): "
        "'not json'"
    )
    assert _plot_error(capsys, tmp_path, "s3://no-such-bucket/runs") == (
        f"{err}s3://no-such-bucket/runs: the bucket no-such-bucket does not exist"
    )
    require_auth(s3, on=True)  # the server now refuses keys it does not know
    try:
        line = _plot_error(capsys, tmp_path, "--log-dir", "s3://angel/plots")
    finally:
        require_auth(s3, on=False)
    assert line.startswith(
        f"{err}s3://angel/plots: the store refused the credentials (AWS_ACCESS_KEY_ID, ...): "
    ), line


@pytest.mark.slow
def test_resume_and_evaluate_from_s3_equal_the_local_run(s3, ray_s3, tmp_path, capsys) -> None:
    lm, rm = str(tmp_path / "model"), "s3://angel/resume-model"
    train(job(tmp_path, s3["data"], lm, str(tmp_path / "log")))
    train(job(tmp_path, "s3://angel/data/a9a", rm, str(tmp_path / "log2")))
    local = train(job(tmp_path, s3["data"], lm, str(tmp_path / "log"), epochs=3), "--resume")
    remote = train(
        job(tmp_path, "s3://angel/data/a9a", rm, str(tmp_path / "log2"), epochs=3), "--resume"
    )
    assert metrics(remote) == metrics(local)
    capsys.readouterr()
    assert main(["evaluate", "--model", lm, "--input", s3["data"], "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert main(["evaluate", "--model", rm, "--input", "s3://angel/data/a9a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == want


def _writer(epoch: int):
    """A checkpoint writer with the real commit on S3: a manifest whose learner section records
    ``epoch`` (0-based) and one file of its own."""

    def write(path: str) -> None:
        tmp = checkpoint.new_tmp_dir(path)
        fs.write_bytes(f"{tmp}/w.bin", bytes([epoch]) * 100)
        extra = {"learner": {"epoch": epoch}}
        checkpoint.write_manifest(tmp, checkpoint.build_manifest([], 0, "hash", [], extra))
        checkpoint.commit_dir(tmp, path)

    return write


def _epoch(path: str) -> int:
    return int(checkpoint.read_manifest(path)["extra"]["learner"]["epoch"])


def test_keep_last_and_best_on_s3_prune_only_their_own_objects(s3) -> None:
    save = "s3://angel/kl/model"
    said: list[str] = []
    ck = Checkpoints(save + "/", keep_last=2, keep_best=True, warn=said.append)
    assert ck.save(_writer(0), 0, True)
    # Objects of someone else's under and beside the job's names, all to survive:
    foreign = [
        "s3://angel/kl/model.epoch-1/notes.txt",  # inside a copy the job will prune
        "s3://angel/kl/model/notes.txt",  # inside the checkpoint (it has its pointer)
        "s3://angel/kl/model.epoch-x/a",  # not an epoch number
        "s3://angel/kl/model.epoch-9",  # an object, not a prefix
        "s3://angel/kl/model.epochs/a",
        "s3://angel/kl/other/a",
    ]
    for url in foreign:
        fs.write_bytes(url, b"mine")
    # A later epoch's name (as a resumed run's leftovers would be), but not angelps's pointer.
    theirs = b'{"current": "v1"}'
    fs.write_bytes("s3://angel/kl/model.epoch-7/LATEST.json", theirs)
    for epoch, better in zip((1, 2, 3), (True, False, False), strict=True):  # best: epoch 2
        assert ck.save(_writer(epoch), epoch, better)
    assert said == [
        "angelps: warning: not removing s3://angel/kl/model.epoch-7: checkpoint file "
        "s3://angel/kl/model.epoch-7/LATEST.json is damaged: not an angelps pointer"
    ]  # once, not at every save
    assert fs.read_bytes("s3://angel/kl/model.epoch-7/LATEST.json") == theirs
    entries = [n for n, _ in fs.list_dir("s3://angel/kl")]
    assert entries == [
        "model",
        "model.best",
        "model.epoch-1",
        "model.epoch-3",
        "model.epoch-4",
        "model.epoch-7",
        "model.epoch-9",
        "model.epoch-x",
        "model.epochs",
        "other",
    ]
    assert all(fs.read_bytes(url) == b"mine" for url in foreign)
    assert fs.list_dir("s3://angel/kl/model.epoch-1") == [("notes.txt", False)]  # ours: gone
    epochs = {s: _epoch(f"s3://angel/kl/model{s}") for s in ("", ".epoch-3", ".epoch-4", ".best")}
    assert epochs == {"": 3, ".epoch-3": 2, ".epoch-4": 3, ".best": 1}
    assert checkpoint_remote.previous(save) is not None  # the latest keeps its previous
    assert ck.where(1) == f"{save}.best" and ck.where(3) == save
    assert ck.where(2) == f"{save}.epoch-3" and ck.where(0) is None
    resumed = Checkpoints(save, keep_last=2, keep_best=True)
    resumed.resumed(3)
    assert resumed.best_kept == 1  # read back from the copy's manifest


def test_train_on_s3_keeps_the_last_epochs_and_the_best_loadable(s3, ray_s3, tmp_path) -> None:
    save = "s3://angel/keep/model"
    conf = job(tmp_path, "s3://angel/data/a9a", save, str(tmp_path / "log"), epochs=4)
    summary = train(
        conf,
        "--set",
        "angel.save.model.keep.last=2",
        "--set",
        "angel.save.model.keep.best=true",
        "--set",
        "ml.early.stop.metric=valid_logloss",
    )
    assert [n for n, _ in fs.list_dir("s3://angel/keep")] == [
        "model",
        "model.best",
        "model.epoch-3",
        "model.epoch-4",
    ]
    rows = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    losses = [r["valid_logloss"] for r in map(json.loads, rows) if r["kind"] == "epoch"]
    best = min(range(4), key=lambda i: losses[i])
    assert summary["best_epoch"] == best + 1 and summary["best_checkpoint"] == f"{save}.best"
    assert summary["checkpoint"] == save and summary["checkpoint_epoch"] == 4
    # Each copy holds exactly the checkpoint saved after its epoch: the same manifest (every
    # file's SHA-256), and every file checked against it.
    latest = checkpoint.read_manifest(save)
    before = checkpoint_remote.previous(save)  # the checkpoint of epoch 3
    assert before is not None
    for kept, root, epoch in (
        (f"{save}.epoch-4", latest["root"], 3),
        (f"{save}.epoch-3", before, 2),
    ):
        got = checkpoint.read_manifest(kept)
        assert fs.read_bytes(f"{got['root']}/manifest.json") == fs.read_bytes(
            f"{root}/manifest.json"
        )
        assert fs.list_files(got["root"]) == fs.list_files(root)
        assert got["extra"]["learner"]["epoch"] == epoch
    for kept in (f"{save}.epoch-3", f"{save}.best"):  # every table file and the dense file
        dense_blob(checkpoint.verify(kept)["extra"]["learner"], kept)
    assert checkpoint.read_manifest(f"{save}.best")["extra"]["learner"]["epoch"] == best
    # A kept copy loads as the latest does: predictions of epoch-4 equal the latest's.
    predict(save, "s3://angel/data/a9a", "s3://angel/keep-pred/latest.csv")
    predict(f"{save}.epoch-4", "s3://angel/data/a9a", "s3://angel/keep-pred/kept.csv")
    latest_pred = fs.read_bytes("s3://angel/keep-pred/latest.csv")
    assert len(latest_pred.splitlines()) == ROWS + 1  # a header and one line per row
    assert fs.read_bytes("s3://angel/keep-pred/kept.csv") == latest_pred


def test_keeping_copies_beside_a_bucket_is_refused(s3, tmp_path, capsys) -> None:
    make_bucket(s3, "bare")
    conf = job(tmp_path, "s3://angel/data/a9a", "s3://bare", str(tmp_path / "log"))
    assert main(["train", "--conf", str(conf), "--set", "angel.save.model.keep.last=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "angelps: error: angel.save.model.keep.last=2 (command line) keeps copies beside the checkpoint "
        "(<path>.best, <path>.epoch-<n>), so angel.save.model.path=s3://bare "
        f"({conf}:12) must name a prefix inside the bucket, not the bucket itself"
    ]
    assert fs.list_dir("s3://bare") == []  # nothing written


def _bucket() -> list[str]:
    return [n for n, _ in fs.list_dir("s3://angel")]


def _bad(tmp_path: Path, capsys, key: str, value: str) -> str:
    """The one error line of a train job with ``key=value``; exit 2 in seconds, no log."""
    conf = job(tmp_path, "s3://angel/data/a9a", "s3://angel/m-bad", str(tmp_path / "log"))
    return bad(conf, capsys, key, value, tmp_path / "log")


def test_missing_bucket_is_one_line_naming_the_key(s3, tmp_path, capsys) -> None:
    before = _bucket()
    line = _bad(tmp_path, capsys, "angel.save.model.path", "s3://no-such-bucket/model")
    assert "bucket no-such-bucket does not exist" in line
    line = _bad(tmp_path, capsys, "angel.train.data.path", "s3://angel/data/none")
    assert "no such file or directory" in line
    # Shard backups on a URL are accepted, after the same check as every other URL key.
    line = _bad(tmp_path, capsys, "angel.ps.backup.path", "s3://no-such-bucket/bk")
    assert line == (
        "angelps: error: angel.ps.backup.path=s3://no-such-bucket/bk (command line): "
        "the bucket no-such-bucket does not exist"
    )
    assert _bucket() == before  # nothing written in the bucket


def test_bad_credentials_are_one_line_naming_the_key(s3, tmp_path, capsys) -> None:
    before = _bucket()
    require_auth(s3, on=True)  # the server now refuses keys it does not know
    try:
        line = _bad(tmp_path, capsys, "angel.train.data.path", "s3://angel/data/a9a")
    finally:
        require_auth(s3, on=False)
    assert "refused the credentials" in line
    assert _bucket() == before


def test_unreachable_endpoint_is_one_line_in_seconds(s3, tmp_path, capsys, monkeypatch) -> None:
    conf = job(tmp_path, s3["data"], "s3://angel/m-x", str(tmp_path / "log"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    t = time.monotonic()
    assert main(["train", "--conf", str(conf)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert time.monotonic() - t < 25
    assert len(err) == 1 and "angel.save.model.path=s3://angel/m-x" in err[0], err
    assert "cannot reach the store" in err[0]
    assert not (tmp_path / "log").exists()
