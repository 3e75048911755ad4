"""The PS tables of the built-in models, from their configuration alone and without torch.

The driver sizes and starts the shards from these while the workers load their data (and
torch); it never builds a model itself. A model class (learners/models/zoo.py) declares the same
tables through :func:`model_tables`, so there is one statement of each model's tables. Each
model's registry entry (learners/models/registry.py) names its function here.
"""

from __future__ import annotations

import math

from angelconf.config import ConfigError
from learners.models.config import ModelConfig
from learners.models.table_decl import TableDecl

__all__ = [
    "DNN_HIDDEN",
    "dnn",
    "linear",
    "mixed",
    "model_tables",
    "softmax",
    "wide_embedding",
]

#: DNN's hidden sizes when ml.model.hidden.layers is unset (its first is the PS table's width).
DNN_HIDDEN = (500, 100)


def _linear(cfg: ModelConfig, cols: int) -> list[TableDecl]:
    return [
        TableDecl("weight", cfg.num_features, cols, True, "inputlayer", cfg.input_std),
        TableDecl("bias", 1, cols, False, "inputlayer"),
    ]


def mixed(cfg: ModelConfig) -> list[TableDecl]:
    """The gate and the experts of MixedLogisticRegression, one column per region."""
    n, r = cfg.num_features, cfg.mlr_rank
    # The gate needs a non-zero start so the regions differ; Angel used N(0, 1e-5).
    std = max(cfg.input_std, 0.01)
    return [
        TableDecl("sigmoid_weight", n, r, True, "inputlayer", std),
        TableDecl("sigmoid_bias", 1, r, False, "inputlayer"),
        TableDecl("softmax_weight", n, r, True, "inputlayer", std),
        TableDecl("softmax_bias", 1, r, False, "inputlayer"),
    ]


def wide_embedding(cfg: ModelConfig) -> list[TableDecl]:
    """A wide (linear) part and an embedding of rank ``ml.fm.rank`` (FM and its relatives)."""
    n, k = cfg.num_features, cfg.fm_rank
    return [
        TableDecl("wide", n, 1, True, "inputlayer", cfg.input_std),
        TableDecl("wide_bias", 1, 1, False, "inputlayer"),
        TableDecl("embedding", n, k, True, "embedding", cfg.embedding_std),
    ]


def dnn(cfg: ModelConfig) -> list[TableDecl]:
    """The DNN's sparse first layer (a PS table as wide as the first hidden layer)."""
    n = cfg.num_features
    hidden = list(cfg.hidden) if cfg.hidden is not None else list(DNN_HIDDEN)
    if not hidden:
        raise ConfigError(
            "ml.model.hidden.layers is empty, but DNN needs at least one hidden layer (its "
            f"first is the sparse PS table): set it (default {','.join(map(str, DNN_HIDDEN))}) "
            "or leave it unset"
        )
    # A sparse first layer initialised like nn.Linear's fan-in scale; zero would stall it.
    std = max(cfg.input_std, 1.0 / math.sqrt(max(n, 1)))
    return [
        TableDecl("input", n, hidden[0], True, "inputlayer", std),
        TableDecl("input_bias", 1, hidden[0], False, "inputlayer"),
    ]


def linear(cfg: ModelConfig) -> list[TableDecl]:
    """A weight column and a bias (LR, SVM, linear and robust regression)."""
    return _linear(cfg, 1)


def softmax(cfg: ModelConfig) -> list[TableDecl]:
    """One weight column and bias per class."""
    return _linear(cfg, cfg.num_class)


def model_tables(cfg: ModelConfig) -> list[TableDecl]:
    """The PS tables the model of ``cfg`` reads (sparse weights, embeddings, biases)."""
    return cfg.entry.table_function()(cfg)
