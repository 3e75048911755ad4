"""A saved model as one standalone torch module: predictions with torch alone, no Ray, no PS.

:class:`Standalone` holds the model's PS tables as buffers (rows indexed by feature id; for a
table of unbounded keys, its trained keys sorted beside their rows) and the worker-side layers
of the checkpoint. ``forward(ids, values)`` takes int64 ids ``[N, K]`` (0-based feature ids,
padded with -1) and float values ``[N, K]`` and returns ``[N]``: P(y=1) for binary models, the
value for regression. It is TorchScript-able (``angelps export --format torchscript``) and is
what ``GraphLearner.load(path)`` predicts small inputs with, in-process.

The field models (DeepFM, WideAndDeep, ProductNeuralNetwork) need exactly ``ml.fm.field.num``
ids per row, in field order, with no padding, as in training. A table of unbounded keys
(``ml.feature.index.range=-1``) serves an id that was never trained as a zero row; the PS
would serve its initial value (zero for weights, a small random vector for embeddings).
"""

# No ``from __future__ import annotations``: TorchScript reads the buffer annotations of
# Standalone as real types.

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from angelconf.config import Config, ConfigError, load_config
from angelps import TableSpec
from angelps.checkpoint import files as checkpoint
from learners.job import saved_model
from learners.keys import all_keys
from learners.models.config import ModelConfig
from learners.models.registry import model_entry
from learners.models.zoo import BaseModel, build_model
from learners.runs.export import table_arrays  # one reader of the saved tables
from learners.worker.dense import read_dense

__all__ = ["Standalone", "load_standalone", "padded"]

#: Which graph each model class computes, and how its scores become predictions.
_KINDS = {
    "LogisticRegression": ("linear", "sigmoid"),
    "SupportVectorMachine": ("linear", "sigmoid2"),
    "LinearRegression": ("linear", "identity"),
    "RobustRegression": ("linear", "identity"),
    "FactorizationMachines": ("fm", "sigmoid"),
    "DeepFM": ("deepfm", "sigmoid"),
    "WideAndDeep": ("wide_deep", "sigmoid"),
    "NeuralFactorizationMachines": ("nfm", "sigmoid"),
    "ProductNeuralNetwork": ("pnn", "sigmoid"),
    "DNN": ("dnn", "sigmoid"),
}
#: Each graph's PS tables, as (wide weight, wide bias, embedding) table names.
_TABLES = {
    "linear": ("weight", "bias", ""),
    "dnn": ("input", "input_bias", ""),
}
_EMBEDDING_TABLES = ("wide", "wide_bias", "embedding")


class Standalone(nn.Module):
    """One model's forward over padded ids and values, its tables inside (module docstring)."""

    # constants of the scripted module (TorchScript reads the branches on them as fixed)
    __constants__ = ("kind", "out", "num_fields")
    wide: Tensor
    wide_keys: Tensor
    wide_bias: Tensor
    wide_bias_keys: Tensor
    emb: Tensor
    emb_keys: Tensor
    pair_i: Tensor
    pair_j: Tensor

    def __init__(
        self,
        kind: str,
        out: str,
        tables: dict[str, tuple[Tensor, Tensor]],
        mlp: nn.Module,
        first_act: nn.Module,
        num_fields: int,
        pairs: tuple[Tensor, Tensor],
    ) -> None:
        super().__init__()
        self.kind, self.out, self.num_fields = kind, out, num_fields
        empty = torch.zeros(0, dtype=torch.int64)
        for name in ("wide", "wide_bias", "emb"):
            rows, keys = tables.get(name, (torch.zeros(0, 1), empty))
            self.register_buffer(name, rows.to(torch.float32).contiguous())
            self.register_buffer(f"{name}_keys", keys.to(torch.int64).contiguous())
        self.mlp = mlp
        self.first_act = first_act
        self.register_buffer("pair_i", pairs[0])
        self.register_buffer("pair_j", pairs[1])

    def _rows(self, table: Tensor, keys: Tensor, ids: Tensor) -> Tensor:
        """``[N, K, cols]``: the row of every id (padding reads row 0, weighted 0 later)."""
        safe = ids.clamp(min=0)
        if keys.numel() > 0:  # a table of unbounded keys: its trained keys, sorted
            pos = torch.searchsorted(keys, safe).clamp(max=keys.numel() - 1)
            found = (keys[pos] == safe).to(table.dtype).unsqueeze(-1)
            return table[pos] * found
        if ids.numel() > 0 and int(ids.max()) >= table.shape[0]:
            raise ValueError(
                "a feature id is out of range: ids must be below " + str(table.shape[0])
            )
        return table[safe]

    def forward(self, ids: Tensor, values: Tensor) -> Tensor:
        """Predictions ``[N]`` of ids ``[N, K]`` (int64, -1 pads) and values ``[N, K]``."""
        if ids.dim() != 2 or values.shape != ids.shape:
            raise ValueError("ids and values must both be [N, K] tensors of the same shape")
        w = (values * (ids >= 0).to(values.dtype)).unsqueeze(-1)  # [N, K, 1]
        wide = (self._rows(self.wide, self.wide_keys, ids) * w).sum(dim=1)
        wide = wide + self.wide_bias[0]
        if self.kind == "linear":
            scores = wide[:, 0]
        elif self.kind == "dnn":
            scores = self.mlp(self.first_act(wide))[:, 0]
        else:
            e = self._rows(self.emb, self.emb_keys, ids) * w  # [N, K, k]
            scores = wide[:, 0]
            if self.kind == "fm" or self.kind == "deepfm" or self.kind == "nfm":
                s = e.sum(dim=1)
                bi = 0.5 * (s * s - (e * e).sum(dim=1))
                if self.kind == "nfm":
                    scores = scores + self.mlp(bi)[:, 0]
                else:
                    scores = scores + bi.sum(dim=1)
            if self.kind == "deepfm" or self.kind == "wide_deep" or self.kind == "pnn":
                if ids.shape[1] != self.num_fields or bool((ids < 0).any()):
                    raise ValueError(
                        "this model needs exactly "
                        + str(self.num_fields)
                        + " ids per row (one per field, in field order), no padding"
                    )
                deep = e.flatten(1)
                if self.kind == "pnn":
                    inner = (e[:, self.pair_i, :] * e[:, self.pair_j, :]).sum(dim=2)
                    deep = torch.cat([deep, inner], dim=1)
                scores = scores + self.mlp(deep)[:, 0]
        if self.out == "sigmoid":
            return torch.sigmoid(scores)
        if self.out == "sigmoid2":
            return torch.sigmoid(2 * scores)
        return scores


def _table_arrays(manifest: dict[str, Any], spec: TableSpec) -> tuple[np.ndarray, np.ndarray]:
    """(rows, sorted keys) of one saved table: every row by feature id and no keys for a
    bounded table; the trained keys and their rows for a table of unbounded keys."""
    arrays = table_arrays(manifest, spec)
    if f"ps.{spec.name}" in arrays:
        return arrays[f"ps.{spec.name}"], np.zeros(0, np.int64)
    return arrays[f"ps.{spec.name}.weight"], arrays[f"ps.{spec.name}.keys"]


def saved_model_of(path: str, conf: Config | None = None) -> tuple[BaseModel, dict[str, Any]]:
    """The worker-side model of the checkpoint at ``path`` with its saved dense weights (as
    the job ``conf`` runs it; default: the model's own settings), and the checkpoint's learner
    section. A job whose layers do not fit the saved ones is a ConfigError naming the path."""
    info = saved_model.read_extra(path)["learner"]
    job = conf if conf is not None else load_config(None, {}, all_keys())
    conf = saved_model.inference_conf(job, info, path)
    cfg = ModelConfig.from_config(conf, int(info["num_features"]), info["num_fields"])
    model = build_model(cfg)
    dense, _meta = read_dense(saved_model.dense_blob(info, path))
    state = {
        k[len("model/") :]: torch.from_numpy(v) for k, v in dense.items() if k.startswith("model/")
    }
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1].strip()
        raise ConfigError(
            f"{path}: the job's layers do not fit the saved model's ({first}); drop the "
            "ml.model.* keys that differ from the saved job"
        ) from None
    return model.eval(), info


def load_standalone(path: str, conf: Config | None = None) -> Standalone:
    """The saved model at ``path`` as a :class:`Standalone` module (eval mode), as the job
    ``conf`` runs it. A model class without a standalone graph (SoftmaxRegression,
    MixedLogisticRegression) is a ConfigError."""
    model, info = saved_model_of(path, conf)
    name = model_entry(str(info["model"])).angel_name
    if name not in _KINDS:
        raise ConfigError(
            f"{path} holds a {name} model: a standalone module exists for "
            f"{', '.join(sorted(_KINDS))}"
        )
    kind, out = _KINDS[name]
    manifest = checkpoint.read_manifest(path)
    specs = {d["name"]: TableSpec.from_dict(d) for d in manifest["tables"]}
    names = _TABLES.get(kind, _EMBEDDING_TABLES)
    tables: dict[str, tuple[Tensor, Tensor]] = {}
    for slot, table in zip(("wide", "wide_bias", "emb"), names, strict=True):
        if table:
            rows, keys = _table_arrays(manifest, specs[table])
            tables[slot] = (torch.from_numpy(np.ascontiguousarray(rows)), torch.from_numpy(keys))
    mlp = getattr(model, "mlp", nn.Identity())
    first_act = getattr(model, "first_act", nn.Identity())
    fields = int(info["num_fields"] or 0)
    pairs = (
        (getattr(model, "pair_i").clone(), getattr(model, "pair_j").clone())  # noqa: B009
        if kind == "pnn"
        else (torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    )
    module = Standalone(kind, out, tables, mlp, first_act, fields, pairs)
    return module.eval().requires_grad_(False)  # for inference: no autograd graph


def padded(indptr: np.ndarray, ids: np.ndarray, values: np.ndarray) -> tuple[Tensor, Tensor]:
    """CSR rows as the padded ``(ids [N, K], values [N, K])`` that :class:`Standalone` takes
    (K the longest row; -1 ids and 0 values pad the shorter ones)."""
    counts = np.diff(np.asarray(indptr, dtype=np.int64)).astype(np.int64)
    n, k = len(counts), int(counts.max()) if len(counts) else 0
    out_ids = np.full((n, k), -1, np.int64)
    out_values = np.zeros((n, k), np.float32)
    rows = np.repeat(np.arange(n), counts)
    cols = np.arange(len(ids)) - np.repeat(np.asarray(indptr[:-1], dtype=np.int64), counts)
    out_ids[rows, cols] = ids
    out_values[rows, cols] = values
    return torch.from_numpy(out_ids), torch.from_numpy(out_values)
