"""Angel's network graph (the ``layers`` of an ``angel.ml.conf`` JSON) as a torch-free description.

:func:`parse_graph` checks a ``layers`` list (with the JSON's ``default_transfunc`` and
``default_lossfunc``) and returns a :class:`Graph`: the layers in an order where every input comes
before its consumer, an FCLayer's folded ``outputdims``/``transfuncs`` kept as one chain. The
driver reads from it what it needs before any model exists (the task its loss implies, whether it
needs one id per field, the PS tables: :mod:`learners.graph_tables`); the workers build the torch
module from it (:mod:`learners.graph_model`). A layer type or parameter that is not supported is a
:class:`~angelconf.config.ConfigError` naming it and its JSON path (``layers[3].type: ...``).

Standard library only (with ``angelconf``): the command line's config-only verbs read it.

Layers (type names case-insensitive, as in Angel):

===================== ========================================================== ===============
type                  output                                                     PS table
===================== ========================================================== ===============
SimpleInputLayer      ``act(W·x + b)``, ``outputdim`` columns                    W sparse, b
Embedding             ``x_i·v_i`` per non-zero (``numfactors`` columns)          v sparse
FCLayer               ``act_n(…act_1(W_1·h + b_1)…)``, one per ``outputdims``    (workers)
BiInnerSumCross       ``½[(Σu_i)² − Σu_i²]`` summed over the factors: 1          (none)
BiInteractionCross    ``½[(Σu_i)² − Σu_i²]``: ``numfactors``                     (none)
BiInnerCross          ``<u_i, u_j>`` for every pair of fields: F(F−1)/2          (none)
SumPooling/MulPooling the element-wise sum/product of the inputs                 (none)
DotPooling            the element-wise product of the inputs summed: 1           (none)
ConcatLayer           the inputs side by side                                    (none)
SimpleLossLayer       the loss of ``lossfunc`` on its input                      (none)
===================== ========================================================== ===============
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from angelconf.config import ConfigError

__all__ = [
    "LAYER_TYPES",
    "LOSSES",
    "TRANSFUNCS",
    "Graph",
    "Layer",
    "TransFunc",
    "graph_from_text",
    "graph_text",
    "optimizer_overrides",
    "parse_graph",
]

#: Angel's layer type names (lower case) -> the kind used here.
LAYER_TYPES: dict[str, str] = {
    "simpleinputlayer": "input",
    "sparseinputlayer": "input",
    "denseinputlayer": "input",
    "embedding": "embedding",
    "fclayer": "fc",
    "biinnersumcross": "innersumcross",
    "biinteractioncross": "interactioncross",
    "biinnercross": "innercross",
    "sumpooling": "sum",
    "mulpooling": "mul",
    "dotpooling": "dot",
    "concatlayer": "concat",
    "simplelosslayer": "loss",
}
#: The spelling of each type in messages.
_TYPE_NAMES = (
    "SimpleInputLayer (SparseInputLayer, DenseInputLayer), Embedding, FCLayer, BiInnerSumCross, "
    "BiInteractionCross, BiInnerCross, SumPooling, MulPooling, DotPooling, ConcatLayer, "
    "SimpleLossLayer"
)
#: Transfer functions (Angel's names, lower case).
TRANSFUNCS = ("identity", "relu", "sigmoid", "tanh", "softmax", "dropout")
#: Loss functions -> the task they train.
LOSSES: dict[str, str] = {
    "logloss": "binary",
    "hingeloss": "binary",
    "l2loss": "regression",
    "huberloss": "regression",
    "softmaxloss": "multiclass",
}
#: An optimizer's JSON parameters -> OptimizerSpec fields, by optimizer (Angel's names).
_OPT_PARAMS: dict[str, dict[str, str]] = {
    "sgd": {},
    "momentum": {"momentum": "momentum"},
    "adam": {"beta": "beta1", "gamma": "beta2", "epsilon": "eps"},
    "adagrad": {"beta": "rho", "epsilon": "eps"},
    "rmsprop": {"beta": "rho", "epsilon": "eps"},
    "ftrl": {"alpha": "ftrl_alpha", "beta": "ftrl_beta"},
}
_REG_PARAMS = {"reg1": "l1", "reg2": "l2"}
# Which parameters each kind reads (besides name, type, inputs): anything else is refused.
_PARAMS: dict[str, set[str]] = {
    "input": {"outputdim", "transfunc", "optimizer"},
    "embedding": {"outputdim", "numfactors", "optimizer"},
    "fc": {"outputdim", "outputdims", "transfunc", "transfuncs", "optimizer"},
    "innersumcross": {"outputdim"},
    "interactioncross": {"outputdim"},
    "innercross": {"outputdim"},
    "sum": {"outputdim"},
    "mul": {"outputdim"},
    "dot": {"outputdim"},
    "concat": {"outputdim"},
    "loss": {"lossfunc", "outputdim"},
}
_SOURCES = ("input", "embedding")  # the layers that read the sample (no input layer)


@dataclass(frozen=True)
class TransFunc:
    """A transfer function: its name and, for dropout, the probability ``proba``."""

    name: str = "identity"
    proba: float = 0.5


@dataclass(frozen=True)
class Layer:
    """One layer of the graph. ``dims`` is the output size of each step of an FCLayer chain
    (one entry for any other layer that declares its size); ``acts`` one transfer function per
    step (input layers: one). ``optimizer`` is (name, ((field, value), ...)) when the layer
    names its own, else None (the role's ``ml.*.optimizer``). ``path`` is ``layers[i]``."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    path: str
    dims: tuple[int, ...] = ()
    acts: tuple[TransFunc, ...] = ()
    factors: int = 0
    optimizer: tuple[str, tuple[tuple[str, float], ...]] | None = None
    loss: str = ""


@dataclass(frozen=True)
class Graph:
    """A checked layer graph: ``layers`` with every input before its consumers, the loss last."""

    layers: tuple[Layer, ...]
    source: str = field(default="", compare=False)

    @property
    def loss(self) -> Layer:
        return self.layers[-1]

    @property
    def task(self) -> str:
        """binary, multiclass or regression: what the loss function trains."""
        return LOSSES[self.loss.loss]

    def layer(self, name: str) -> Layer:
        return next(layer for layer in self.layers if layer.name == name)

    @property
    def needs_fields(self) -> bool:
        """True when an Embedding's output is read field by field (FCLayer, BiInnerCross,
        a pooling or concatenation of it): every sample then needs one id per field."""
        return any(
            self.layer(i).kind == "embedding"
            for layer in self.layers
            if layer.kind not in ("innersumcross", "interactioncross")
            for i in layer.inputs
        )

    def dims(self, num_fields: int | None) -> dict[str, int]:
        """The output width of every layer (an Embedding's: fields × factors, read flat), or a
        ConfigError naming the layer whose declared size or inputs do not fit. Widths that
        depend on the number of fields are checked only when it is known."""
        return _dims(self, num_fields)


def _err(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}")


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _err(where, f"{json.dumps(v)} is not a size: expected an integer >= 1")
    return v


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise _err(where, f"{json.dumps(v)} is not a layer name: expected a non-empty string")
    return v


def transfunc(v: Any, where: str) -> TransFunc:
    """A transfer function from its JSON: a name, or ``{"type": ..., "proba": ...}``."""
    if isinstance(v, Mapping):
        extra = sorted(set(v) - {"type", "proba", "actiontype"})
        if extra:
            raise _err(
                f"{where}.{extra[0]}", "unknown transfer function parameter (known: type, proba)"
            )
        name, proba = v.get("type"), v.get("proba", 0.5)
        if not isinstance(proba, (int, float)) or isinstance(proba, bool) or not 0 <= proba < 1:
            raise _err(f"{where}.proba", f"{json.dumps(proba)} is not a probability in [0, 1)")
        where = f"{where}.type"
    else:
        name, proba = v, 0.5
    if not isinstance(name, str) or name.lower() not in TRANSFUNCS:
        raise _err(
            where,
            f"unknown transfer function {json.dumps(name)} (known: {', '.join(TRANSFUNCS)})",
        )
    return TransFunc(name.lower(), float(proba))


def optimizer_overrides(v: Any, where: str) -> tuple[str, tuple[tuple[str, float], ...]]:
    """An optimizer from its JSON (a name, or ``{"type": ..., "momentum": ..., "reg2": ...}``):
    its name and the OptimizerSpec fields it sets."""
    if isinstance(v, str):
        v = {"type": v}
    if not isinstance(v, Mapping):
        raise _err(where, f"{json.dumps(v)} is not an optimizer: expected a name or an object")
    name = v.get("type")
    if not isinstance(name, str) or name.lower() not in _OPT_PARAMS:
        raise _err(
            f"{where}.type",
            f"unknown optimizer {json.dumps(name)} (known: {', '.join(_OPT_PARAMS)})",
        )
    name = name.lower()
    known = {**_OPT_PARAMS[name], **_REG_PARAMS}
    sets: list[tuple[str, float]] = []
    for k, val in v.items():
        if k == "type":
            continue
        if k == "lr":
            raise _err(
                f"{where}.lr",
                "a per-layer learning rate is not supported (every layer steps with "
                "ml.learn.rate and its schedule; Angel overwrote it too): remove it",
            )
        if k not in known:
            raise _err(
                f"{where}.{k}",
                f"unknown parameter of optimizer {name} (known: {', '.join(sorted(known))})",
            )
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise _err(f"{where}.{k}", f"{json.dumps(val)} is not a number")
        sets.append((known[k], float(val)))
    return name, tuple(sets)


def _inputs(raw: Mapping[str, Any], kind: str, where: str) -> tuple[str, ...]:
    if kind in _SOURCES:
        for k in ("inputlayer", "inputlayers"):
            if k in raw:
                raise _err(
                    f"{where}.{k}",
                    "an input layer or an Embedding reads the sample: it has no input layer",
                )
        return ()
    joins = kind in ("sum", "mul", "dot", "concat")
    key, other = ("inputlayers", "inputlayer") if joins else ("inputlayer", "inputlayers")
    if other in raw and key not in raw:
        # Angel reads only one of the two per type; say which.
        raise _err(f"{where}.{other}", f"this layer takes {key}, not {other}")
    if key not in raw:
        raise _err(where, f"{key} is missing: the name{'s' if joins else ''} of its input")
    val = raw[key]
    if joins:
        if not isinstance(val, list) or not val:
            raise _err(f"{where}.{key}", "expected a non-empty list of layer names")
        return tuple(_name(n, f"{where}.{key}[{i}]") for i, n in enumerate(val))
    return (_name(val, f"{where}.{key}"),)


def _layer(raw: Any, i: int, default_act: TransFunc, default_loss: str) -> Layer:
    where = f"layers[{i}]"
    if not isinstance(raw, Mapping):
        raise _err(where, "a layer is a JSON object with name and type")
    name = _name(raw.get("name"), f"{where}.name")
    if "." in name:
        raise _err(f"{where}.name", f"{json.dumps(name)}: a layer name cannot contain '.'")
    typ = raw.get("type")
    kind = LAYER_TYPES.get(typ.lower()) if isinstance(typ, str) else None
    if kind is None:
        raise _err(f"{where}.type", f"unknown layer type {json.dumps(typ)} (known: {_TYPE_NAMES})")
    for k in raw:
        if k not in {"name", "type", "inputlayer", "inputlayers"} | _PARAMS[kind]:
            raise _err(
                f"{where}.{k}",
                f"{typ} has no parameter {k} "
                f"(known: {', '.join(sorted(_PARAMS[kind] | {'name', 'type'}))})",
            )
    inputs = _inputs(raw, kind, where)
    opt = (
        optimizer_overrides(raw["optimizer"], f"{where}.optimizer") if "optimizer" in raw else None
    )
    dim = _int(raw["outputdim"], f"{where}.outputdim") if "outputdim" in raw else None
    if kind == "input":
        if dim is None:
            raise _err(where, "outputdim is missing (the width of the input layer's output)")
        act = (
            transfunc(raw["transfunc"], f"{where}.transfunc") if "transfunc" in raw else default_act
        )
        return Layer(name, kind, inputs, where, (dim,), (act,), optimizer=opt)
    if kind == "embedding":
        if "numfactors" not in raw:
            raise _err(where, "numfactors is missing (the embedding size k)")
        k = _int(raw["numfactors"], f"{where}.numfactors")
        return Layer(
            name, kind, inputs, where, () if dim is None else (dim,), factors=k, optimizer=opt
        )
    if kind == "fc":
        return _fc(raw, name, inputs, where, dim, default_act, opt)
    if kind == "loss":
        loss = raw.get("lossfunc", default_loss)
        if not isinstance(loss, str) or loss.lower() not in LOSSES:
            raise _err(
                f"{where}.lossfunc",
                f"unknown loss function {json.dumps(loss)} (known: {', '.join(LOSSES)})",
            )
        return Layer(name, kind, inputs, where, loss=loss.lower())
    return Layer(name, kind, inputs, where, () if dim is None else (dim,))


def _fc(
    raw: Mapping[str, Any],
    name: str,
    inputs: tuple[str, ...],
    where: str,
    dim: int | None,
    default_act: TransFunc,
    opt: tuple[str, tuple[tuple[str, float], ...]] | None,
) -> Layer:
    """An FCLayer: ``outputdims`` with ``transfuncs`` (Angel's folded chain) or one
    ``outputdim`` with its ``transfunc``."""
    if "outputdims" in raw:
        if "outputdim" in raw:
            raise _err(f"{where}.outputdim", "give outputdims or outputdim, not both")
        dl = raw["outputdims"]
        if not isinstance(dl, list) or not dl:
            raise _err(f"{where}.outputdims", "expected a non-empty list of sizes")
        dims = tuple(_int(d, f"{where}.outputdims[{j}]") for j, d in enumerate(dl))
    elif dim is not None:
        dims = (dim,)
    else:
        raise _err(where, "outputdims (or outputdim) is missing")
    if "transfuncs" in raw:
        tl = raw["transfuncs"]
        if not isinstance(tl, list) or len(tl) != len(dims):
            raise _err(
                f"{where}.transfuncs",
                f"expected a list of {len(dims)} transfer functions, one per output size",
            )
        acts = tuple(transfunc(t, f"{where}.transfuncs[{j}]") for j, t in enumerate(tl))
    elif "transfunc" in raw:
        if len(dims) != 1:
            raise _err(f"{where}.transfunc", "outputdims has several sizes: give transfuncs")
        acts = (transfunc(raw["transfunc"], f"{where}.transfunc"),)
    else:
        acts = (default_act,) * len(dims)
    return Layer(name, "fc", inputs, where, dims, acts, optimizer=opt)


def parse_graph(doc: Mapping[str, Any]) -> Graph:
    """The checked :class:`Graph` of a JSON document's ``layers`` (and its
    ``default_transfunc``/``default_lossfunc``); a ConfigError names the first problem by its
    JSON path."""
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise _err("layers", "expected a non-empty list of layers")
    act = (
        transfunc(doc["default_transfunc"], "default_transfunc")
        if doc.get("default_transfunc") is not None
        else TransFunc()
    )
    loss = doc.get("default_lossfunc", "logloss")
    parsed = [_layer(raw, i, act, loss) for i, raw in enumerate(layers)]
    by_name: dict[str, Layer] = {}
    for layer in parsed:
        if layer.name in by_name:
            raise _err(
                f"{layer.path}.name",
                f"{json.dumps(layer.name)} is already the name of {by_name[layer.name].path}",
            )
        by_name[layer.name] = layer
    for layer in parsed:
        for j, i in enumerate(layer.inputs):
            if i not in by_name:
                key = (
                    "inputlayers" if layer.kind in ("sum", "mul", "dot", "concat") else "inputlayer"
                )
                at = f"{layer.path}.{key}" + (f"[{j}]" if key == "inputlayers" else "")
                raise _err(at, f"no layer is named {json.dumps(i)} (layers: {', '.join(by_name)})")
            if by_name[i].kind == "loss":
                raise _err(f"{layer.path}", f"its input {json.dumps(i)} is a loss layer")
    losses = [layer for layer in parsed if layer.kind == "loss"]
    if len(losses) != 1:
        where = losses[1].path if losses else "layers"
        raise _err(where, f"expected exactly one SimpleLossLayer, found {len(losses)}")
    order = _topological(parsed, by_name)
    used = _ancestors(losses[0], by_name)
    unused = [layer for layer in parsed if layer.name not in used and layer.kind != "loss"]
    if unused:
        raise _err(
            unused[0].path,
            f"layer {json.dumps(unused[0].name)} does not lead to the loss layer "
            f"{json.dumps(losses[0].name)}: connect it or remove it",
        )
    graph = Graph(tuple(order))
    graph.dims(None)
    return graph


def _topological(layers: Sequence[Layer], by_name: Mapping[str, Layer]) -> list[Layer]:
    """The layers with every input first, in the file's order otherwise (so that the torch
    layers are created, and initialised, in the order they were written); a cycle is an error."""
    done: set[str] = set()
    out: list[Layer] = []

    def visit(layer: Layer, stack: tuple[str, ...]) -> None:
        if layer.name in done:
            return
        if layer.name in stack:
            cycle = " -> ".join((*stack[stack.index(layer.name) :], layer.name))
            raise _err(layer.path, f"the layers form a cycle: {cycle}")
        for i in layer.inputs:
            visit(by_name[i], (*stack, layer.name))
        done.add(layer.name)
        out.append(layer)

    for layer in layers:
        if layer.kind != "loss":
            visit(layer, ())
    loss = next(layer for layer in layers if layer.kind == "loss")
    visit(loss, ())
    return out


def _ancestors(layer: Layer, by_name: Mapping[str, Layer]) -> set[str]:
    seen: set[str] = set()
    todo = list(layer.inputs)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(by_name[n].inputs)
    return seen


def _dims(graph: Graph, f: int | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for layer in graph.layers:
        ins = [out.get(i, -1) for i in layer.inputs]  # -1: not known without the field count
        emb = [graph.layer(i) for i in layer.inputs if graph.layer(i).kind == "embedding"]
        d = _width(layer, ins, emb, f)
        declared = layer.dims[-1] if layer.dims else None
        if layer.kind not in ("fc", "input", "loss") and declared is not None and d >= 0:
            if declared != d:
                raise _err(
                    f"{layer.path}.outputdim",
                    f"{declared} does not match the layer's output width {d} ({_why(layer, emb, f)})",
                )
        out[layer.name] = d
    loss = graph.loss
    width = out[loss.inputs[0]]
    if len(loss.inputs) != 1:
        raise _err(f"{loss.path}.inputlayer", "a loss layer has one input")
    if LOSSES[loss.loss] != "multiclass" and width not in (1, -1):
        raise _err(
            loss.path,
            f"{loss.loss} needs one score per sample, but its input {json.dumps(loss.inputs[0])} "
            f"has width {width}",
        )
    return out


def _why(layer: Layer, emb: list[Layer], f: int | None) -> str:
    if layer.kind == "embedding":
        return f"{f} fields x numfactors {layer.factors}"
    if layer.kind == "innercross":
        return f"{f} fields: F(F-1)/2 pairs"
    if layer.kind == "interactioncross":
        return f"numfactors {emb[0].factors} of {emb[0].name}" if emb else "its input's width"
    return "from its inputs"


def _width(layer: Layer, ins: list[int], emb: list[Layer], f: int | None) -> int:
    kind = layer.kind
    if kind == "input":
        return layer.dims[0]
    if kind == "embedding":
        return f * layer.factors if f else -1
    if kind == "fc":
        return layer.dims[-1]
    if kind == "loss":
        return ins[0]
    if kind in ("innersumcross", "interactioncross", "innercross"):
        if len(emb) != 1:
            raise _err(f"{layer.path}.inputlayer", "its input must be an Embedding layer")
        if kind == "innersumcross":
            return 1
        if kind == "interactioncross":
            return emb[0].factors
        return f * (f - 1) // 2 if f else -1
    if kind == "concat":
        return -1 if -1 in ins else sum(ins)
    # sum, mul, dot: inputs of one width
    known = {w for w in ins if w >= 0}
    if len(known) > 1:
        shown = ", ".join(f"{n} {w}" for n, w in zip(layer.inputs, ins, strict=True))
        raise _err(f"{layer.path}.inputlayers", f"inputs of different widths ({shown})")
    if kind == "dot":
        return 1
    return known.pop() if known else -1


def graph_text(doc: Mapping[str, Any]) -> str:
    """The part of a JSON document that defines the network, as one line of JSON (the value of
    ``ml.model.graph``)."""
    keep = ("layers", "default_transfunc", "default_lossfunc")
    return json.dumps({k: doc[k] for k in keep if k in doc}, separators=(",", ":"))


def graph_from_text(text: str, where: str) -> Graph:
    """The :class:`Graph` of an ``ml.model.graph`` value; errors name ``where`` (its source)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"ml.model.graph ({where}) is not valid JSON: {e.msg} at column {e.colno}"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"ml.model.graph ({where}): expected a JSON object with layers")
    try:
        g = parse_graph(doc)
    except ConfigError as e:
        raise ConfigError(f"ml.model.graph ({where}): {e}") from None
    return Graph(g.layers, where)
