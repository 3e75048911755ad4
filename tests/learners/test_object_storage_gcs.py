"""Every path key on gs://: a local GCS emulator (gcp-storage-emulator, 127.0.0.1, a free port,
named by ``CLOUD_STORAGE_EMULATOR_ENDPOINT``) holds the data, the checkpoint, the predictions and
the run log of a real job on a local Ray.

The same job trained from local files and from gs:// gives the same metrics and predictions
(BSP, the same seed); a missing bucket, a missing input or an unreachable endpoint is one line
naming the key, exit 2, before Ray starts and with nothing written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from angelps import fs
from tests.learners.store_jobs import bad, job, local_ray, metrics, predict, sample, train
from tests.object_store import gcs_server, make_bucket, upload_tree

# (whole jobs on the GCS emulator: the e2e tier, which CI runs after the default suite)
pytestmark = pytest.mark.e2e

DATA = "gs://angel/data/a9a"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The emulator's environment (set for this module: Ray's workers inherit it), a bucket
    ``angel`` holding ``data/a9a/part-0.libsvm``, and the same data locally (``data``)."""
    data = sample(tmp_path_factory.mktemp("gcs"))
    with gcs_server() as env, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("STORAGE_EMULATOR_HOST", raising=False)
        make_bucket(env, "angel")
        upload_tree(env, str(data), DATA)
        yield {**env, "data": str(data)}


@pytest.fixture(scope="module")
def ray_gcs(gcs) -> Iterator[None]:
    """A local Ray started after the emulator's environment is set."""
    with local_ray():
        yield


def test_train_predict_on_gcs_equal_the_local_run(gcs, ray_gcs, tmp_path) -> None:
    local = train(job(tmp_path, gcs["data"], str(tmp_path / "model"), str(tmp_path / "log")))
    remote = train(job(tmp_path, DATA, "gs://angel/model", "gs://angel/log"))
    assert remote["epochs"] == 2 and remote["checkpoint"] == "gs://angel/model"
    assert remote["checkpoint_failures"] == 0
    assert metrics(remote) == metrics(local) and remote["train_loss"] == local["train_loss"]
    # The checkpoint is committed on GCS (a pointer naming the generations of epochs 2 and 1,
    # nothing else), the run's log uploaded.
    names = [n for n, _ in fs.list_dir("gs://angel/model")]
    pointer = json.loads(fs.read_bytes("gs://angel/model/LATEST.json"))
    assert names == sorted([pointer["previous"], pointer["current"], "LATEST.json"])
    assert pointer["current"] > pointer["previous"] and pointer["kept"] == []
    run = fs.read_bytes("gs://angel/log/latest").decode().strip()
    rows = fs.read_bytes(f"gs://angel/log/{run}/metrics.jsonl").decode().splitlines()
    assert sum(json.loads(r)["kind"] == "epoch" for r in rows) == 2
    # Predictions from the GCS model, of GCS data, to GCS, equal the local model's.
    predict(str(tmp_path / "model"), gcs["data"], str(tmp_path / "pred.csv"))
    predict("gs://angel/model", DATA, "gs://angel/pred/out.csv")
    want = pacsv.read_csv(tmp_path / "pred.csv")
    got = pacsv.read_csv(pa.BufferReader(fs.read_bytes("gs://angel/pred/out.csv")))
    assert got.num_rows > 0 and got.equals(want)


def _bucket() -> list[str]:
    return [n for n, _ in fs.list_dir("gs://angel")]


def test_missing_bucket_or_input_is_one_line_naming_the_key(gcs, tmp_path, capsys) -> None:
    before = _bucket()
    conf = job(tmp_path, DATA, "gs://angel/m-bad", str(tmp_path / "log"))
    line = bad(conf, capsys, "angel.save.model.path", "gs://no-such-bucket/model", tmp_path / "log")
    assert line == (
        "angelps: error: angel.save.model.path=gs://no-such-bucket/model "
        "(command line): the bucket no-such-bucket does not exist"
    )
    line = bad(conf, capsys, "angel.train.data.path", "gs://angel/data/none", tmp_path / "log")
    assert line.endswith("gs://angel/data/none (command line): no such file or directory")
    assert _bucket() == before  # nothing written in the bucket


def test_unreachable_endpoint_is_one_line_in_seconds(
    gcs, tmp_path: Path, capsys, monkeypatch
) -> None:
    conf = job(tmp_path, gcs["data"], "gs://angel/m-x", str(tmp_path / "log"))
    monkeypatch.setenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", "http://127.0.0.1:9")  # nothing there
    line = bad(conf, capsys, "angel.save.model.path", "gs://angel/m-x", tmp_path / "log")
    assert "(command line): cannot reach the store (CLOUD_STORAGE_EMULATOR_ENDPOINT, " in line
    assert "Could not connect to server" in line
    monkeypatch.undo()
    assert "m-x" not in _bucket()
