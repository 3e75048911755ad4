"""The model's configuration keys and :class:`ModelConfig`, the hyper-parameters built from them.

A key module: it imports only the standard library and ``angelconf.config``, so the command
line's config-only verbs (``angelps conf``, ``angelps schedule``) can list and check these keys
without loading torch. The activation names are therefore plain strings here;
``learners.models.zoo`` maps each name to its ``torch.nn`` class (a test checks that the two agree).

:class:`ModelConfig` is built once from a job configuration with
:meth:`ModelConfig.from_config` (each hyper-parameter field names its key) and is what
``learners.models.zoo.build_model`` takes; :meth:`ModelConfig.sized` gives it the data's sizes.
Every default lives in its :class:`~angelconf.config.Key` declaration below, none in the
dataclass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from angelconf.config import Config, ConfigError, Key, format_value, positive
from angelconf.options import keyed, read_keys
from learners.models.angel_graph import Graph, graph_from_text
from learners.models.angel_json import GRAPH_MODEL, MODEL_GRAPH
from learners.models.registry import ModelEntry, model_entry

__all__ = [
    "ACTIVATIONS",
    "KEYS",
    "ModelConfig",
    "job_model_info",
    "unused_model_keys",
]

#: The activation names ``ml.model.activations`` accepts (lower case).
ACTIVATIONS = ("relu", "tanh", "sigmoid", "identity", "gelu", "leaky_relu")


def _activation_check(names: list[str]) -> str | None:
    bad = [n for n in names if n.lower() not in ACTIVATIONS]
    return None if not bad else f"activation names from {', '.join(sorted(ACTIVATIONS))}"


def _positive_ints(values: list[int]) -> str | None:
    return None if all(v >= 1 for v in values) else "a comma-separated list of integers >= 1"


def _non_negative_float(v: float) -> str | None:
    return None if v >= 0 and math.isfinite(v) else "a finite number >= 0"


@lru_cache(maxsize=8)
def _graph(text: str, where: str) -> Graph:
    return graph_from_text(text, where)


def job_graph(conf: Mapping[str, Any]) -> Graph | None:
    """The JSON layer graph of the job (``ml.model.graph``), None for a built-in model."""
    text = MODEL_GRAPH.read(conf)
    if not text:
        return None
    source = conf.source(MODEL_GRAPH.name) if hasattr(conf, "source") else "ml.model.graph"
    return _graph(str(text), source)


def _entry(conf: Mapping[str, Any], graph: Graph | None) -> ModelEntry:
    """The registry entry of the job's ``ml.model.class.name``; a JSON graph's is AngelModel's
    with the graph's task (from its loss) and field needs (from its layers)."""
    if graph is not None:
        return replace(model_entry(GRAPH_MODEL), task=graph.task, needs_fields=graph.needs_fields)
    name = str(MODEL_CLASS_NAME.read(conf))
    source = conf.source(MODEL_CLASS_NAME.name) if isinstance(conf, Config) else ""
    entry = model_entry(name, source)  # an unknown name fails here
    if entry.name == GRAPH_MODEL:
        raise ConfigError(
            f"ml.model.class.name={name} builds its network from a JSON graph: set "
            "angel.ml.conf to Angel's JSON file (its layers), or name a built-in model"
        )
    return entry


def job_model_info(conf: Mapping[str, Any]) -> ModelEntry:
    """The model of a job: the registry entry of ``ml.model.class.name``, or AngelModel's
    for a job with a JSON graph (``angel.ml.conf``)."""
    return _entry(conf, job_graph(conf))


def unused_model_keys(conf: Mapping[str, Any]) -> list[str]:
    """One line for each model key set in ``conf`` that the job's model does not read
    (``ModelEntry.reads``): ``ml.fm.rank`` on LogisticRegression trains as if unset, which a
    user who set it means not to happen unsaid. ``ml.num.class=2`` on a binary model is
    what the model is: not reported. Empty for a model that declares nothing (a user's)."""
    entry = job_model_info(conf)
    is_set, source = getattr(conf, "is_set", None), getattr(conf, "source", None)
    if entry.reads is None or is_set is None or source is None:
        return []  # (a plain mapping: which keys were set is not known)
    out = []
    for key in KEYS[1:]:
        name = key.name
        if name in entry.reads or name not in conf or not is_set(name):
            continue
        if name == NUM_CLASS.name and entry.task == "binary" and conf[name] == 2:
            continue
        shown = "" if conf[name] is None else format_value(conf[name])
        reads = ", ".join(entry.reads) or "none"
        out.append(
            f"{name}={shown} ({source(name)}): set but not used by {entry.name} "
            f"(the model keys it reads: {reads}; docs/models.md)"
        )
    return out


MODEL_CLASS_NAME = Key(
    "ml.model.class.name",
    "str",
    "LogisticRegression",
    "Model to train (Angel's class names, case-insensitive, simple or fully qualified as "
    "com.tencent.angel.ml.classification.LogisticRegression); AngelModel "
    "(com.tencent.angel.ml.core.graphsubmit.AngelModel) trains the JSON layers of "
    "angel.ml.conf; see docs/models.md.",
)
NUM_CLASS = Key("ml.num.class", "int", 2, "Number of classes (SoftmaxRegression).", check=positive)
FM_RANK = Key(
    "ml.fm.rank",
    "int",
    8,
    "Embedding size k of FM, DeepFM, WideAndDeep, NFM, PNN.",
    check=positive,
)
MLR_RANK = Key(
    "ml.mlr.rank", "int", 5, "Number of regions of MixedLogisticRegression.", check=positive
)
HUBER_DELTA = Key(
    "ml.robustregression.loss.delta",
    "float",
    1.0,
    "Huber threshold δ of RobustRegression: quadratic below δ, linear above.",
    check=positive,
)
HIDDEN_LAYERS = Key(
    "ml.model.hidden.layers",
    "int_list",
    None,
    "Hidden layer sizes of the MLP (DeepFM 100,100; WideAndDeep 100,100; NFM 50,50; "
    "PNN 200,200; DNN 500,100, whose first layer is a sparse PS table). "
    "Unset: the model's default.",
    check=_positive_ints,
)
ACTIVATION_NAMES = Key(
    "ml.model.activations",
    "str_list",
    None,
    f"Activation after each hidden layer ({', '.join(ACTIVATIONS)}); "
    "one name for all layers or one per layer. Unset: relu.",
    check=_activation_check,
)
DROPOUT = Key(
    "ml.model.dropout",
    "float",
    0.0,
    "Dropout probability after each hidden activation of the MLP (0 = none).",
    check=lambda v: None if 0 <= v < 1 else "a number in [0, 1)",
)
INPUT_INIT_STD = Key(
    "ml.inputlayer.init.std",
    "float",
    0.0,
    "Std of the normal init of sparse input-layer weights (Angel: 1e-5; 0 starts at zero). "
    "The DNN's sparse first layer uses max(this, 1/sqrt(features)).",
    check=_non_negative_float,
)
EMBEDDING_INIT_STD = Key(
    "ml.embedding.init.std",
    "float",
    0.01,
    "Std of the normal init of embeddings (Angel: 1e-5, which slows the first epochs).",
    check=_non_negative_float,
)

KEYS = [
    MODEL_CLASS_NAME,
    NUM_CLASS,
    FM_RANK,
    MLR_RANK,
    HUBER_DELTA,
    HIDDEN_LAYERS,
    ACTIVATION_NAMES,
    DROPOUT,
    INPUT_INIT_STD,
    EMBEDDING_INIT_STD,
]


def _ints(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(int(v) for v in values)


def _names(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(str(v) for v in values)


@dataclass(frozen=True)
class ModelConfig:
    """The hyper-parameters a model is built from.

    ``num_features`` (the feature id range) and ``num_fields`` (ids per sample for the field
    models, None when samples vary) come from the data, the rest from the keys above.
    ``hidden`` and ``activations`` are None when unset: each model then uses its own default.
    """

    model: str
    num_features: int
    num_fields: int | None
    num_class: int = field(metadata=keyed(NUM_CLASS))
    fm_rank: int = field(metadata=keyed(FM_RANK))
    mlr_rank: int = field(metadata=keyed(MLR_RANK))
    huber_delta: float = field(metadata=keyed(HUBER_DELTA))
    hidden: tuple[int, ...] | None = field(metadata=keyed(HIDDEN_LAYERS, _ints))
    activations: tuple[str, ...] | None = field(metadata=keyed(ACTIVATION_NAMES, _names))
    dropout: float = field(metadata=keyed(DROPOUT))
    input_std: float = field(metadata=keyed(INPUT_INIT_STD))
    embedding_std: float = field(metadata=keyed(EMBEDDING_INIT_STD))
    #: The model's registry entry (its tables and class), carried to the workers with the rest.
    entry: ModelEntry
    #: The network of an AngelModel (Angel's JSON layers), None for a built-in model.
    graph: Graph | None = None

    @classmethod
    def from_config(
        cls, conf: Mapping[str, Any], num_features: int, num_fields: int | None = None
    ) -> ModelConfig:
        """Read the model keys from a job configuration (a Config, or any mapping of typed
        values; a missing key takes its declared default)."""
        graph = job_graph(conf)
        entry = _entry(conf, graph)
        return cls(
            model=entry.name,
            num_features=int(num_features),
            num_fields=None if num_fields is None else int(num_fields),
            entry=entry,
            graph=graph,
            **read_keys(cls, conf),
        )

    def sized(self, num_features: int, num_fields: int | None) -> ModelConfig:
        """These hyper-parameters for data of ``num_features`` ids and ``num_fields`` fields
        (known once the workers have read it)."""
        fields = None if num_fields is None else int(num_fields)
        return replace(self, num_features=int(num_features), num_fields=fields)
