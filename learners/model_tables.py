"""The PS tables of every model, from its configuration alone and without torch.

The driver sizes and starts the shards from these while the workers load their data (and
torch); it never builds a model itself. A model class (learners/models.py) declares the same
tables through :func:`model_tables`, so there is one statement of each model's tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from angelconf.config import ConfigError
from learners.model_config import ModelConfig, model_info
from learners.tables import TableDecl

__all__ = ["DNN_HIDDEN", "model_tables"]

#: DNN's hidden sizes when ml.model.hidden.layers is unset (its first is the PS table's width).
DNN_HIDDEN = (500, 100)


def _linear(cfg: ModelConfig, cols: int) -> list[TableDecl]:
    return [
        TableDecl("weight", cfg.num_features, cols, True, "inputlayer", cfg.input_std),
        TableDecl("bias", 1, cols, False, "inputlayer"),
    ]


def _mixed(cfg: ModelConfig) -> list[TableDecl]:
    n, r = cfg.num_features, cfg.mlr_rank
    # The gate needs a non-zero start so the regions differ; Angel used N(0, 1e-5).
    std = max(cfg.input_std, 0.01)
    return [
        TableDecl("sigmoid_weight", n, r, True, "inputlayer", std),
        TableDecl("sigmoid_bias", 1, r, False, "inputlayer"),
        TableDecl("softmax_weight", n, r, True, "inputlayer", std),
        TableDecl("softmax_bias", 1, r, False, "inputlayer"),
    ]


def _wide_embedding(cfg: ModelConfig) -> list[TableDecl]:
    n, k = cfg.num_features, cfg.fm_rank
    return [
        TableDecl("wide", n, 1, True, "inputlayer", cfg.input_std),
        TableDecl("wide_bias", 1, 1, False, "inputlayer"),
        TableDecl("embedding", n, k, True, "embedding", cfg.embedding_std),
    ]


def _dnn(cfg: ModelConfig) -> list[TableDecl]:
    n = cfg.num_features
    hidden = list(cfg.hidden) if cfg.hidden is not None else list(DNN_HIDDEN)
    if not hidden:
        raise ConfigError(
            "ml.model.hidden.layers is empty, but DNN needs at least one hidden layer (its "
            f"first is the sparse PS table): set it (default {','.join(map(str, DNN_HIDDEN))}) "
            "or leave it unset"
        )
        raise ConfigError("ml.model.hidden.layers: DNN needs at least one hidden layer")
    # A sparse first layer initialised like nn.Linear's fan-in scale; zero would stall it.
    std = max(cfg.input_std, 1.0 / math.sqrt(max(n, 1)))
    return [
        TableDecl("input", n, hidden[0], True, "inputlayer", std),
        TableDecl("input_bias", 1, hidden[0], False, "inputlayer"),
    ]


_TABLES: dict[str, Callable[[ModelConfig], list[TableDecl]]] = {
    "LogisticRegression": lambda cfg: _linear(cfg, 1),
    "SupportVectorMachine": lambda cfg: _linear(cfg, 1),
    "SoftmaxRegression": lambda cfg: _linear(cfg, cfg.num_class),
    "MixedLogisticRegression": _mixed,
    "LinearRegression": lambda cfg: _linear(cfg, 1),
    "RobustRegression": lambda cfg: _linear(cfg, 1),
    "FactorizationMachines": _wide_embedding,
    "DeepFM": _wide_embedding,
    "WideAndDeep": _wide_embedding,
    "NeuralFactorizationMachines": _wide_embedding,
    "ProductNeuralNetwork": _wide_embedding,
    "DNN": _dnn,
}


def model_tables(cfg: ModelConfig) -> list[TableDecl]:
    """The PS tables the model of ``cfg`` reads (sparse weights, embeddings, biases)."""
    if cfg.graph is not None:
        from learners.graph_tables import graph_tables  # an AngelModel's JSON layers

        return graph_tables(cfg)
    return _TABLES[model_info(cfg.model).angel_name](cfg)
