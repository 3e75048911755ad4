"""One layer of Angel's JSON network graph (an entry of ``layers``), parsed and checked.

:func:`parse_layer` turns a layer's JSON object into a :class:`Layer`: its kind, inputs, output
sizes (an FCLayer's folded ``outputdims`` kept as one chain), transfer functions
(:func:`transfunc`) and own optimizer (:func:`optimizer_overrides`). A type or parameter that is
not supported is a :class:`~angelconf.config.ConfigError` naming its JSON path
(``layers[3].type: ...``). :mod:`learners.models.angel_graph` joins the layers into a graph.

Keys are read case-insensitively throughout the JSON (``"Type"`` is ``"type"``), as the
``data``/``train`` sections and the check for a key given twice read them.

Standard library only (with ``angelconf``): the command line's config-only verbs read it (an
optimizer's values are checked by :class:`angelps.table.OptimizerSpec`, imported on use).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from angelconf.config import ConfigError

__all__ = [
    "JOINS",
    "LAYER_TYPES",
    "LOSSES",
    "TRANSFUNCS",
    "Layer",
    "TransFunc",
    "layer_error",
    "lower_keys",
    "optimizer_overrides",
    "parse_layer",
    "transfunc",
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
#: The kinds that join several inputs (``inputlayers``).
JOINS = ("sum", "mul", "dot", "concat")


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


def layer_error(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}")


def lower_keys(v: Mapping[str, Any]) -> dict[str, Any]:
    """``v`` with its keys in lower case: keys are read case-insensitively (a key given twice in
    two cases is refused when the JSON is read, :func:`learners.models.angel_graph.json_once`)."""
    return {str(k).lower(): x for k, x in v.items()}


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise layer_error(where, f"{json.dumps(v)} is not a size: expected an integer >= 1")
    return v


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise layer_error(
            where, f"{json.dumps(v)} is not a layer name: expected a non-empty string"
        )
    return v


def transfunc(v: Any, where: str) -> TransFunc:
    """A transfer function from its JSON: a name, or ``{"type": ..., "proba": ...}``."""
    if isinstance(v, Mapping):
        v = lower_keys(v)
        extra = sorted(set(v) - {"type", "proba", "actiontype"})
        if extra:
            raise layer_error(
                f"{where}.{extra[0]}", "unknown transfer function parameter (known: type, proba)"
            )
        name, proba = v.get("type"), v.get("proba", 0.5)
        if not isinstance(proba, (int, float)) or isinstance(proba, bool) or not 0 <= proba < 1:
            raise layer_error(
                f"{where}.proba", f"{json.dumps(proba)} is not a probability in [0, 1)"
            )
        where = f"{where}.type"
    else:
        name, proba = v, 0.5
    if not isinstance(name, str) or name.lower() not in TRANSFUNCS:
        raise layer_error(
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
        raise layer_error(
            where, f"{json.dumps(v)} is not an optimizer: expected a name or an object"
        )
    v = lower_keys(v)
    name = v.get("type")
    if not isinstance(name, str) or name.lower() not in _OPT_PARAMS:
        raise layer_error(
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
            raise layer_error(
                f"{where}.lr",
                "a per-layer learning rate is not supported (every layer steps with "
                "ml.learn.rate and its schedule; Angel overwrote it too): remove it",
            )
        if k not in known:
            raise layer_error(
                f"{where}.{k}",
                f"unknown parameter of optimizer {name} (known: {', '.join(sorted(known))})",
            )
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise layer_error(f"{where}.{k}", f"{json.dumps(val)} is not a number")
        _check_value(name, known[k], val, f"{where}.{k}")
        sets.append((known[k], float(val)))
    return name, tuple(sets)


def _check_value(name: str, field: str, val: float, where: str) -> None:
    """The optimizer's own rule for one hyper-parameter (:class:`angelps.table.OptimizerSpec`,
    which the training applies), as a ConfigError naming the JSON place."""
    from angelps.table import OptimizerSpec  # (numpy: imported only when a JSON names values)

    try:
        changes: dict[str, Any] = {field: val}
        replace(OptimizerSpec(name=name), **changes)
    except ValueError as e:
        # "optimizer momentum: l2=-1.0 must be >= 0" -> "must be >= 0"
        text = str(e)
        _, _, rest = text.partition(f" {field}=")
        rule = rest.partition(" ")[2] if rest else text
        raise layer_error(where, f"{json.dumps(val)} {rule}") from None


def _inputs(raw: Mapping[str, Any], kind: str, where: str) -> tuple[str, ...]:
    if kind in _SOURCES:
        for k in ("inputlayer", "inputlayers"):
            if k in raw:
                raise layer_error(
                    f"{where}.{k}",
                    "an input layer or an Embedding reads the sample: it has no input layer",
                )
        return ()
    joins = kind in JOINS
    key, other = ("inputlayers", "inputlayer") if joins else ("inputlayer", "inputlayers")
    if other in raw:
        # Angel reads only one of the two per type; say which (given both, one would be ignored).
        raise layer_error(f"{where}.{other}", f"this layer takes {key}, not {other}")
    if key not in raw:
        raise layer_error(where, f"{key} is missing: the name{'s' if joins else ''} of its input")
    val = raw[key]
    if joins:
        if not isinstance(val, list) or not val:
            raise layer_error(f"{where}.{key}", "expected a non-empty list of layer names")
        return tuple(_name(n, f"{where}.{key}[{i}]") for i, n in enumerate(val))
    return (_name(val, f"{where}.{key}"),)


def parse_layer(raw: Any, i: int, default_act: TransFunc, default_loss: str) -> Layer:
    """The :class:`Layer` of ``layers[i]``; ``default_act``/``default_loss`` apply where it
    names none."""
    where = f"layers[{i}]"
    if not isinstance(raw, Mapping):
        raise layer_error(where, "a layer is a JSON object with name and type")
    written = {str(k).lower(): str(k) for k in raw}
    raw = lower_keys(raw)
    for needed in ("name", "type"):
        if needed not in raw:
            raise layer_error(
                where, f"{needed} is missing (a layer is a JSON object with name and type)"
            )
    name = _name(raw["name"], f"{where}.name")
    if "." in name:
        raise layer_error(f"{where}.name", f"{json.dumps(name)}: a layer name cannot contain '.'")
    typ = raw.get("type")
    kind = LAYER_TYPES.get(typ.lower()) if isinstance(typ, str) else None
    if kind is None:
        raise layer_error(
            f"{where}.type", f"unknown layer type {json.dumps(typ)} (known: {_TYPE_NAMES})"
        )
    inputs_key = set() if kind in _SOURCES else {"inputlayers" if kind in JOINS else "inputlayer"}
    for k in raw:
        if k not in {"name", "type", "inputlayer", "inputlayers"} | _PARAMS[kind]:
            raise layer_error(
                f"{where}.{written[k]}",
                f"{typ} has no parameter {written[k]} "
                f"(known: {', '.join(sorted(_PARAMS[kind] | {'name', 'type'} | inputs_key))})",
            )
    inputs = _inputs(raw, kind, where)
    opt = (
        optimizer_overrides(raw["optimizer"], f"{where}.optimizer") if "optimizer" in raw else None
    )
    dim = _int(raw["outputdim"], f"{where}.outputdim") if "outputdim" in raw else None
    if kind == "input":
        if dim is None:
            raise layer_error(where, "outputdim is missing (the width of the input layer's output)")
        act = (
            transfunc(raw["transfunc"], f"{where}.transfunc") if "transfunc" in raw else default_act
        )
        return Layer(name, kind, inputs, where, (dim,), (act,), optimizer=opt)
    if kind == "embedding":
        if "numfactors" not in raw:
            raise layer_error(where, "numfactors is missing (the embedding size k)")
        k = _int(raw["numfactors"], f"{where}.numfactors")
        return Layer(
            name, kind, inputs, where, () if dim is None else (dim,), factors=k, optimizer=opt
        )
    if kind == "fc":
        return _fc(raw, name, inputs, where, dim, default_act, opt)
    if kind == "loss":
        loss = raw.get("lossfunc", default_loss)
        if not isinstance(loss, str) or loss.lower() not in LOSSES:
            raise layer_error(
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
            raise layer_error(f"{where}.outputdim", "give outputdims or outputdim, not both")
        dl = raw["outputdims"]
        if not isinstance(dl, list) or not dl:
            raise layer_error(f"{where}.outputdims", "expected a non-empty list of sizes")
        dims = tuple(_int(d, f"{where}.outputdims[{j}]") for j, d in enumerate(dl))
    elif dim is not None:
        dims = (dim,)
    else:
        raise layer_error(where, "outputdims (or outputdim) is missing")
    if "transfuncs" in raw:
        if "transfunc" in raw:
            raise layer_error(f"{where}.transfunc", "give transfuncs or transfunc, not both")
        tl = raw["transfuncs"]
        if not isinstance(tl, list) or len(tl) != len(dims):
            raise layer_error(
                f"{where}.transfuncs",
                f"expected a list of {len(dims)} transfer functions, one per output size",
            )
        acts = tuple(transfunc(t, f"{where}.transfuncs[{j}]") for j, t in enumerate(tl))
    elif "transfunc" in raw:
        if len(dims) != 1:
            raise layer_error(f"{where}.transfunc", "outputdims has several sizes: give transfuncs")
        acts = (transfunc(raw["transfunc"], f"{where}.transfunc"),)
    else:
        acts = (default_act,) * len(dims)
    return Layer(name, "fc", inputs, where, dims, acts, optimizer=opt)
