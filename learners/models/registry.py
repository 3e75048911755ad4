"""The model registry: one entry per model, in one place, without torch.

An entry (:class:`ModelEntry`) says everything the driver and the workers need to know of a
model: its name (Angel's simple class name, the value of ``ml.model.class.name``), its task
(which labels and metrics apply), whether it needs one id per field, Angel's fully qualified
class names that alias it, the function that lists its PS tables from a ``ModelConfig``, and
its ``torch.nn.Module`` class. The last two are import paths (``"package.module:name"``),
loaded on use: the driver sizes the shards from the tables function and never imports a model
class (nor torch); a worker loads the class when it builds the model.

Adding a model is one new file (its module class, and its tables function in a torch-free
module) plus one :func:`register` call. A :class:`~learners.models.config.ModelConfig` carries
its resolved entry to the workers, so a model registered by the driver alone (a user's model,
a test's toy) trains on workers that never saw the registration.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from angelconf.config import ConfigError

__all__ = [
    "ANGEL_CLASSES",
    "MODELS",
    "ModelEntry",
    "model_entry",
    "model_name",
    "register",
]

_ZOO = "learners.models.zoo"
_TABLES = "learners.models.tables"
_CLASSIFICATION = "com.tencent.angel.ml.classification."
_REGRESSION = "com.tencent.angel.ml.regression."


@dataclass(frozen=True)
class ModelEntry:
    """One model: its name, task, field needs, Angel aliases, tables function and class."""

    name: str
    #: ``"package.module:function"``: ``function(ModelConfig) -> list[TableDecl]``, torch-free.
    tables: str
    #: ``"package.module:Class"``: the ``torch.nn.Module`` (a ``BaseModel``), loaded on workers.
    module_class: str
    #: "binary", "multiclass" or "regression": which labels, metrics and prediction apply.
    task: str = "binary"
    #: True when the model needs exactly one id per field (``ml.fm.field.num``).
    needs_fields: bool = False
    #: Fully qualified class names that select this model too (Angel's job files).
    angel_classes: tuple[str, ...] = field(default=())
    #: The model keys (``learners.models.config.KEYS``) its build reads: another one set warns
    #: as unused (``ml.fm.rank`` on LogisticRegression). None (a user's model): not checked.
    reads: tuple[str, ...] | None = None

    @property
    def angel_name(self) -> str:
        """The model's name as Angel spells its class (the registry key)."""
        return self.name

    def table_function(self) -> Callable[[Any], list[Any]]:
        """The function listing the model's PS tables (imported on first use)."""
        return _load(self.tables)  # type: ignore[no-any-return]

    def load_class(self) -> Any:
        """The model's ``torch.nn.Module`` class (imports torch: workers only)."""
        return _load(self.module_class)


@cache
def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    if not module or not name:
        raise ConfigError(f"model registry: {path!r} is not an import path 'package.module:name'")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"model registry: cannot load {path}: {e}") from None


#: Every registered model by name, in registration order.
MODELS: dict[str, ModelEntry] = {}
#: Angel's fully qualified class names -> model names (derived from the entries).
ANGEL_CLASSES: dict[str, str] = {}


def register(entry: ModelEntry) -> ModelEntry:
    """Add ``entry``; a name or an Angel alias already taken (case-insensitive) is an error."""
    taken = {n.lower() for n in MODELS} | {a.lower() for a in ANGEL_CLASSES}
    for name in (entry.name, *entry.angel_classes):
        if name.lower() in taken:
            raise ValueError(f"model registry: {name!r} is already registered")
    if entry.task not in ("binary", "multiclass", "regression"):
        raise ValueError(
            f"model registry: {entry.name}: task {entry.task!r} is not binary, multiclass or "
            "regression"
        )
    MODELS[entry.name] = entry
    ANGEL_CLASSES.update({a: entry.name for a in entry.angel_classes})
    return entry


def model_name(name: str) -> str:
    """The model name of ``ml.model.class.name``: Angel's fully qualified class name becomes
    its simple name (case-insensitive); any other name is returned stripped, as it is."""
    stripped = name.strip()
    by_lower = {k.lower(): v for k, v in ANGEL_CLASSES.items()}
    return by_lower.get(stripped.lower(), stripped)


def model_entry(name: str, source: str = "") -> ModelEntry:
    """The model of ``ml.model.class.name`` (case-insensitive; Angel's qualified names are
    aliases); an unknown name lists the valid ones, closest first, and names ``source``
    (where the key was set: ``job.properties:3``, ``command line``) where given."""
    by_lower = {k.lower(): v for k, v in MODELS.items()}
    entry = by_lower.get(model_name(name).lower())
    if entry is not None:
        return entry
    ranked = difflib.get_close_matches(name, list(MODELS), n=len(MODELS), cutoff=0.0)
    where = f" ({source})" if source else ""
    raise ConfigError(
        f"ml.model.class.name={name}{where} is not a known model; valid names (closest "
        f"first): {', '.join(ranked)}"
    )


# The model keys each built-in model reads (learners/models/tables.py and zoo.py).
_INPUT = ("ml.inputlayer.init.std",)
_EMBEDDING = ("ml.fm.rank", "ml.embedding.init.std")
_MLP = ("ml.model.hidden.layers", "ml.model.activations", "ml.model.dropout")


def _builtin(
    name: str,
    tables: str,
    package: str | None,
    reads: tuple[str, ...],
    task: str = "binary",
    fields: bool = False,
) -> ModelEntry:
    aliases: Iterable[str] = () if package is None else (package + name,)
    return ModelEntry(
        name, f"{_TABLES}:{tables}", f"{_ZOO}:{name}", task, fields, tuple(aliases), reads
    )


# The built-in models: Angel's (angel-ps/mllib/.../ml/{classification,regression}/), whose
# fully qualified class names are aliases so an Angel job file's ml.model.class.name works.
# Angel's DNN is its generic JSON-driven graph model: no Angel class name maps to angelps's DNN.
for _entry in (
    _builtin("LogisticRegression", "linear", _CLASSIFICATION, _INPUT),
    _builtin("SupportVectorMachine", "linear", _CLASSIFICATION, _INPUT),
    _builtin(
        "SoftmaxRegression",
        "softmax",
        _CLASSIFICATION,
        (*_INPUT, "ml.num.class"),
        task="multiclass",
    ),
    _builtin("MixedLogisticRegression", "mixed", _CLASSIFICATION, (*_INPUT, "ml.mlr.rank")),
    _builtin("LinearRegression", "linear", _REGRESSION, _INPUT, task="regression"),
    _builtin(
        "RobustRegression",
        "linear",
        _REGRESSION,
        (*_INPUT, "ml.robustregression.loss.delta"),
        task="regression",
    ),
    _builtin("FactorizationMachines", "wide_embedding", _CLASSIFICATION, (*_INPUT, *_EMBEDDING)),
    _builtin(
        "DeepFM", "wide_embedding", _CLASSIFICATION, (*_INPUT, *_EMBEDDING, *_MLP), fields=True
    ),
    _builtin(
        "WideAndDeep",
        "wide_embedding",
        _CLASSIFICATION,
        (*_INPUT, *_EMBEDDING, *_MLP),
        fields=True,
    ),
    _builtin(
        "NeuralFactorizationMachines",
        "wide_embedding",
        _CLASSIFICATION,
        (*_INPUT, *_EMBEDDING, *_MLP),
    ),
    _builtin(
        "ProductNeuralNetwork",
        "wide_embedding",
        _CLASSIFICATION,
        (*_INPUT, *_EMBEDDING, *_MLP),
        fields=True,
    ),
    _builtin("DNN", "dnn", None, (*_INPUT, *_MLP)),
    # Angel's graph model: the network is the JSON of angel.ml.conf (learners/models/angel_json.py);
    # its task and field needs are the graph's (learners.models.config.job_model_info).
    ModelEntry(
        "AngelModel",
        "learners.models.graph_tables:graph_tables",
        "learners.models.graph_model:GraphModel",
        angel_classes=(
            "com.tencent.angel.ml.core.graphsubmit.AngelModel",
            "com.tencent.angel.ml.core.graphsubmit.GraphModel",
            "GraphModel",
        ),
        # (its layers' sizes, activations and dropout are the JSON's)
        reads=(
            *_INPUT,
            "ml.embedding.init.std",
            "ml.num.class",
            "ml.robustregression.loss.delta",
        ),
    ),
):
    register(_entry)
