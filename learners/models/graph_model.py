"""AngelModel: the torch module of Angel's JSON layer graph (workers only; the driver reads the
torch-free description of :mod:`learners.models.angel_graph` and the tables of
:mod:`learners.models.graph_tables`).

Layers are evaluated in the graph's order. An input layer is ``act(Σ_j x_j·W[id_j] + b)`` over its
PS tables; an Embedding's output stays the per-non-zero rows ``x_j·v[id_j]`` until a consumer reads
it: BiInnerSumCross and BiInteractionCross sum over each sample's non-zeros (any number of them),
while an FCLayer, a concatenation, a pooling or BiInnerCross read it field by field, ``[B, F·k]``
(one id per field). FCLayers are ``nn.Linear`` chains on the workers, created in the order of the
file under the model's seed, so a graph with the layers of a built-in model (DeepFM,
WideAndDeep, ...) starts from the same weights as that model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from angelconf.config import ConfigError
from angelps.optim import DenseOptimizer, apply
from angelps.table import OptimizerSpec
from learners.models.angel_graph import Graph, Layer, TransFunc
from learners.models.config import ModelConfig
from learners.models.graph_tables import table_names
from learners.models.sparse_input import SparseInput
from learners.models.zoo import BaseModel

__all__ = ["GraphModel"]


def _act(t: TransFunc) -> nn.Module:
    if t.name == "dropout":
        # Angel scales by (1-p) at prediction; inverted dropout scales in training: the same
        # expectation, and prediction reads the weights as they are.
        return nn.Dropout(t.proba)
    if t.name == "softmax":
        return nn.Softmax(dim=1)
    return {"identity": nn.Identity, "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}[
        t.name
    ]()


class _Embedded:
    """An Embedding's output in a batch: the rows ``x_j·v[id_j]`` per non-zero."""

    def __init__(self, x: SparseInput, e: Tensor) -> None:
        self.x, self.e = x, e

    def fields(self) -> Tensor:
        """``[B, F, k]``: one row per field (requires ml.fm.field.num ids in every sample)."""
        x = self.x
        if x.num_fields is None:
            raise ValueError(
                "this graph reads an Embedding field by field: every sample needs exactly "
                "ml.fm.field.num ids (one per field); set ml.fm.field.num"
            )
        return self.e.view(x.batch_size, x.num_fields, self.e.shape[1])

    def flat(self) -> Tensor:
        return self.fields().flatten(1)

    def bi_interaction(self) -> Tensor:
        """``½[(Σ_j u_j)² − Σ_j u_j²]`` per sample: ``[B, k]``."""
        s = self.x.per_sample(self.e)
        sq = self.x.per_sample(self.e * self.e)
        return 0.5 * (s * s - sq)


class GraphModel(BaseModel):
    """The network of an ``angel.ml.conf`` JSON (``ml.model.graph``)."""

    angel_name = "AngelModel"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        graph = cfg.graph
        assert graph is not None
        self.graph: Graph = graph
        # Per instance: a graph's task is its loss's, its field needs its layers'.
        self.task = graph.task  # type: ignore[misc]
        self.needs_fields = graph.needs_fields  # type: ignore[misc]
        self.widths = graph.dims(cfg.num_fields)
        # FC chains by layer name (for freezing by name), input layers' transfer functions.
        self.fc = nn.ModuleDict()
        self.acts = nn.ModuleDict()
        for layer in graph.layers:
            if layer.kind == "fc":
                self.fc[layer.name] = self._chain(layer)
            elif layer.kind == "input":
                self.acts[layer.name] = _act(layer.acts[0])
        try:
            graph.check_classes(self.widths, cfg.num_class)
        except ConfigError as e:
            raise ConfigError(f"ml.model.graph ({graph.source}): {e}") from None

    def _chain(self, layer: Layer) -> nn.Sequential:
        d = self.widths[layer.inputs[0]]
        if d < 1:  # an Embedding read flat without the field count
            raise ConfigError(
                f"ml.model.graph ({self.graph.source}): {layer.path}: the width of its input "
                "is not known: set ml.fm.field.num (one id per field)"
            )
        mods: list[nn.Module] = []
        for out, act in zip(layer.dims, layer.acts, strict=True):
            mods.append(nn.Linear(d, out))
            if act.name != "identity":
                mods.append(_act(act))
            d = out
        return nn.Sequential(*mods)

    def dense_modules(self) -> dict[str, nn.Module]:
        return dict(self.fc.items())

    def param_optimizer(self, name: str) -> tuple[str, tuple[tuple[str, float], ...]] | None:
        # parameters are named fc.<layer>.<i>.weight|bias
        parts = name.split(".")
        if len(parts) > 1 and parts[0] == "fc":
            return self.graph.layer(parts[1]).optimizer
        return None

    def dense_optimizer(
        self, params: Sequence[nn.Parameter], spec: OptimizerSpec
    ) -> DenseOptimizer:
        """One optimizer over every trainable dense parameter, each stepping with its FCLayer's
        own optimizer where the JSON names one (over ``spec``'s hyper-parameters), else ``spec``."""
        named = {id(p): n for n, p in self.named_parameters()}
        specs = []
        for p in params:
            own = self.param_optimizer(named.get(id(p), ""))
            fields: dict[str, Any] = dict(own[1]) if own is not None else {}
            specs.append(spec if own is None else replace(spec, name=own[0], **fields))
        if all(s == spec for s in specs):
            return DenseOptimizer(params, spec)
        return _LayerwiseOptimizer(params, specs)

    # --- forward -------------------------------------------------------------------------------

    def forward(self, x: SparseInput) -> Tensor:
        out: dict[str, Any] = {}
        for layer in self.graph.layers:
            out[layer.name] = self._layer(layer, x, out)
        return out[self.graph.loss.name]

    def _dense(self, v: Any) -> Tensor:
        return v.flat() if isinstance(v, _Embedded) else v

    def _layer(self, layer: Layer, x: SparseInput, out: dict[str, Any]) -> Any:
        kind = layer.kind
        ins = [out[i] for i in layer.inputs]
        if kind == "input":
            w, b = table_names("input", layer.name)
            return self.acts[layer.name](x.linear(w, b))
        if kind == "embedding":
            return _Embedded(x, x.weighted_rows(table_names("embedding", layer.name)[0]))
        if kind == "fc":
            return self.fc[layer.name](self._dense(ins[0]))
        if kind == "innersumcross":
            return ins[0].bi_interaction().sum(dim=1, keepdim=True)
        if kind == "interactioncross":
            return ins[0].bi_interaction()
        if kind == "innercross":
            e = ins[0].fields()
            f = e.shape[1]
            iu = torch.triu_indices(f, f, offset=1, device=e.device)
            return (e[:, iu[0], :] * e[:, iu[1], :]).sum(dim=2)
        if kind == "concat":
            return torch.cat([self._dense(v) for v in ins], dim=1)
        if kind in ("sum", "mul", "dot"):
            acc = self._dense(ins[0])
            for v in ins[1:]:
                acc = acc + self._dense(v) if kind == "sum" else acc * self._dense(v)
            return acc.sum(dim=1, keepdim=True) if kind == "dot" else acc
        # the loss layer: the scores of its input
        s = self._dense(ins[0])
        return s if self.task == "multiclass" else s.squeeze(1)

    # --- loss and prediction -------------------------------------------------------------------

    def loss(self, scores: Tensor, labels: Tensor) -> Tensor:
        fn = self.graph.loss.loss
        if fn == "logloss":
            return F.binary_cross_entropy_with_logits(scores, labels)
        if fn == "hingeloss":
            return torch.clamp(1 - (labels * 2 - 1) * scores, min=0).mean()
        if fn == "l2loss":
            return 0.5 * F.mse_loss(scores, labels)
        if fn == "huberloss":
            return F.huber_loss(scores, labels, delta=self.cfg.huber_delta)
        return F.cross_entropy(scores, labels)  # softmaxloss

    def predict(self, scores: Tensor) -> Tensor:
        fn = self.graph.loss.loss
        if fn == "logloss":
            return torch.sigmoid(scores)
        if fn == "hingeloss":
            return torch.sigmoid(2 * scores)  # as Angel reports a hinge model's probability
        if fn == "softmaxloss":
            return scores.argmax(dim=1)
        return scores

    def prepare_labels(self, labels: Tensor) -> Tensor:
        if self.task != "multiclass":
            return labels.to(torch.float32)
        c = self.cfg.num_class
        y = labels.to(torch.int64)
        bad = (y < 0) | (y >= c) | (y.to(labels.dtype) != labels)
        if bool(bad.any()):
            raise ValueError(
                f"label {labels[bad][0].item():g} is not a class index in 0..{c - 1} "
                f"(ml.num.class={c}); use ml.data.label.trans.class=SubOneTrans for labels 1..C"
            )
        return y


class _LayerwiseOptimizer(DenseOptimizer):
    """A :class:`~angelps.optim.DenseOptimizer` whose parameters step with their own specs (the
    FCLayers of a JSON graph that name an optimizer); its state has the same shape, so the
    worker's checkpoint saves and restores it alike."""

    def __init__(self, params: Sequence[nn.Parameter], specs: Sequence[OptimizerSpec]) -> None:
        parts = [DenseOptimizer([p], s) for p, s in zip(params, specs, strict=True)]
        self.spec = parts[0].spec
        self.specs = [o.spec for o in parts]
        self.params = [o.params[0] for o in parts]
        self.param_groups = [{"lr": 0.0}]
        self.state = [o.state[0] for o in parts]
        self._cycling = [o.cycles for o in parts]
        self.cycles = any(self._cycling)
        self._torch_slots = {k: v for o in parts for k, v in o._torch_slots.items()}

    def step(self, lr: float, momentum: float | None = None) -> None:
        self.param_groups[0]["lr"] = lr
        with torch.no_grad():
            for p, st, spec, cycles in zip(
                self.params, self.state, self.specs, self._cycling, strict=True
            ):
                if p.grad is not None:
                    m = momentum if cycles else None
                    apply(spec, p.view(1, -1), st, p.grad.view(1, -1), lr, m)
