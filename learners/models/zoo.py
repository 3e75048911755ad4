"""The model zoo: Angel's models as plain ``torch.nn.Module``s over pulled parameter rows.

A model never talks to the parameter server. It *declares* the PS tables it needs
(:class:`learners.models.table_decl.TableDecl`: sparse weights and embeddings keyed by feature id, plus tiny
dense tables for biases), and its ``forward`` receives the rows the learner pulled for one batch
in a :class:`learners.models.sparse_input.SparseInput`. It is built from a
:class:`learners.models.config.ModelConfig` (the ``ml.model.*`` keys and their neighbours are
declared there, torch-free) by :func:`build_model`. Dense layers (the MLPs of DeepFM,
WideAndDeep, NFM, PNN and DNN) are ordinary ``nn.Module`` parameters that live on the worker
(or, with ``angel.dense.placement=ps``, are mirrored into PS tables by the learner).

Every model returns one tensor of *scores*: a logit per sample for binary models, a logit per
class for multi-class models, the predicted value for regression. ``loss`` turns scores and
labels into a mean loss, ``predict`` into what ``angelps predict`` writes (the probability of
the positive class, the class, or the value).

Invariants: ``tables()`` depends only on the :class:`~learners.models.config.ModelConfig`, so the
driver and every worker declare the same tables; ``build_model(cfg, seed)`` with the same seed
gives the same worker-side layers on every worker; a model reads pulled rows only through its
``SparseInput``.

Graphs follow Angel's (Angel-ML/angel: angel-ps/mllib/.../ml/{classification,regression}/):

========================== ============================================================ ==========
model                      graph                                                        loss
========================== ============================================================ ==========
LogisticRegression         w·x + b                                                      log loss
SupportVectorMachine       w·x + b                                                      hinge
SoftmaxRegression          W·x + b (C outputs)                                          softmax CE
MixedLogisticRegression    Σ_r softmax(U·x)_r · sigmoid(W·x)_r                          CE
LinearRegression           w·x + b                                                      ½(f−y)²
RobustRegression           w·x + b                                                      Huber(δ)
FactorizationMachines      w·x + b + ½Σ_k[(Σ_i v_ik x_i)² − Σ_i v_ik² x_i²]             log loss
DeepFM                     wide + FM + MLP(concat_f x_f v_f)                            log loss
WideAndDeep                wide + MLP(concat_f x_f v_f)                                 log loss
NeuralFactorizationMachines wide + MLP(½[(Σ_f e_f)² − Σ_f e_f²])                        log loss
ProductNeuralNetwork       wide + MLP(concat(e_1..e_F, <e_i,e_j> for i<j))              log loss
DNN                        MLP(act(W·x + b)), the first layer a sparse PS table         log loss
========================== ============================================================ ==========
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from angelconf.config import ConfigError
from angelps.optim import DenseOptimizer
from angelps.table import OptimizerSpec
from learners.models.config import ModelConfig
from learners.models.registry import MODELS as REGISTRY
from learners.models.registry import model_entry
from learners.models.sparse_input import SparseInput
from learners.models.table_decl import TableDecl
from learners.models.tables import DNN_HIDDEN, model_tables

__all__ = [
    "MODELS",
    "BaseModel",
    "build_model",
    "model_class",
]

# The torch class of every name learners.models.config.ACTIVATIONS accepts.
_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
    "gelu": nn.GELU,
    "leaky_relu": nn.LeakyReLU,
}


# --- the base class ------------------------------------------------------------------------------


class BaseModel(nn.Module):
    """Common interface: declared tables, forward over pulled rows, loss, prediction."""

    #: Angel's class name (the registry key).
    angel_name: ClassVar[str] = ""
    #: "binary", "multiclass" or "regression": which labels, metrics and prediction apply.
    task: ClassVar[str] = "binary"
    #: True when the model needs one id per field (exactly ml.fm.field.num non-zeros per row).
    needs_fields: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Task and field needs are stated once, in the model's registry entry, which the
        # driver reads without torch; a model class takes them from there.
        super().__init_subclass__(**kwargs)
        info = REGISTRY.get(cls.__dict__.get("angel_name", ""))
        if info is not None:
            cls.task, cls.needs_fields = info.task, info.needs_fields

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def tables(self) -> list[TableDecl]:
        """The PS tables this model reads (sparse weights, embeddings, biases): stated once, in
        learners.models.tables, which the driver reads without torch."""
        return model_tables(self.cfg)

    def forward(self, x: SparseInput) -> Tensor:
        raise NotImplementedError

    # Binary models: scores are logits; labels are 0/1 floats.
    def loss(self, scores: Tensor, labels: Tensor) -> Tensor:
        """Mean loss of a batch."""
        return F.binary_cross_entropy_with_logits(scores, labels)

    def predict(self, scores: Tensor) -> Tensor:
        """What prediction writes: P(y=1) for binary models."""
        return torch.sigmoid(scores)

    def prepare_labels(self, labels: Tensor) -> Tensor:
        """Labels in the form ``loss`` expects (0/1 floats for binary models)."""
        return labels.to(torch.float32)

    def dense_modules(self) -> dict[str, nn.Module]:
        """Worker-side dense layers by name (for freezing and placement)."""
        return {name: m for name, m in self.named_children()}

    def dense_optimizer(
        self, params: Sequence[nn.Parameter], spec: OptimizerSpec
    ) -> DenseOptimizer:
        """The workers' optimizer of the trainable dense ``params``: ``spec``
        (``ml.fclayer.optimizer``) for all of them; a JSON graph's layers may name their own."""
        return DenseOptimizer(params, spec)

    def param_optimizer(self, name: str) -> tuple[str, tuple[tuple[str, float], ...]] | None:
        """A dense parameter's own optimizer (name, OptimizerSpec fields) when its layer names
        one (a JSON graph), else None: ``ml.fclayer.optimizer``."""
        return None


def _mlp(
    in_dim: int, hidden: Sequence[int], acts: Sequence[str], dropout: float, out: int
) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = in_dim
    for h, a in zip(hidden, acts, strict=True):
        layers.append(nn.Linear(d, h))
        layers.append(_ACTIVATIONS[a.lower()]())
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        d = h
    layers.append(nn.Linear(d, out))
    return nn.Sequential(*layers)


def _hidden(cfg: ModelConfig, default: list[int]) -> tuple[list[int], list[str]]:
    """The MLP's hidden sizes (``ml.model.hidden.layers``, else the model's ``default``) and one
    activation name per hidden layer."""
    hidden = list(cfg.hidden) if cfg.hidden is not None else default
    return hidden, _acts(cfg, len(hidden))


def _acts(cfg: ModelConfig, n: int) -> list[str]:
    acts = cfg.activations or ("relu",)
    if len(acts) == 1:
        return list(acts) * n
    if len(acts) != n:
        raise ConfigError(
            f"ml.model.activations={','.join(acts)} has {len(acts)} names for {n} hidden layers: "
            f"give one name or {n}"
        )
    return list(acts)


# --- linear models -------------------------------------------------------------------------------


class LogisticRegression(BaseModel):
    """``σ(w·x + b)`` trained with log loss (Angel: SimpleInputLayer(1) + LogLoss)."""

    angel_name = "LogisticRegression"

    def forward(self, x: SparseInput) -> Tensor:
        return x.linear("weight", "bias").squeeze(1)


class SupportVectorMachine(LogisticRegression):
    """Linear SVM: hinge loss ``max(0, 1 − y·f)`` with y = ±1; P(y=1) reported as ``σ(2f)``."""

    angel_name = "SupportVectorMachine"

    def loss(self, scores: Tensor, labels: Tensor) -> Tensor:
        y = labels * 2 - 1
        return torch.clamp(1 - y * scores, min=0).mean()

    def predict(self, scores: Tensor) -> Tensor:
        # Angel reports sigmoid(2f) as the probability of a hinge-loss model.
        return torch.sigmoid(2 * scores)


class SoftmaxRegression(BaseModel):
    """Multinomial logistic regression: ``softmax(W·x + b)`` over ``ml.num.class`` classes."""

    angel_name = "SoftmaxRegression"

    def forward(self, x: SparseInput) -> Tensor:
        return x.linear("weight", "bias")

    def loss(self, scores: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(scores, labels)

    def predict(self, scores: Tensor) -> Tensor:
        return scores.argmax(dim=1)

    def prepare_labels(self, labels: Tensor) -> Tensor:
        c = self.cfg.num_class
        y = labels.to(torch.int64)
        bad = (y < 0) | (y >= c) | (y.to(labels.dtype) != labels)
        if bool(bad.any()):
            v = labels[bad][0].item()
            raise ValueError(
                f"label {v:g} is not a class index in 0..{c - 1} (ml.num.class={c}); "
                "use ml.data.label.trans.class=SubOneTrans for labels 1..C"
            )
        return y


class MixedLogisticRegression(BaseModel):
    """MLR: ``p = Σ_r softmax(U·x)_r · σ(W·x)_r`` with ``ml.mlr.rank`` regions, cross entropy.

    Scores are the logit of ``p``, computed in log space (log-sum-exp) so that ``p`` near 0 or 1
    does not lose precision.
    """

    angel_name = "MixedLogisticRegression"

    def forward(self, x: SparseInput) -> Tensor:
        z = x.linear("sigmoid_weight", "sigmoid_bias")
        g = F.log_softmax(x.linear("softmax_weight", "softmax_bias"), dim=1)
        log_p = torch.logsumexp(g + F.logsigmoid(z), dim=1)
        log_q = torch.logsumexp(g + F.logsigmoid(-z), dim=1)
        return log_p - log_q


class LinearRegression(BaseModel):
    """``f = w·x + b`` with Angel's L2 loss ``½(f − y)²`` (mean over the batch)."""

    angel_name = "LinearRegression"

    def forward(self, x: SparseInput) -> Tensor:
        return x.linear("weight", "bias").squeeze(1)

    def loss(self, scores: Tensor, labels: Tensor) -> Tensor:
        return 0.5 * F.mse_loss(scores, labels)

    def predict(self, scores: Tensor) -> Tensor:
        return scores


class RobustRegression(LinearRegression):
    """Linear model with the Huber loss: ``½r²`` for ``|r| ≤ δ``, else ``δ(|r| − ½δ)``."""

    angel_name = "RobustRegression"

    def loss(self, scores: Tensor, labels: Tensor) -> Tensor:
        return F.huber_loss(scores, labels, delta=self.cfg.huber_delta)


# --- factorization and deep models -----------------------------------------------------------------


class _WideEmbedding(BaseModel):
    """Shared tables: a wide linear part and a k-dimensional embedding per feature."""

    def wide(self, x: SparseInput) -> Tensor:
        return x.linear("wide", "wide_bias").squeeze(1)


def _fm_interaction(e: Tensor, x: SparseInput | None) -> Tensor:
    """``½[(Σ_i e_i)² − Σ_i e_i²]`` per sample, as a ``[B, k]`` vector.

    ``e`` is either ``[B, F, k]`` (fields; ``x`` None) or ``[nnz, k]``, summed per sample of ``x``.
    """
    if x is None:
        s = e.sum(dim=1)
        sq = (e * e).sum(dim=1)
    else:
        s = x.per_sample(e)
        sq = x.per_sample(e * e)
    return 0.5 * (s * s - sq)


class FactorizationMachines(_WideEmbedding):
    """Rendle's FM: ``w·x + b + Σ_{i<j} <v_i, v_j> x_i x_j`` (any number of non-zeros per row)."""

    angel_name = "FactorizationMachines"

    def forward(self, x: SparseInput) -> Tensor:
        e = x.weighted_rows("embedding")
        return self.wide(x) + _fm_interaction(e, x).sum(dim=1)


class WideAndDeep(_WideEmbedding):
    """Wide & Deep: wide linear part + an MLP over the concatenated field embeddings."""

    angel_name = "WideAndDeep"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        hidden, acts = _hidden(cfg, [100, 100])
        self.mlp = _mlp(_fields(cfg) * cfg.fm_rank, hidden, acts, cfg.dropout, 1)

    def forward(self, x: SparseInput) -> Tensor:
        e = x.field_embeddings("embedding")
        return self.wide(x) + self.mlp(e.flatten(1)).squeeze(1)


class DeepFM(WideAndDeep):
    """DeepFM: wide + FM interaction + an MLP over the concatenated field embeddings
    (Wide & Deep with the FM term added)."""

    angel_name = "DeepFM"

    def forward(self, x: SparseInput) -> Tensor:
        e = x.field_embeddings("embedding")
        fm = _fm_interaction(e, None).sum(dim=1)
        deep = self.mlp(e.flatten(1)).squeeze(1)
        return self.wide(x) + fm + deep


class NeuralFactorizationMachines(_WideEmbedding):
    """NFM: wide + an MLP over the bi-interaction pooling ``½[(Σ e)² − Σ e²]`` (a k-vector).

    The bi-interaction works on any number of non-zeros, so NFM does not need fields.
    """

    angel_name = "NeuralFactorizationMachines"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        hidden, acts = _hidden(cfg, [50, 50])
        self.mlp = _mlp(cfg.fm_rank, hidden, acts, cfg.dropout, 1)

    def forward(self, x: SparseInput) -> Tensor:
        e = x.weighted_rows("embedding")
        bi = _fm_interaction(e, x)
        return self.wide(x) + self.mlp(bi).squeeze(1)


class ProductNeuralNetwork(_WideEmbedding):
    """PNN (inner product): wide + MLP(concat(field embeddings, all pairwise inner products))."""

    angel_name = "ProductNeuralNetwork"
    pair_i: Tensor
    pair_j: Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        f = _fields(cfg)
        hidden, acts = _hidden(cfg, [200, 200])
        self.mlp = _mlp(f * cfg.fm_rank + f * (f - 1) // 2, hidden, acts, cfg.dropout, 1)
        iu = torch.triu_indices(f, f, offset=1)
        self.register_buffer("pair_i", iu[0], persistent=False)
        self.register_buffer("pair_j", iu[1], persistent=False)

    def forward(self, x: SparseInput) -> Tensor:
        e = x.field_embeddings("embedding")
        inner = (e[:, self.pair_i, :] * e[:, self.pair_j, :]).sum(dim=2)
        return self.wide(x) + self.mlp(torch.cat([e.flatten(1), inner], dim=1)).squeeze(1)


class DNN(BaseModel):
    """A feed-forward net whose first layer is a sparse PS table (Angel's dnn.json on w6a).

    ``ml.model.hidden.layers`` = h1,h2,...: ``x → act(W1·x + b1)`` with ``W1`` a ``[features, h1]``
    PS table, then an MLP ``h1 → h2 → … → 1`` on the workers.
    """

    angel_name = "DNN"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        model_tables(cfg)  # a DNN with no hidden layer is refused there, by name
        hidden, acts = _hidden(cfg, list(DNN_HIDDEN))
        self.first_act = _ACTIVATIONS[acts[0].lower()]()
        self.first_dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.mlp = _mlp(hidden[0], hidden[1:], acts[1:], cfg.dropout, 1)

    def forward(self, x: SparseInput) -> Tensor:
        h = self.first_dropout(self.first_act(x.linear("input", "input_bias")))
        return self.mlp(h).squeeze(1)


def _fields(cfg: ModelConfig) -> int:
    if cfg.num_fields is None or cfg.num_fields < 1:
        raise ConfigError(
            "ml.fm.field.num is required by this model (the number of fields, one id per field "
            "in every sample; census: 13)"
        )
    return cfg.num_fields


# --- the built-in classes by name --------------------------------------------------------------

#: The built-in model classes by name (the registry, learners/models/registry.py, names them).
MODELS: dict[str, type[BaseModel]] = {
    cls.angel_name: cls
    for cls in (
        LogisticRegression,
        SupportVectorMachine,
        SoftmaxRegression,
        MixedLogisticRegression,
        LinearRegression,
        RobustRegression,
        FactorizationMachines,
        DeepFM,
        WideAndDeep,
        NeuralFactorizationMachines,
        ProductNeuralNetwork,
        DNN,
    )
}


def model_class(name: str) -> type[BaseModel]:
    """The model class of a registered name (case-insensitive; Angel's qualified names are
    aliases); unknown names list the valid ones."""
    return model_entry(name).load_class()  # type: ignore[no-any-return]


def build_model(cfg: ModelConfig, seed: int | None = None) -> BaseModel:
    """Build the configured model (its class from ``cfg.entry``: a model registered on the
    driver alone builds here too); ``seed`` makes the worker-side dense init reproducible."""
    cls: type[BaseModel] = cfg.entry.load_class()
    if cls.needs_fields:
        _fields(cfg)
    if seed is None:
        return cls(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(cfg)
