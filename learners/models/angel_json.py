"""Angel's JSON job description (``angel.ml.conf``): its sections mapped onto the job's keys.

Angel's graph models (``ml.model.class.name=com.tencent.angel.ml.core.graphsubmit.AngelModel``,
and its model classes given a JSON) read a JSON file (Angel-ML/angel: docs/basic/json_conf_en.md)
with the sections ``data``, ``model``, ``train``, ``default_optimizer``, ``default_transfunc``,
``default_lossfunc`` and ``layers``. :func:`apply_angel_json` reads the file named by
``angel.ml.conf`` and sets the keys each section stands for, where neither the ``.properties``
file nor the command line set them (they win, as in Angel). The ``layers`` (the network) become
``ml.model.graph``, one line of JSON that travels with the job and into its checkpoints, so a
saved model predicts without the file; the model is then ``AngelModel``
(:mod:`learners.models.angel_graph` describes the graph, :mod:`learners.models.graph_model` builds it).

A key module: standard library and ``angelconf`` only. Every value keeps where it came from
(``<file>: train.lr``), shown by ``angelps conf`` and in error messages.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from angelconf.config import Config, ConfigError, Key, validate
from angelps.file_store import files_for
from angelps.optimizer_keys import OPTIMIZER_KEYS, OPTIMIZERS
from learners.models.angel_graph import (
    Graph,
    Layer,
    RepeatedKey,
    graph_from_text,
    graph_text,
    json_once,
    optimizer_overrides,
    parse_graph,
)
from learners.models.angel_layers import lower_keys
from learners.models.registry import model_entry, model_name

__all__ = [
    "ANGEL_ML_CONF",
    "KEYS",
    "MODEL_GRAPH",
    "apply_angel_json",
    "check_saved_graph",
    "read_angel_json",
]

ANGEL_ML_CONF = Key(
    "angel.ml.conf",
    "str",
    None,
    "Angel's JSON job description: its data, model, train and default_optimizer sections set "
    "the keys they stand for (keys in the job file or on the command line win) and its layers "
    "define the network (the model becomes AngelModel); a path relative to the current "
    "directory, or a URL (s3://, gs://, hdfs://). "
    "See docs/models.md.",
)
MODEL_GRAPH = Key(
    "ml.model.graph",
    "str",
    None,
    'The network of an AngelModel as one line of JSON ({"layers": [...]}, Angel\'s layer '
    "graph); set from the layers of angel.ml.conf, and saved with the model.",
)
KEYS = [ANGEL_ML_CONF, MODEL_GRAPH]

#: The model name a JSON graph trains (Angel's GraphModel/AngelModel).
GRAPH_MODEL = "AngelModel"

# JSON section -> {JSON key (lower case) -> our key}; None: accepted, no effect here (why).
_DATA: dict[str, str | None] = {
    "format": "ml.data.type",
    "indexrange": "ml.feature.index.range",
    "numfield": "ml.fm.field.num",
    "validateratio": "ml.data.validate.ratio",
    "useshuffle": "ml.data.use.shuffle",
    "translabel": "ml.data.label.trans.class",
    "sampleratio": None,  # Spark on Angel's sampling: batches here are sized by the keys
}
_MODEL: dict[str, str | None] = {
    "loadpath": "angel.load.model.path",
    "savepath": "angel.save.model.path",
    "modeltype": None,  # tables are float32, sparse or dense as each table needs
    "modelsize": None,  # the table sizes follow ml.feature.index.range
}
_TRAIN: dict[str, str | None] = {
    "epoch": "ml.epoch.num",
    "numupdateperepoch": "ml.num.update.per.epoch",
    "batchsize": "ml.minibatch.size",
    "lr": "ml.learn.rate",
    "decayclass": "ml.opt.decay.class.name",
    "decayalpha": "ml.opt.decay.alpha",
    "decaybeta": "ml.opt.decay.beta",
    "decayintervals": "ml.opt.decay.intervals",
    "decayonbatch": "ml.opt.decay.on.batch",
    "decay": "ml.learn.decay",
}
_SECTIONS = {"data": _DATA, "model": _MODEL, "train": _TRAIN}
_TOP = (
    "data",
    "model",
    "train",
    "default_optimizer",
    "default_transfunc",
    "default_lossfunc",
    "layers",
)
_ROLE_KEYS = ("ml.inputlayer.optimizer", "ml.embedding.optimizer", "ml.fclayer.optimizer")


def read_angel_json(path: str | os.PathLike[str], key: str = ANGEL_ML_CONF.name) -> dict[str, Any]:
    """The JSON document of ``path``; a ConfigError names the file (and the line and column of
    malformed JSON, or of a key given twice in one object, with its JSON path and both values)."""
    src = str(path)
    store = files_for(src)
    missing = text = ""
    try:
        if store.is_file(src):
            text = store.read_bytes(src).decode("utf-8-sig")  # (a BOM, as editors may write)
        else:
            missing = "is a directory" if store.is_dir(src) else "does not exist"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        # (a store that cannot be reached, refused credentials, a file that is not UTF-8)
        raise ConfigError(f"{key}={path}: cannot be read ({e})") from None
    if missing:
        raise ConfigError(f"{key}={path}: the JSON file {missing}")
    try:
        doc = json_once(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}{_hint(text, e)}"
        ) from None
    except RepeatedKey as e:
        raise ConfigError(f"{path}:{e.line}:{e.col}: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object with data, train, layers, ...")
    return doc


def _hint(text: str, e: json.JSONDecodeError) -> str:
    """Why the JSON is malformed, where it is a habit of other formats: a comma before a closing
    brace or bracket, a comment."""
    if text.startswith(("//", "/*"), e.pos):
        return " (JSON has no comments: remove them)"
    before = text[: e.pos].rstrip()
    if before.endswith(",") and text[e.pos : e.pos + 1] in ("}", "]"):
        return f" (a trailing comma before {e.lineno}:{e.colno} is not allowed in JSON)"
    return ""


def _section(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    raw = doc.get(name)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name}: expected a JSON object")
    return {str(k).lower(): (str(k), v) for k, v in raw.items()}


def json_keys(doc: Mapping[str, Any], conf: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The keys the document sets: key -> (value, JSON path). A section entry that is unknown,
    or not supported here, is a ConfigError naming its JSON path. Keys are read
    case-insensitively, in every section."""
    for k in doc:
        if str(k).lower() not in _TOP:
            raise ConfigError(f"{k}: unknown section (known: {', '.join(_TOP)})")
    doc = lower_keys(doc)
    out: dict[str, tuple[Any, str]] = {}
    for section, table in _SECTIONS.items():
        for low, (orig, value) in _section(doc, section).items():
            where = f"{section}.{orig}"
            if low == "posnegratio":
                if isinstance(value, (int, float)) and value <= 0:
                    continue
                raise ConfigError(
                    f"{where}: resampling positives and negatives is not supported here; "
                    "remove it (or set -1)"
                )
            if low not in table:
                known = ", ".join(sorted({*table, *(["posnegratio"] if section == "data" else [])}))
                raise ConfigError(f"{where}: unknown key of {section} (known: {known})")
            key = table[low]
            if key is not None and value is not None:  # null: as if absent
                out[key] = (value, where)
    train = _section(doc, "train")
    batch_set = isinstance(conf, Config) and conf.is_set("ml.minibatch.size")
    if "numupdateperepoch" not in train and "batchsize" not in train and not batch_set:
        # Angel's graph learner always sizes batches by its updates per epoch (default 10).
        out["ml.num.update.per.epoch"] = (10, "train (Angel's default numupdateperepoch)")
    if doc.get("default_optimizer") is not None:
        name, sets = optimizer_overrides(doc["default_optimizer"], "default_optimizer")
        for role in _ROLE_KEYS:
            out[role] = (name, "default_optimizer.type")
        for fname, value in sets:
            out[OPTIMIZER_KEYS[fname].name] = (value, "default_optimizer")
    if doc.get("layers") is not None:
        parse_graph(doc)  # every layer checked here, naming the file
        out[MODEL_GRAPH.name] = (graph_text(doc), "layers")
        out["ml.model.class.name"] = (GRAPH_MODEL, "layers")
    return out


def set_by_angel_json(conf: Mapping[str, Any], key: str) -> bool:
    """Whether ``key`` of ``conf`` took its value from the Angel JSON of ``angel.ml.conf``."""
    path = conf.get(ANGEL_ML_CONF.name)
    source = getattr(conf, "source", None)
    if not path or source is None or not getattr(conf, "is_set", lambda k: False)(key):
        return False
    return str(source(key)).startswith(f"{files_for(str(path)).canonical(str(path))}:")


def apply_angel_json(conf: Config) -> Config:
    """``conf`` with the keys of the JSON file of ``angel.ml.conf`` (when set) filled in where
    the job did not set them; ``conf`` itself when the key is unset or already applied."""
    path = conf.get(ANGEL_ML_CONF.name)
    if not path:
        return conf
    src = str(path)
    src = files_for(src).canonical(src)
    if any(conf.source(k).startswith(f"{src}:") for k in conf):
        return conf  # already applied (the CLI, then GraphLearner)
    doc = read_angel_json(src)
    try:
        sets = json_keys(doc, conf)
    except ConfigError as e:
        raise ConfigError(f"{src}: {e}") from None
    keys = conf.declarations()  # (every key: the loader's)
    by_name = {k.name: k for k in keys}
    values = {k: conf[k] for k in conf}
    sources = {k: conf.source(k) for k in conf if conf.is_set(k)}
    for name, (value, where) in sets.items():
        raw = json.dumps(value) if isinstance(value, (list, dict)) else value
        if isinstance(raw, bool):
            raw = "true" if raw else "false"
        try:
            # (checked even where the job's own key wins: a file the user gave holds no
            # invalid value unsaid, "lr": "fast" behind ml.learn.rate included)
            valid = validate(by_name[name], raw, name)
        except ConfigError as e:
            raise ConfigError(f"{src}: {where}: {e}") from None
        if name == "ml.model.class.name" and conf.is_set(name):
            _check_class(conf, src)
            # The JSON's layers define the network whatever Angel class was named.
        elif conf.is_set(name):
            continue  # the job file or the command line wins
        values[name] = valid
        sources[name] = f"{src}: {where}"
    if MODEL_GRAPH.name in sets and sources.get(MODEL_GRAPH.name, "").startswith(f"{src}:"):
        # The widths that depend on the field count, checked now that it is known.
        fields = values.get("ml.fm.field.num")
        try:
            graph = parse_graph(doc)
            widths = graph.dims(fields if isinstance(fields, int) and fields > 0 else None)
            graph.check_classes(widths, int(values["ml.num.class"]))
        except ConfigError as e:
            raise ConfigError(f"{src}: {e}") from None
        if values.get("angel.dense.placement", "worker") == "worker":
            _check_dense_optimizers(graph, values, sources, src)
    return Config(values, sources, keys)


def _check_dense_optimizers(
    graph: Graph, values: Mapping[str, Any], sources: Mapping[str, str], src: str
) -> None:
    """The FCLayers run on the workers (angel.dense.placement=worker): an optimizer they cannot
    run (FTRL), named by a layer or by the JSON's default_optimizer, is a ConfigError naming that
    place in the JSON, before any training starts."""
    from angelps.optimizers.registry import optimizer_for  # (numpy: only for a JSON graph)

    role = "ml.fclayer.optimizer"
    for layer in graph.layers:
        if layer.kind != "fc":
            continue
        if layer.optimizer is not None:
            name, at = layer.optimizer[0], f"{src}: {layer.path}.optimizer"
        elif sources.get(role, "").startswith(f"{src}:"):
            name, at = str(values[role]), sources[role]
        else:
            continue  # the job's own key: checked where the job's keys are
        try:
            reason = optimizer_for(name).not_for_dense
        except ValueError:
            continue  # (an unknown name is reported where it is read)
        if reason:
            valid = ", ".join(
                d for n, d in OPTIMIZERS.items() if not optimizer_for(n).not_for_dense
            )
            raise ConfigError(
                f"{at}={name} cannot run on the workers, where the FCLayer "
                f"{json.dumps(layer.name)} ({layer.path}) runs with angel.dense.placement=worker "
                f"({reason}; valid for worker-side dense layers: {valid})"
            )


def _check_class(conf: Config, src: str) -> None:
    """A JSON graph with a model class named: Angel's graph classes and any of its model classes
    build the network from the layers; another name is an error (with the valid ones)."""
    name = str(conf["ml.model.class.name"])
    if model_name(name) == GRAPH_MODEL:
        return
    model_entry(name)  # an unknown name: the usual error, closest names first


def _shown(layer: Layer | None) -> str:
    if layer is None:
        return "absent"
    dims = f" {','.join(map(str, layer.dims))}" if layer.dims else ""
    return f"{layer.name} ({layer.kind}{dims})"


def check_saved_graph(
    conf: Config, info: Mapping[str, Any], where: str, key: str = "angel.load.model.path"
) -> None:
    """A ConfigError when the job names a network (``ml.model.graph``, from its JSON) and the
    saved AngelModel of ``where`` (its manifest's learner section ``info``) has another: the
    first layer that differs, there and here."""
    saved = dict(info.get("conf", {})).get(MODEL_GRAPH.name)
    text = conf.get(MODEL_GRAPH.name)
    if not saved or not text or not conf.is_set(MODEL_GRAPH.name):
        return
    # The network's shape; its optimizers are training settings a job may change.
    there = [replace(x, optimizer=None) for x in graph_from_text(str(saved), where).layers]
    here = [
        replace(x, optimizer=None)
        for x in graph_from_text(str(text), conf.source(MODEL_GRAPH.name)).layers
    ]
    if there == here:
        return
    i = next(
        i
        for i in range(max(len(there), len(here)))
        if i >= len(there) or i >= len(here) or there[i] != here[i]
    )
    a = there[i] if i < len(there) else None
    b = here[i] if i < len(here) else None
    raise ConfigError(
        f"{key}={where} holds an AngelModel whose network is not the job's "
        f"(ml.model.graph from {conf.source(MODEL_GRAPH.name)}): layer {i + 1} is "
        f"{_shown(a)} there, {_shown(b)} here; use the JSON the model was trained with"
    )
