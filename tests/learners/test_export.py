"""Checkpoints the ecosystem reads: dense layers as safetensors beside the Parquet tables, and
``angelps export`` (one torch state_dict) reproducing the model's predictions."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from angelps.checkpoint import files as checkpoint
from learners import GraphLearner
from learners.cli.main import main
from learners.worker.dense import read_dense
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]


def _train(conf: str, data: str, tmp: Path, rows: int, name: str) -> tuple[Path, Path]:
    lines = (ROOT / data).read_text().splitlines()[:rows]
    part = tmp / f"{name}.data"
    part.write_text("\n".join(lines) + "\n")
    learner = GraphLearner.from_properties(
        ROOT / "conf" / conf,
        {
            "angel.train.data.path": str(part),
            "ml.epoch.num": 1,
            "angel.save.model.path": str(tmp / name),
            "angel.log.path": str(tmp / f"{name}-log"),
            "angel.job.name": f"export_{name}",
            "ml.model.hidden.layers": "8",
        }
        if "deepfm" in conf
        else {
            "angel.train.data.path": str(part),
            "ml.epoch.num": 1,
            "angel.save.model.path": str(tmp / name),
            "angel.log.path": str(tmp / f"{name}-log"),
            "angel.job.name": f"export_{name}",
        },
        quiet=True,
    )
    try:
        learner.train()
    finally:
        learner.shutdown()
    return tmp / name, part


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    ray_tmp = short_tmp()  # (Ray's socket paths stay under 107 bytes)
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=ray_tmp, namespace="angelps")
    lr = _train("lr_a9a.properties", "data/a9a/a9a_123d_train.libsvm", tmp, 600, "lr")
    deepfm = _train(
        "deepfm_census.properties", "data/census/census_148d_train.dummy", tmp, 600, "fm"
    )
    yield {"lr": lr, "deepfm": deepfm, "tmp": tmp}
    ray.shutdown()
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_dense_layers_are_safetensors_covered_by_the_manifest(models, tmp_path, capsys) -> None:
    from safetensors.torch import load_file

    model, data = models["deepfm"]
    tensors = load_file(model / "dense.safetensors")
    mlp = {k for k in tensors if k.startswith("model/mlp.")}
    assert mlp and all(tensors[k].dtype == torch.float32 for k in mlp)
    extra = json.loads((model / "manifest.json").read_text())["extra"]["learner"]
    assert "dense_npz_b64" not in extra and extra["dense"]["file"] == "dense.safetensors"
    # A flipped byte in the dense file: refused with one line, nothing written.
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    raw = bytearray((bad / "dense.safetensors").read_bytes())
    raw[-1] ^= 0xFF
    (bad / "dense.safetensors").write_bytes(bytes(raw))
    out = tmp_path / "p.csv"
    argv = ["predict", "--model", str(bad), "--input", str(data), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"angelps: error: checkpoint file {bad / 'dense.safetensors'} is damaged: its SHA-256 "
        "does not match the manifest\n"
    )
    assert not out.exists()


@pytest.mark.slow
def test_checkpoints_with_the_older_npz_in_the_manifest_are_still_read(models, tmp_path) -> None:
    model, data = models["deepfm"]
    old = tmp_path / "old"
    shutil.copytree(model, old)
    arrays, meta = read_dense((old / "dense.safetensors").read_bytes())
    buf = io.BytesIO()
    np.savez(buf, **arrays, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    manifest = checkpoint.read_manifest(str(old))
    learner = manifest["extra"]["learner"]
    del learner["dense"]
    learner["dense_npz_b64"] = base64.b64encode(buf.getvalue()).decode("ascii")
    del manifest["root"], manifest["manifest_sha256"]
    checkpoint.write_manifest(str(old), manifest)
    (old / "dense.safetensors").unlink()
    with GraphLearner.load(model) as a:
        new_pred = a.predict(data)
    with GraphLearner.load(old) as b:
        old_pred = b.predict(data)
    np.testing.assert_array_equal(old_pred, new_pred)


@pytest.mark.slow
def test_export_reproduces_the_models_predictions(models, tmp_path, capsys) -> None:
    model, data = models["lr"]
    out = tmp_path / "lr.pt"
    assert main(["export", "--model", str(model), "--out", str(out)]) == 0
    assert f"wrote 2 tensors to {out}" in capsys.readouterr().err
    state = torch.load(out, weights_only=True)
    assert set(state) == {"ps.weight", "ps.bias"}
    assert tuple(state["ps.weight"].shape) == (123, 1)
    # LR by hand from the exported tensors: sigmoid(sum of the row's weights + bias).
    w, b = state["ps.weight"].double().numpy()[:, 0], float(state["ps.bias"][0, 0])
    rows = [line.split()[1:] for line in Path(data).read_text().splitlines()]
    margin = np.array(
        [sum(w[int(t.split(":")[0]) - 1] * float(t.split(":")[1]) for t in r) for r in rows]
    )
    with GraphLearner.load(model) as learner:
        pred = learner.predict(data)
    np.testing.assert_allclose(1 / (1 + np.exp(-(margin + b))), pred, rtol=1e-5, atol=1e-6)
    # DeepFM: the tables and the MLP's own state_dict names.
    fm = tmp_path / "fm.pt"
    assert main(["export", "--model", str(models["deepfm"][0]), "--out", str(fm)]) == 0
    fm_state = torch.load(fm, weights_only=True)
    assert tuple(fm_state["ps.embedding"].shape) == (148, 8)
    assert {"ps.wide", "ps.wide_bias"} <= set(fm_state)
    assert any(k.startswith("dense.mlp.") for k in fm_state)


@pytest.mark.slow
def test_export_over_the_size_limit_is_refused(models, tmp_path, capsys) -> None:
    out = tmp_path / "big.pt"
    out.write_text("kept")
    argv = ["export", "--model", str(models["deepfm"][0]), "--out", str(out), "--max-mb", "0.001"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"angelps: error: the model in {models['deepfm'][0]} takes ")
    assert "over the limit of 1048 bytes (--max-mb): raise --max-mb" in err
    assert out.read_text() == "kept"


@pytest.mark.slow
def test_a_job_whose_tables_differ_from_the_saved_model_is_refused(models, tmp_path, capsys):
    model, data = models["deepfm"]
    out = tmp_path / "p.csv"
    argv = ["predict", "--model", str(model), "--input", str(data), "--out", str(out)]
    assert main([*argv, "--ml.fm.rank", "4"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"angelps: error: angel.load.model.path={model}: the saved DeepFM model's tables do not "
        "match the job's model (embedding: sparse 148 x 8 there, sparse 148 x 4 here); the job "
        "sets ml.fm.rank=4 (command line)\n"
    )
    assert not out.exists()
