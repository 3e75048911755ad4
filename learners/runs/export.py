"""A saved model as one torch state_dict: every PS table and the worker-side layers.

``angelps export --model DIR --out model.pt`` reads the checkpoint's files directly (no Ray, no
shards; every file checked against the manifest's SHA-256) and writes ``torch.save`` of:

* ``ps.<table>``: a table with a known number of rows (the feature range: LR's ``weight``,
  FM's ``embedding``, biases) as a dense ``[rows, cols]`` tensor, row ``i`` the weights of
  feature ``i``; rows never trained hold their initial values, as the PS would serve them;
* ``ps.<table>.keys`` and ``ps.<table>.weight`` for a table of unbounded keys
  (``ml.feature.index.range=-1``): the trained keys, sorted, and their rows;
* ``dense.<name>``: the worker-side (MLP) layers, the module's own state_dict names.

Optimizer state is left out: the export is for serving and inspection (resume from the
checkpoint itself). A model over the size limit is refused before anything is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from angelconf.config import ConfigError
from angelps import TableSpec
from angelps.checkpoint import files as checkpoint
from angelps.table import init_rows
from learners.job import saved_model
from learners.runs.output_file import replace_atomically
from learners.worker.dense import read_dense

__all__ = [
    "check_export_size",
    "export_size",
    "export_state_dict",
    "table_arrays",
    "write_state_dict",
]


def _rows(manifest: dict[str, Any], spec: TableSpec) -> int:
    """Rows of ``spec`` saved over every shard (from the manifest)."""
    shards = range(checkpoint.table_shards(manifest, spec.name))
    return sum(int((checkpoint.file_entry(manifest, spec.name, s) or {})["rows"]) for s in shards)


def export_size(path: str) -> int:
    """Bytes of the tensors :func:`export_state_dict` would return for the model at ``path``."""
    manifest = checkpoint.read_manifest(path)
    total = 0
    for spec in (TableSpec.from_dict(d) for d in manifest["tables"]):
        item = np.dtype(spec.dtype).itemsize
        if spec.rows > 0:
            total += spec.rows * spec.cols * item
        else:
            total += _rows(manifest, spec) * (spec.cols * item + 8)
    learner = manifest.get("extra", {}).get("learner", {})
    dense = learner.get("dense")
    if dense is not None:
        total += Path(checkpoint.member(manifest["root"], str(dense["file"]))).stat().st_size
    return total


def table_arrays(manifest: dict[str, Any], spec: TableSpec) -> dict[str, np.ndarray]:
    """One saved table: ``ps.<table>`` (every row by feature id; rows never trained hold
    their initial values) or, for unbounded keys, ``ps.<table>.keys`` (sorted) and
    ``ps.<table>.weight``."""
    root = manifest["root"]
    keys, rows = [], []
    for shard in range(checkpoint.table_shards(manifest, spec.name)):
        entry = checkpoint.file_entry(manifest, spec.name, shard)
        k, w, _state = checkpoint.read_table_file(
            checkpoint.table_file(root, spec.name, shard), entry
        )
        keys.append(k)
        rows.append(w)
    k = np.concatenate(keys)
    w = np.concatenate(rows).reshape(-1, spec.cols)
    if spec.rows > 0:
        full = init_rows(spec, np.arange(spec.rows, dtype=np.int64))
        full[k] = w
        return {f"ps.{spec.name}": full}
    order = np.argsort(k, kind="stable")
    return {f"ps.{spec.name}.keys": k[order], f"ps.{spec.name}.weight": w[order]}


def check_export_size(path: str, max_bytes: int) -> None:
    """ConfigError when the model at ``path`` would take more than ``max_bytes`` in memory
    (every format holds its whole tables), before anything is read."""
    size = export_size(path)
    if size > max_bytes:
        raise ConfigError(
            f"the model in {path} takes {size / 2**20:.3g} MiB ({size} bytes) as one "
            f"export, over the limit of {max_bytes} bytes (--max-mb): raise --max-mb, or "
            "read its Parquet tables directly (docs/checkpoints.md)"
        )


def export_state_dict(path: str, max_bytes: int) -> dict[str, Any]:
    """The whole model at ``path`` as ``{name: torch.Tensor}``; a ConfigError when it would
    take more than ``max_bytes``."""
    import torch  # only when exporting

    extra = saved_model.read_extra(str(path))
    check_export_size(path, max_bytes)
    manifest = checkpoint.read_manifest(path)
    arrays: dict[str, np.ndarray] = {}
    for spec in (TableSpec.from_dict(d) for d in manifest["tables"]):
        arrays.update(table_arrays(manifest, spec))
    dense, _meta = read_dense(saved_model.dense_blob(extra["learner"], path))
    for k, v in dense.items():
        if k.startswith("model/"):
            arrays[f"dense.{k[len('model/') :]}"] = v
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}


def write_state_dict(state: dict[str, Any], out: Path) -> None:
    """``torch.save`` to a temporary file renamed into place (a failure leaves ``out`` as it
    was)."""
    import torch

    replace_atomically(out, lambda tmp: torch.save(state, tmp))
