"""Models that leave the engine: ``angelps export --format safetensors|torchscript|onnx|torch``
and ``GraphLearner.load(path)`` predicting small inputs in-process (learners/runs/standalone.py,
learners/runs/export_formats.py, learners/job/local_predict.py).

Three real models (LR on a9a, FM and DeepFM on census) are trained once; the TorchScript file
is loaded in a fresh interpreter that imports torch alone, and its predictions are compared
with ``angelps predict`` on the same rows.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pytest
import ray
import torch

from angelconf.config import load_config
from learners import GraphLearner
from learners.cli.main import main
from learners.data import DataOptions
from learners.data.problems import DataError
from learners.data.reader import load_file
from learners.keys import all_keys
from learners.runs.export_formats import format_of
from learners.runs.standalone import padded
from tests.short_tmp import short_tmp

ROOT = Path(__file__).resolve().parents[2]
ROWS = 400


def _train(conf: str, data: str, tmp: Path, name: str, extra: dict) -> tuple[Path, Path]:
    lines = (ROOT / data).read_text().splitlines()[:ROWS]
    part = tmp / f"{name}.data"
    part.write_text("\n".join(lines) + "\n")
    sets = {
        "angel.train.data.path": str(part),
        "ml.epoch.num": 1,
        "angel.save.model.path": str(tmp / name),
        "angel.log.path": str(tmp / f"{name}-log"),
        "angel.job.name": f"fmt_{name}",
        **extra,
    }
    learner = GraphLearner.from_properties(ROOT / "conf" / conf, sets, quiet=True)
    try:
        learner.train()
    finally:
        learner.shutdown()
    return tmp / name, part


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("formats")
    ray_tmp = short_tmp()  # (Ray's socket paths stay under 107 bytes)
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=ray_tmp, namespace="angelps")
    out = {
        "lr": _train("lr_a9a.properties", "data/a9a/a9a_123d_train.libsvm", tmp, "lr", {}),
        "fm": _train("fm_census.properties", "data/census/census_148d_train.dummy", tmp, "fm", {}),
        "deepfm": _train(
            "deepfm_census.properties",
            "data/census/census_148d_train.dummy",
            tmp,
            "deepfm",
            {"ml.model.hidden.layers": "16,8"},
        ),
    }
    yield out
    ray.shutdown()
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _cli_predictions(model: Path, data: Path, tmp: Path) -> np.ndarray:
    out = tmp / f"{model.name}-pred.csv"
    assert main(["predict", "--model", str(model), "--input", str(data), "--out", str(out)]) == 0
    return pacsv.read_csv(out).column("pred").to_numpy()


def _inputs(model: Path, data: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``data`` as padded (ids, values), read as the model's job reads them."""
    info = json.loads((model / "manifest.json").read_text())["extra"]["learner"]
    conf = load_config(None, dict(info["conf"]), all_keys())
    batch = load_file(str(data), DataOptions.from_config(conf))
    return padded(batch.indptr, batch.ids, batch.values)


_ALONE = """
import sys, torch
module = torch.jit.load(sys.argv[1])
ids, values = torch.load(sys.argv[2])
pred = module(ids, values)
bad = [m for m in sys.modules if m.split(".")[0] in ("learners", "angelps", "ray", "decay")]
torch.save((pred, bad), sys.argv[3])
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lr", "fm", "deepfm"])
def test_torchscript_predicts_with_torch_alone_as_angelps_predict(models, name, tmp_path) -> None:
    model, data = models[name]
    ts = tmp_path / f"{name}.pt"
    assert main(["export", "--model", str(model), "--format", "torchscript", "--out", str(ts)]) == 0
    ids, values = _inputs(model, data)
    if name == "lr":  # rows of different lengths: -1 pads them
        assert bool((ids < 0).any())
    torch.save((ids, values), tmp_path / "in.pt")
    subprocess.run(
        [sys.executable, "-c", _ALONE, str(ts), str(tmp_path / "in.pt"), str(tmp_path / "o.pt")],
        check=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    pred, imported = torch.load(tmp_path / "o.pt")
    assert imported == []
    expected = _cli_predictions(model, data, tmp_path)
    assert pred.shape == (ROWS,)
    np.testing.assert_allclose(pred.numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_safetensors_are_the_checkpoints_weights_under_its_names(models, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.numpy import load_file as load_st

    model, _ = models["deepfm"]
    out = tmp_path / "deepfm.safetensors"
    assert main(["export", "--model", str(model), "--out", str(out)]) == 0
    assert f"to {out} (safetensors)" in capsys.readouterr().err
    tensors = load_st(str(out))
    dense = load_st(str(model / "dense.safetensors"))
    tables = [t["name"] for t in json.loads((model / "manifest.json").read_text())["tables"]]
    # weights only: the checkpoint's table names and its dense layers' names, no optimizer state
    assert set(tensors) == set(tables) | {k for k in dense if k.startswith("model/")}
    assert tensors["embedding"].shape == (148, 8) and tensors["wide"].shape == (148, 1)
    for k in tensors:
        if k.startswith("model/"):
            np.testing.assert_array_equal(tensors[k], dense[k])
    with safe_open(str(out), "np") as f:
        assert f.metadata()["model"] == "DeepFM"


@pytest.mark.slow
def test_loaded_model_predicts_small_inputs_in_process_as_ray_does(models) -> None:
    model, _ = models["fm"]
    rows = (ROOT / "data/census/census_148d_train.libsvm").read_text().splitlines()[:5]
    x = np.zeros((5, 148))
    for r, line in enumerate(rows):
        for tok in line.split()[1:]:
            i, v = tok.split(":")
            x[r, int(i) - 1] = float(v)
    labels = np.array([float(line.split()[0]) for line in rows])
    local = GraphLearner.load(model)
    try:
        assert local.actors.workers is None  # no actors for a small input
        got = local.predict_rows(x, labels=labels)
        assert local.actors.workers is None
    finally:
        local.shutdown()
    with GraphLearner.load(model, {"angel.predict.local.max.rows": 0}) as remote:
        want = remote.predict_rows(x, labels=labels)
    np.testing.assert_allclose(got["pred"], want["pred"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got["label"], want["label"])


@pytest.mark.slow
@pytest.mark.parametrize("local_rows", [10000, 0])
def test_bad_in_memory_inputs_are_one_line_errors(models, local_rows) -> None:
    model, _ = models["lr"]
    with GraphLearner.load(model, {"angel.predict.local.max.rows": local_rows}) as learner:
        with pytest.raises(
            DataError,
            match=r"^numpy input: 200 columns, but the model has 123 features \(column j is "
            r"feature id j\): pass arrays of at most that width$",
        ):
            learner.predict(np.ones((2, 200)))
        with pytest.raises(DataError, match=r"^numpy input: row 1: a value is not finite$"):
            learner.predict(np.array([[1.0, 0.0], [np.nan, 1.0]]))
        import pyarrow as pa

        table = pa.table({"ids": [[1, 2], [5, 123]]})
        with pytest.raises(
            DataError,
            match=r"^table: row 1: a feature id is outside ml.feature.index.range=123 "
            r"\(valid: 0\.\.122\)",
        ):
            learner.predict(table)


def test_an_extension_that_disagrees_with_the_format_is_refused(tmp_path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    cases = [
        (
            ["--out", str(tmp_path / "m.safetensors"), "--format", "torch"],
            f"--out {tmp_path / 'm.safetensors'} does not fit --format torch: a torch file is "
            "named .pt or .pth (e.g. m.pt)",
        ),
        (
            ["--out", str(tmp_path / "m.pt"), "--format", "onnx"],
            f"--out {tmp_path / 'm.pt'} does not fit --format onnx: a onnx file is named .onnx "
            "(e.g. m.onnx)",
        ),
        (
            ["--out", str(tmp_path / "m.bin")],
            f"--out {tmp_path / 'm.bin'}: the extension .bin names no format: pass --format "
            "torch|safetensors|torchscript|onnx or name a .onnx, .pt, .pth, .safetensors, "
            ".torchscript, .ts file",
        ),
        (
            ["--out", str(tmp_path / "m.pt"), "--format", "keras"],
            "--format keras is not valid: expected one of torch, safetensors, torchscript, onnx",
        ),
    ]
    (tmp_path / "data.libsvm").write_text("1 3:1\n")
    cases += [
        (
            ["--out", str(tmp_path / "data.libsvm" / "m.pt")],
            f"--out {tmp_path / 'data.libsvm' / 'm.pt'}: {tmp_path / 'data.libsvm'} is a file, "
            "not a directory",  # (it said: the directory ... does not exist)
        ),
        (
            ["--out", str(model / "m.pt")],
            f"--out {model / 'm.pt'} is inside the model directory --model {model}: an export "
            "does not belong in a checkpoint; choose a path outside it",
        ),
    ]
    for argv, message in cases:
        assert main(["export", "--model", str(model), *argv]) == 2
        assert capsys.readouterr().err == f"angelps: error: {message}\n"
        assert not list(tmp_path.glob("m.*")) and not list(model.iterdir())
    # the format in any case, and TorchScript by its own extensions
    assert format_of(tmp_path / "m.pt", "TorchScript") == "torchscript"
    assert format_of(tmp_path / "m.ts", None) == format_of(tmp_path / "m.torchscript", None)
    assert format_of(tmp_path / "m.ts", None) == "torchscript"
    assert format_of(tmp_path / "m.pt", None) == "torch"


@pytest.mark.slow
def test_onnx_export(models, tmp_path, capsys) -> None:
    import importlib.util

    model, data = models["lr"]
    out = tmp_path / "lr.onnx"
    code = main(["export", "--model", str(model), "--out", str(out)])
    if importlib.util.find_spec("onnx") is None:
        assert code == 2
        assert capsys.readouterr().err == (
            "angelps: error: --format onnx needs the onnx package (pip install onnx); "
            "--format torchscript needs torch alone\n"
        )
        pytest.skip("onnx is not installed: only its error is checked")
    assert code == 0 and out.stat().st_size > 0
    if importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("onnxruntime is not installed: the file is written, not run")
    import onnxruntime as ort

    ids, values = _inputs(model, data)
    session = ort.InferenceSession(str(out))
    (pred,) = session.run(None, {"ids": ids.numpy(), "values": values.numpy()})
    np.testing.assert_allclose(pred, _cli_predictions(model, data, tmp_path), atol=1e-6)
