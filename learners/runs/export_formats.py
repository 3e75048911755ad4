"""The formats of ``angelps export``: torch, safetensors, torchscript, onnx.

* ``torch``: ``torch.save`` of one state_dict (learners/runs/export.py: ``ps.<table>``,
  ``dense.<name>``);
* ``safetensors``: a real safetensors file of the weights only, named as the checkpoint names
  them: each PS table by its table name (``weight``, ``embedding``; rows by feature id; a table
  of unbounded keys adds ``<table>.keys``) and the worker-side layers as in the checkpoint's
  ``dense.safetensors`` (``model/mlp.0.weight``), with the model class in the metadata;
* ``torchscript``: :class:`learners.runs.standalone.Standalone` scripted, loadable with
  ``torch.jit.load`` alone: ``forward(ids [N, K] int64, -1 padded, values [N, K] float)`` →
  ``[N]`` probabilities (values for regression);
* ``onnx``: the same module through torch's ONNX exporter (needs the ``onnx`` package), with
  dynamic N and K.

The format comes from ``--format`` or from the file's extension; a name whose extension says
another format is refused rather than written under a misleading name. Every file is written
under a temporary name and renamed into place.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np

from angelconf.config import ConfigError
from angelps import TableSpec
from angelps.checkpoint import files as checkpoint
from learners.job import saved_model
from learners.runs.export import (
    check_export_size,
    export_state_dict,
    table_arrays,
    write_state_dict,
)
from learners.runs.output_file import replace_atomically
from learners.worker.dense import read_dense

__all__ = ["FORMATS", "export_model", "format_of"]

FORMATS = ("torch", "safetensors", "torchscript", "onnx")
#: The extensions each format's file may have (the first one is suggested).
_EXTENSIONS = {
    "torch": (".pt", ".pth"),
    "safetensors": (".safetensors",),
    "torchscript": (".pt", ".ts", ".torchscript"),
    "onnx": (".onnx",),
}


def format_of(out: Path, fmt: str | None) -> str:
    """The format to write ``out`` in: ``fmt`` when given and ``out``'s extension fits it,
    else the format its extension names. ConfigError when they disagree or neither says."""
    ext = out.suffix.lower()
    fmt = fmt.lower() if fmt is not None else None  # (as class names: any case)
    if fmt is None:
        # (.pt is torch's first: a TorchScript file by its extension is .ts or .torchscript)
        for name in ("torch", "safetensors", "onnx", "torchscript"):
            if ext in _EXTENSIONS[name]:
                return name
        raise ConfigError(
            f"--out {out}: the extension {ext or '(none)'} names no format: pass --format "
            f"{'|'.join(FORMATS)} or name a {', '.join(sorted({e for v in _EXTENSIONS.values() for e in v}))} file"
        )
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt} is not valid: expected one of {', '.join(FORMATS)}")
    if ext not in _EXTENSIONS[fmt]:
        good = _EXTENSIONS[fmt][0]
        raise ConfigError(
            f"--out {out} does not fit --format {fmt}: a {fmt} file is named "
            f"{' or '.join(_EXTENSIONS[fmt])} (e.g. {out.with_suffix(good).name})"
        )
    return fmt


def _safetensors(path: str, out: Path) -> list[tuple[str, tuple[int, ...], str]]:
    from safetensors.numpy import save_file

    info = saved_model.read_extra(path)["learner"]
    manifest = checkpoint.read_manifest(path)
    arrays: dict[str, np.ndarray] = {}
    for spec in (TableSpec.from_dict(d) for d in manifest["tables"]):
        for k, v in table_arrays(manifest, spec).items():
            name = k.removeprefix("ps.")
            arrays[
                name.removesuffix(".weight")
                if name.endswith(".weight") and name[:-7] == spec.name
                else name
            ] = v
    dense, _meta = read_dense(saved_model.dense_blob(info, path))
    arrays.update({k: v for k, v in dense.items() if k.startswith("model/")})
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    meta = {
        "model": str(info["model"]),
        "format": "angelps",
        "tables": json.dumps([d["name"] for d in manifest["tables"]]),
    }
    replace_atomically(out, lambda tmp: save_file(arrays, tmp, metadata=meta))
    return [(k, tuple(v.shape), str(v.dtype)) for k, v in arrays.items()]


def _example(module: object) -> tuple[object, object]:
    """Inputs of two rows that every standalone graph accepts (a field model: one id per
    field)."""
    import torch

    k = max(int(getattr(module, "num_fields", 0)), 1)
    return torch.zeros(2, k, dtype=torch.int64), torch.ones(2, k)


def _torchscript(path: str, out: Path) -> list[tuple[str, tuple[int, ...], str]]:
    import torch

    from learners.runs.standalone import load_standalone

    module = torch.jit.script(load_standalone(path))
    replace_atomically(out, lambda tmp: torch.jit.save(module, tmp))
    return [
        (k, tuple(v.shape), str(v.dtype).removeprefix("torch."))
        for k, v in module.state_dict().items()
    ]


def _onnx(path: str, out: Path) -> list[tuple[str, tuple[int, ...], str]]:
    if importlib.util.find_spec("onnx") is None:
        raise ConfigError(
            "--format onnx needs the onnx package (pip install onnx); --format torchscript "
            "needs torch alone"
        )
    import torch

    from learners.runs.standalone import load_standalone

    module = load_standalone(path)
    ids, values = _example(module)

    # The TorchScript-based exporter: torch.export (the default since torch 2.9) cannot trace
    # the module's data-dependent id check. (Older torch has no ``dynamo`` switch.)
    legacy: dict[str, Any] = (
        {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    )

    def write(tmp: str) -> None:
        torch.onnx.export(
            module,
            (ids, values),
            tmp,
            input_names=["ids", "values"],
            output_names=["pred"],
            dynamic_axes={"ids": {0: "n", 1: "k"}, "values": {0: "n", 1: "k"}, "pred": {0: "n"}},
            **legacy,
        )

    replace_atomically(out, write)
    return [
        (k, tuple(v.shape), str(v.dtype).removeprefix("torch."))
        for k, v in module.state_dict().items()
    ]


def export_model(
    path: str, out: Path, fmt: str, max_bytes: int
) -> list[tuple[str, tuple[int, ...], str]]:
    """Write the saved model at ``path`` to ``out`` in ``fmt``; (name, shape, dtype) of every
    tensor written. A model over ``max_bytes`` is refused before anything is read."""
    check_export_size(path, max_bytes)
    if fmt == "safetensors":
        return _safetensors(path, out)
    if fmt == "torchscript":
        return _torchscript(path, out)
    if fmt == "onnx":
        return _onnx(path, out)
    state = export_state_dict(path, max_bytes)
    write_state_dict(state, out)
    return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]
