"""Angel's network graph (the ``layers`` of an ``angel.ml.conf`` JSON) as a torch-free description.

:func:`parse_graph` checks a ``layers`` list (with the JSON's ``default_transfunc`` and
``default_lossfunc``) and returns a :class:`Graph`: the layers in an order where every input comes
before its consumer, an FCLayer's folded ``outputdims``/``transfuncs`` kept as one chain. The
driver reads from it what it needs before any model exists (the task its loss implies, whether it
needs one id per field, the PS tables: :mod:`learners.models.graph_tables`); the workers build the torch
module from it (:mod:`learners.models.graph_model`). A layer type or parameter that is not supported is a
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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from angelconf.config import ConfigError
from learners.models.angel_layers import (
    JOINS,
    LOSSES,
    Layer,
    TransFunc,
    lower_keys,
    optimizer_overrides,
    parse_layer,
    transfunc,
)
from learners.models.angel_layers import layer_error as _err

__all__ = [
    "LOSSES",
    "Graph",
    "Layer",
    "RepeatedKey",
    "TransFunc",
    "graph_from_text",
    "graph_text",
    "json_once",
    "optimizer_overrides",
    "parse_graph",
]


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

    def check_classes(self, widths: Mapping[str, int], num_class: int) -> None:
        """A softmaxloss reads one score per class (``ml.num.class``): else a ConfigError."""
        w = widths[self.loss.inputs[0]]
        if self.task == "multiclass" and w not in (-1, num_class):
            raise _err(
                self.loss.path,
                f"softmaxloss reads {w} scores but ml.num.class={num_class}: make them equal",
            )

    def dims(self, num_fields: int | None) -> dict[str, int]:
        """The output width of every layer (an Embedding's: fields × factors, read flat), or a
        ConfigError naming the layer whose declared size or inputs do not fit. Widths that
        depend on the number of fields are checked only when it is known."""
        return _dims(self, num_fields)


def parse_graph(doc: Mapping[str, Any]) -> Graph:
    """The checked :class:`Graph` of a JSON document's ``layers`` (and its
    ``default_transfunc``/``default_lossfunc``); a ConfigError names the first problem by its
    JSON path. Its keys are read case-insensitively, as every key of the JSON."""
    doc = lower_keys(doc)
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise _err("layers", "expected a non-empty list of layers")
    act = (
        transfunc(doc["default_transfunc"], "default_transfunc")
        if doc.get("default_transfunc") is not None
        else TransFunc()
    )
    loss = doc.get("default_lossfunc", "logloss")
    parsed = [parse_layer(raw, i, act, loss) for i, raw in enumerate(layers)]
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
                key = "inputlayers" if layer.kind in JOINS else "inputlayer"
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
    doc = lower_keys(doc)
    return json.dumps({k: doc[k] for k in keep if k in doc}, separators=(",", ":"))


def graph_from_text(text: str, where: str) -> Graph:
    """The :class:`Graph` of an ``ml.model.graph`` value; errors name ``where`` (its source)."""
    try:
        doc = json_once(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"ml.model.graph ({where}) is not valid JSON: {e.msg} at column {e.colno}"
        ) from None
    except RepeatedKey as e:
        raise ConfigError(f"ml.model.graph ({where}): {e.describe(lines=False)}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"ml.model.graph ({where}): expected a JSON object with layers")
    try:
        g = parse_graph(doc)
    except ConfigError as e:
        raise ConfigError(f"ml.model.graph ({where}): {e}") from None
    return Graph(g.layers, where)


# --- JSON that gives no key twice -----------------------------------------------------------------


class RepeatedKey(ValueError):
    """A key given twice in one object of a JSON text: where (``line``, ``col`` and the JSON
    ``path`` of the second) and both: (key, value as written, line, column)."""

    def __init__(
        self, path: str, first: tuple[str, str, int, int], then: tuple[str, str, int, int]
    ):
        super().__init__(path)
        self.path, self.first, self.then = path, first, then
        self.line, self.col = then[2], then[3]

    def describe(self, lines: bool = True) -> str:
        """``<path>: given twice in one object: "lr": 4.0 at line 3, then "lr": 0.001 at line 5;
        keep one`` (columns for ``lines=False``: a one-line JSON)."""
        same_line = self.first[2] == self.then[2]

        def at(k: tuple[str, str, int, int]) -> str:
            pos = f"line {k[2]}" if lines else ""
            if not lines or same_line:
                pos = f"{pos} column {k[3]}".strip()
            return f"{json.dumps(k[0])}: {_brief(k[1])} at {pos}"

        case = " (keys are read case-insensitively)" if self.first[0] != self.then[0] else ""
        return (
            f"{self.path}: given twice in one object: {at(self.first)}, then {at(self.then)}"
            f"{case}; keep one"
        )

    def __str__(self) -> str:
        return self.describe()


def json_once(text: str) -> Any:
    """``json.loads(text)``, a :class:`RepeatedKey` where one object gives a key twice (keys
    compared case-insensitively, as Angel's are read): a JSON parser keeps the last silently,
    where either may be the meant one (a key given twice in a ``.properties`` file is refused
    too). A :class:`json.JSONDecodeError` where the text is not JSON."""
    repeated = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        if len({k.lower() for k, _ in items}) < len(items):
            repeated = True
        return dict(items)

    doc = json.loads(text, object_pairs_hook=pairs)
    if repeated:
        _Walk(text).value(0, "")  # raises RepeatedKey, naming where
    return doc


def _brief(written: str) -> str:
    """A value as written in the JSON, or ``{...}``/``[...]`` for a long object or list."""
    if (len(written) <= 40 and "\n" not in written) or written[0] not in "{[":
        return written
    return "{...}" if written[0] == "{" else "[...]"


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Walk:
    """A walk over valid JSON text that finds the first key given twice in one object (in the
    order of the text) with its JSON path, line and column."""

    def __init__(self, text: str):
        self.text = text

    def _ws(self, i: int) -> int:
        m = _WS.match(self.text, i)
        return m.end() if m else i

    def _at(self, i: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, i) + 1
        return line, i - (self.text.rfind("\n", 0, i) + 1) + 1

    def value(self, i: int, path: str) -> int:
        """The end of the value at ``i`` (after whitespace)."""
        i = self._ws(i)
        c = self.text[i]
        if c == "{":
            return self._object(i + 1, path)
        if c == "[":
            i, n = self._ws(i + 1), 0
            if self.text[i] == "]":
                return i + 1
            while True:
                i = self._ws(self.value(i, f"{path}[{n}]"))
                n += 1
                if self.text[i] == "]":
                    return i + 1
                i += 1  # ","
        return _DECODER.raw_decode(self.text, i)[1]

    def _object(self, i: int, path: str) -> int:
        seen: dict[str, tuple[str, str, int, int]] = {}
        i = self._ws(i)
        if self.text[i] == "}":
            return i + 1
        while True:
            at = i
            key, i = _DECODER.raw_decode(self.text, i)
            i = self._ws(i) + 1  # ":"
            start = self._ws(i)
            sub = f"{path}.{key}" if path else key
            i = self.value(start, sub)
            entry = (key, self.text[start:i], *self._at(at))
            first = seen.get(key.lower())
            if first is not None:
                raise RepeatedKey(sub, first, entry)
            seen[key.lower()] = entry
            i = self._ws(i)
            if self.text[i] == "}":
                return i + 1
            i = self._ws(i + 1)  # ","
