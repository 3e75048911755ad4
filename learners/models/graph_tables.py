"""The PS tables of an AngelModel (Angel's JSON layer graph), from its configuration alone.

Each SimpleInputLayer ``<name>`` is a sparse ``[features, outputdim]`` table ``<name>_weight``
with a dense ``[1, outputdim]`` bias ``<name>_bias`` (the ``inputlayer`` role: its optimizer is
``ml.inputlayer.optimizer``); each Embedding a sparse ``[features, numfactors]`` table
``<name>_embedding`` (``ml.embedding.optimizer``). A layer's own ``optimizer`` replaces its role's.
The tables are declared in the order of the layers, so their seeds (``ml.seed·1000 + i``) are
those of the built-in model with the same layers (LogisticRegression, FM, DeepFM, WideAndDeep:
the wide input layer, then the embedding). No torch: the driver sizes the shards from these.
"""

from __future__ import annotations

import math

from angelconf.config import ConfigError
from learners.models.config import ModelConfig
from learners.models.table_decl import TableDecl

__all__ = ["graph_tables", "table_names"]


def table_names(kind: str, name: str) -> tuple[str, ...]:
    """The PS tables of a layer: (weight, bias) of an input layer, (embedding,) of an
    Embedding, () of any other."""
    if kind == "input":
        return (f"{name}_weight", f"{name}_bias")
    if kind == "embedding":
        return (f"{name}_embedding",)
    return ()


def graph_tables(cfg: ModelConfig) -> list[TableDecl]:
    """The PS tables of ``cfg.graph`` (checked against the data's field count first)."""
    graph = cfg.graph
    assert graph is not None
    try:
        graph.dims(cfg.num_fields)
    except ConfigError as e:
        raise ConfigError(f"ml.model.graph ({graph.source}): {e}") from None
    n = cfg.num_features
    out: list[TableDecl] = []
    for layer in graph.layers:
        names = table_names(layer.kind, layer.name)
        if layer.kind == "input":
            cols = layer.dims[0]
            # A wide (1-column) layer starts like LogisticRegression's weights; a wider one
            # like DNN's sparse first layer (fan-in scale: zero would stall it).
            std = cfg.input_std if cols == 1 else max(cfg.input_std, 1.0 / math.sqrt(max(n, 1)))
            out.append(
                TableDecl(names[0], n, cols, True, "inputlayer", std, optimizer=layer.optimizer)
            )
            out.append(TableDecl(names[1], 1, cols, False, "inputlayer", optimizer=layer.optimizer))
        elif layer.kind == "embedding":
            out.append(
                TableDecl(
                    names[0],
                    n,
                    layer.factors,
                    True,
                    "embedding",
                    cfg.embedding_std,
                    optimizer=layer.optimizer,
                )
            )
    return out
