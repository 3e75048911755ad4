"""Every path key on object storage: a local S3 server (moto, 127.0.0.1, a free port) holds the
data, the checkpoints, the predictions and the run logs of real jobs on a local Ray.

The same job trained from local files and from s3:// gives the same metrics and predictions
(BSP, the same seed); a bad bucket, bad credentials or an unreachable endpoint is one line
naming the key, exit 2, before Ray starts and with nothing written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from angelps import fs
from learners.cli.main import main
from tests.learners.store_jobs import bad, job, local_ray, metrics, predict, sample, train
from tests.object_store import make_bucket, require_auth, s3_server, upload_tree


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


def test_train_predict_on_s3_equal_the_local_run(s3, ray_s3, tmp_path) -> None:
    local = train(job(tmp_path, s3["data"], str(tmp_path / "model"), str(tmp_path / "log")))
    remote = train(job(tmp_path, "s3://angel/data/a9a", "s3://angel/model", "s3://angel/log"))
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
