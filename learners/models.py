"""The model zoo: Angel's models as plain ``torch.nn.Module``s over pulled parameter rows.

A model never talks to the parameter server. It *declares* the PS tables it needs
(:class:`TableDecl`: sparse weights and embeddings keyed by feature id, plus tiny dense tables
for biases), and its ``forward`` receives the rows the learner pulled for one batch in a
:class:`SparseInput`. Dense layers (the MLPs of DeepFM, WideAndDeep, NFM, PNN and DNN) are
ordinary ``nn.Module`` parameters that live on the worker (or, with
``angel.dense.placement=ps``, are mirrored into PS tables by the learner).

Every model returns one tensor of *scores*: a logit per sample for binary models, a logit per
class for multi-class models, the predicted value for regression. ``loss`` turns scores and
labels into a mean loss, ``predict`` into what ``angelps predict`` writes (the probability of
the positive class, the class, or the value).

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

import difflib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from angelps.config import ConfigError, Key, positive

__all__ = [
    "KEYS",
    "MODELS",
    "BaseModel",
    "SparseInput",
    "TableDecl",
    "build_model",
    "model_class",
]


def _activation_check(names: list[str]) -> str | None:
    bad = [n for n in names if n.lower() not in _ACTIVATIONS]
    return None if not bad else f"activation names from {', '.join(sorted(_ACTIVATIONS))}"


def _positive_ints(values: list[int]) -> str | None:
    return None if all(v >= 1 for v in values) else "a comma-separated list of integers >= 1"


def _non_negative_float(v: float) -> str | None:
    return None if v >= 0 and math.isfinite(v) else "a finite number >= 0"


KEYS = [
    Key(
        "ml.model.class.name",
        "str",
        "LogisticRegression",
        "Model to train (Angel's class names, case-insensitive); see docs/models.md.",
    ),
    Key("ml.num.class", "int", 2, "Number of classes (SoftmaxRegression).", check=positive),
    Key(
        "ml.fm.rank",
        "int",
        8,
        "Embedding size k of FM, DeepFM, WideAndDeep, NFM, PNN.",
        check=positive,
    ),
    Key("ml.mlr.rank", "int", 5, "Number of regions of MixedLogisticRegression.", check=positive),
    Key(
        "ml.robustregression.loss.delta",
        "float",
        1.0,
        "Huber threshold δ of RobustRegression: quadratic below δ, linear above.",
        check=positive,
    ),
    Key(
        "ml.model.hidden.layers",
        "int_list",
        None,
        "Hidden layer sizes of the MLP (DeepFM 100,100; WideAndDeep 100,100; NFM 50,50; "
        "PNN 200,200; DNN 500,100, whose first layer is a sparse PS table). Unset: the model's default.",
        check=_positive_ints,
    ),
    Key(
        "ml.model.activations",
        "str_list",
        None,
        "Activation after each hidden layer (relu, tanh, sigmoid, identity, gelu, leaky_relu); "
        "one name for all layers or one per layer. Unset: relu.",
        check=_activation_check,
    ),
    Key(
        "ml.model.dropout",
        "float",
        0.0,
        "Dropout probability after each hidden activation of the MLP (0 = none).",
        check=lambda v: None if 0 <= v < 1 else "a number in [0, 1)",
    ),
    Key(
        "ml.inputlayer.init.std",
        "float",
        0.0,
        "Std of the normal init of sparse input-layer weights (Angel: 1e-5; 0 starts at zero). "
        "The DNN's sparse first layer uses max(this, 1/sqrt(features)).",
        check=_non_negative_float,
    ),
    Key(
        "ml.embedding.init.std",
        "float",
        0.01,
        "Std of the normal init of embeddings (Angel: 1e-5, which slows the first epochs).",
        check=_non_negative_float,
    ),
]

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
    "gelu": nn.GELU,
    "leaky_relu": nn.LeakyReLU,
}


# --- what a model declares and what it receives --------------------------------------------------


@dataclass(frozen=True)
class TableDecl:
    """A PS table a model needs.

    ``sparse`` tables are keyed by feature id (``rows`` = the feature index range) and only the
    rows of a batch's ids are pulled; dense tables (biases) are small and pulled whole.
    ``role`` selects the optimizer key: ``inputlayer`` → ``ml.inputlayer.optimizer``,
    ``embedding`` → ``ml.embedding.optimizer``. Biases share their layer's role (Angel applied
    plain SGD to biases, bypassing the optimizer; here they go through it).
    """

    name: str
    rows: int
    dim: int
    sparse: bool
    role: str
    init_std: float = 0.0
    #: "normal" (std ``init_std``; zeros when it is 0) or "uniform" (``[-init_std, init_std)``).
    init: str = "normal"


class _GatherRows(torch.autograd.Function):
    """``value_j · rows[slot_j]`` for every non-zero; the backward sums the non-zeros' gradients
    into their rows as a CSR product ``Mᵀ·g`` (``Mᵀ[u, j] = value_j`` where ``slot_j = u``).

    Autograd's own backward of ``index_select`` is ``index_add``, which on CPU costs 1.3 ms for
    26k non-zeros × 8 columns into 148 rows (census at batch 2048) against 0.06 ms for the CSR
    product; built once per batch, the matrix serves every table (bench: worker step profile).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, rows: Tensor, slot: Tensor, value: Tensor | None, mt: Tensor | None
    ) -> Tensor:
        ctx.mt = mt
        if mt is None:
            ctx.save_for_backward(slot, value)
        ctx.shape = rows.shape
        out = rows.index_select(0, slot)
        return out if value is None else out * value.unsqueeze(1)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        if ctx.mt is not None:
            return ctx.mt @ g.contiguous(), None, None, None
        slot, value = ctx.saved_tensors
        if value is not None:
            g = g * value.unsqueeze(1)
        out = torch.zeros(ctx.shape, dtype=g.dtype, device=g.device)
        return out.index_add_(0, slot, g), None, None, None


class _SegmentSum(torch.autograd.Function):
    """``out[b] = Σ_{j in sample b} e_j`` as a CSR product ``S·e`` (``S`` = the batch's rows over
    its non-zeros); the backward gathers ``g[sample_j]``. ``index_add`` costs ~20x more on CPU."""

    @staticmethod
    def forward(ctx: Any, e: Tensor, sample: Tensor, s: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(sample)
        return s @ e.contiguous()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (sample,) = ctx.saved_tensors
        return g.index_select(0, sample), None, None


# The CSR backward needs the non-zeros sorted by row slot: numpy's stable argsort is a radix sort
# for 16-bit keys (0.2 ms for 26k) but a merge sort for wider ones (2.8 ms), and with few repeats
# per row index_add is as fast, so the CSR path is used for <= 65,536 rows hit >= 4 times each.
_CSR_MAX_ROWS = 1 << 16
_CSR_MIN_REPEAT = 4


def _csr(
    crow: np.ndarray, col: np.ndarray, val: np.ndarray | None, shape: tuple[int, int]
) -> Tensor:
    v = torch.ones(len(col)) if val is None else torch.from_numpy(np.ascontiguousarray(val))
    with warnings.catch_warnings():
        # torch flags CSR tensors as beta; the two operations used here (build, CSR times
        # dense) are checked against index_add in tests/learners/test_models.py.
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(crow), torch.from_numpy(col), v, shape, check_invariants=False
        )


@dataclass
class SparseInput:
    """One batch as a model sees it: CSR non-zeros mapped onto the pulled rows.

    ``sample[j]`` is the batch row of non-zero ``j``, ``slot[j]`` the index of its feature in the
    pulled unique ids, ``value[j]`` its value (None when every value is 1, as in one-hot data).
    ``rows[name]`` is the pulled ``[U, dim]`` block of a sparse table (``[rows, dim]`` for a dense
    one). ``num_fields`` is set when every sample has exactly that many non-zeros, in field order
    (census: 13), which the field models require. ``rows_t`` (``Mᵀ``) and ``samples_s`` (``S``)
    are CSR matrices for the gather's backward and the per-sample sums (CPU only; None on CUDA,
    where index_add is fast).
    """

    batch_size: int
    sample: Tensor
    slot: Tensor
    value: Tensor | None
    rows: dict[str, Tensor]
    num_fields: int | None = None
    rows_t: Tensor | None = None
    samples_s: Tensor | None = None

    @staticmethod
    def from_csr(
        indptr: Any,
        slots: Any,
        values: Any,
        rows: dict[str, Tensor],
        num_fields: int | None = None,
        device: torch.device | str | None = None,
    ) -> SparseInput:
        """Build from CSR arrays (numpy or torch) whose ids were already mapped to slots.

        ``rows`` may be empty and filled in later (the worker builds the next batch's input
        while that batch's rows are still on their way); ``device`` is then where they go
        (default: the rows' device, else the CPU).
        """
        indptr_n = np.asarray(indptr, dtype=np.int64)
        slots_n = np.asarray(slots, dtype=np.int64)
        values_n = np.asarray(values, dtype=np.float32)
        b = int(indptr_n.size - 1)
        nnz = int(slots_n.size)
        counts = np.diff(indptr_n)
        sample = torch.from_numpy(np.repeat(np.arange(b, dtype=np.int64), counts))
        if device is not None:
            dev = torch.device(device)
        else:
            dev = next(iter(rows.values())).device if rows else torch.device("cpu")
        unit = bool(values_n.size == 0 or (values_n == 1.0).all())
        value = None if unit else torch.from_numpy(np.ascontiguousarray(values_n))
        rows_t = samples_s = None
        if dev.type == "cpu" and nnz:
            # The pulled block of a sparse table has one row per distinct id: max slot + 1.
            u = int(slots_n.max()) + 1
            # (no backward under inference mode: no matrix for it)
            if torch.is_grad_enabled() and u <= _CSR_MAX_ROWS and nnz >= _CSR_MIN_REPEAT * u:
                order = np.argsort(slots_n.astype(np.uint16), kind="stable")
                crow = np.zeros(u + 1, dtype=np.int64)
                np.cumsum(np.bincount(slots_n, minlength=u), out=crow[1:])
                rows_t = _csr(crow, order, None if unit else values_n[order], (u, nnz))
            if num_fields is None:
                col = np.arange(nnz, dtype=np.int64)
                samples_s = _csr(np.ascontiguousarray(indptr_n - indptr_n[0]), col, None, (b, nnz))
        return SparseInput(
            batch_size=b,
            sample=sample.to(dev),
            slot=torch.from_numpy(np.ascontiguousarray(slots_n)).to(dev),
            value=None if value is None else value.to(dev),
            rows=rows,
            num_fields=num_fields,
            rows_t=rows_t,
            samples_s=samples_s,
        )

    def weighted_rows(self, table: str) -> Tensor:
        """``x_j · row(slot_j)`` for every non-zero: ``[nnz, dim]``."""
        rows = self.rows[table]
        mt = (
            self.rows_t
            if self.rows_t is not None and rows.shape[0] == self.rows_t.shape[0]
            else None
        )
        return _GatherRows.apply(rows, self.slot, self.value, mt)

    def per_sample(self, e: Tensor) -> Tensor:
        """``Σ_j e_j`` over each sample's non-zeros: ``[nnz, dim]`` → ``[B, dim]``."""
        if self.num_fields is not None:
            return e.view(self.batch_size, self.num_fields, e.shape[1]).sum(dim=1)
        if self.samples_s is not None:
            return _SegmentSum.apply(e, self.sample, self.samples_s)
        out = torch.zeros(self.batch_size, e.shape[1], dtype=e.dtype, device=e.device)
        return out.index_add(0, self.sample, e)

    def linear(self, table: str, bias: str | None = None) -> Tensor:
        """``Σ_j x_j·row(slot_j)`` per sample (+ bias row): ``[B, dim]``."""
        out = self.per_sample(self.weighted_rows(table))
        if bias is not None:
            out = out + self.rows[bias][0]
        return out

    def field_embeddings(self, table: str) -> Tensor:
        """``x_f·v_f`` per sample and field: ``[B, F, k]`` (requires ``num_fields``)."""
        if self.num_fields is None:
            raise ValueError(
                "this model needs exactly ml.fm.field.num non-zeros per sample "
                "(one id per field, as in the census dummy file); set ml.fm.field.num"
            )
        e = self.weighted_rows(table)
        return e.view(self.batch_size, self.num_fields, e.shape[1])


# --- the base class ------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """The hyper-parameters a model is built from (read from the job configuration)."""

    num_features: int
    num_class: int = 2
    fm_rank: int = 8
    mlr_rank: int = 5
    huber_delta: float = 1.0
    num_fields: int | None = None
    hidden: list[int] | None = None
    activations: list[str] | None = None
    dropout: float = 0.0
    input_std: float = 0.0
    embedding_std: float = 0.01
    extra: dict[str, Any] = field(default_factory=dict)


class BaseModel(nn.Module):
    """Common interface: declared tables, forward over pulled rows, loss, prediction."""

    #: "binary", "multiclass" or "regression": which labels, metrics and prediction apply.
    task: ClassVar[str] = "binary"
    #: Angel's class name (the registry key).
    angel_name: ClassVar[str] = ""
    #: True when the model needs one id per field (exactly ml.fm.field.num non-zeros per row).
    needs_fields: ClassVar[bool] = False

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def tables(self) -> list[TableDecl]:
        """The PS tables this model reads (sparse weights, embeddings, biases)."""
        raise NotImplementedError

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


def _acts(cfg: ModelConfig, n: int) -> list[str]:
    acts = cfg.activations or ["relu"]
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

    def tables(self) -> list[TableDecl]:
        return _linear_tables(self.cfg, 1)

    def forward(self, x: SparseInput) -> Tensor:
        return x.linear("weight", "bias").squeeze(1)


def _linear_tables(cfg: ModelConfig, dim: int) -> list[TableDecl]:
    return [
        TableDecl("weight", cfg.num_features, dim, True, "inputlayer", cfg.input_std),
        TableDecl("bias", 1, dim, False, "inputlayer"),
    ]


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
    task = "multiclass"

    def tables(self) -> list[TableDecl]:
        return _linear_tables(self.cfg, self.cfg.num_class)

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

    def tables(self) -> list[TableDecl]:
        n, r = self.cfg.num_features, self.cfg.mlr_rank
        # The gate needs a non-zero start so the regions differ; Angel used N(0, 1e-5).
        std = max(self.cfg.input_std, 0.01)
        return [
            TableDecl("sigmoid_weight", n, r, True, "inputlayer", std),
            TableDecl("sigmoid_bias", 1, r, False, "inputlayer"),
            TableDecl("softmax_weight", n, r, True, "inputlayer", std),
            TableDecl("softmax_bias", 1, r, False, "inputlayer"),
        ]

    def forward(self, x: SparseInput) -> Tensor:
        z = x.linear("sigmoid_weight", "sigmoid_bias")
        g = F.log_softmax(x.linear("softmax_weight", "softmax_bias"), dim=1)
        log_p = torch.logsumexp(g + F.logsigmoid(z), dim=1)
        log_q = torch.logsumexp(g + F.logsigmoid(-z), dim=1)
        return log_p - log_q


class LinearRegression(BaseModel):
    """``f = w·x + b`` with Angel's L2 loss ``½(f − y)²`` (mean over the batch)."""

    angel_name = "LinearRegression"
    task = "regression"

    def tables(self) -> list[TableDecl]:
        return _linear_tables(self.cfg, 1)

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

    def tables(self) -> list[TableDecl]:
        n, k = self.cfg.num_features, self.cfg.fm_rank
        return [
            TableDecl("wide", n, 1, True, "inputlayer", self.cfg.input_std),
            TableDecl("wide_bias", 1, 1, False, "inputlayer"),
            TableDecl("embedding", n, k, True, "embedding", self.cfg.embedding_std),
        ]

    def wide(self, x: SparseInput) -> Tensor:
        return x.linear("wide", "wide_bias").squeeze(1)

    def _hidden(self, default: list[int]) -> tuple[list[int], list[str]]:
        hidden = list(self.cfg.hidden) if self.cfg.hidden is not None else default
        return hidden, _acts(self.cfg, len(hidden))


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
    needs_fields = True

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        hidden, acts = self._hidden([100, 100])
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
        hidden, acts = self._hidden([50, 50])
        self.mlp = _mlp(cfg.fm_rank, hidden, acts, cfg.dropout, 1)

    def forward(self, x: SparseInput) -> Tensor:
        e = x.weighted_rows("embedding")
        bi = _fm_interaction(e, x)
        return self.wide(x) + self.mlp(bi).squeeze(1)


class ProductNeuralNetwork(_WideEmbedding):
    """PNN (inner product): wide + MLP(concat(field embeddings, all pairwise inner products))."""

    angel_name = "ProductNeuralNetwork"
    needs_fields = True
    pair_i: Tensor
    pair_j: Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        f = _fields(cfg)
        hidden, acts = self._hidden([200, 200])
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
        hidden = list(cfg.hidden) if cfg.hidden is not None else [500, 100]
        acts = _acts(cfg, len(hidden))
        self.first_act = _ACTIVATIONS[acts[0].lower()]()
        self.first_dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.mlp = _mlp(hidden[0], hidden[1:], acts[1:], cfg.dropout, 1)
        self.h1 = hidden[0]

    def tables(self) -> list[TableDecl]:
        n = self.cfg.num_features
        # A sparse first layer initialised like nn.Linear's fan-in scale; zero would stall it.
        std = max(self.cfg.input_std, 1.0 / math.sqrt(max(n, 1)))
        return [
            TableDecl("input", n, self.h1, True, "inputlayer", std),
            TableDecl("input_bias", 1, self.h1, False, "inputlayer"),
        ]

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


# --- registry ------------------------------------------------------------------------------------

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
    """The model class for an Angel name (case-insensitive); unknown names list the valid ones."""
    by_lower = {k.lower(): v for k, v in MODELS.items()}
    cls = by_lower.get(name.strip().lower())
    if cls is not None:
        return cls
    ranked = difflib.get_close_matches(name, list(MODELS), n=len(MODELS), cutoff=0.0)
    raise ConfigError(
        f"ml.model.class.name={name} is not a known model; valid names (closest first): "
        f"{', '.join(ranked)}"
    )


def model_config(conf: Any, num_features: int, num_fields: int | None) -> ModelConfig:
    """Read the model hyper-parameters from a job configuration (a Mapping of typed values)."""
    return ModelConfig(
        num_features=num_features,
        num_class=int(conf["ml.num.class"]),
        fm_rank=int(conf["ml.fm.rank"]),
        mlr_rank=int(conf["ml.mlr.rank"]),
        huber_delta=float(conf["ml.robustregression.loss.delta"]),
        num_fields=num_fields,
        hidden=conf["ml.model.hidden.layers"],
        activations=conf["ml.model.activations"],
        dropout=float(conf["ml.model.dropout"]),
        input_std=float(conf["ml.inputlayer.init.std"]),
        embedding_std=float(conf["ml.embedding.init.std"]),
    )


def build_model(
    conf: Any, num_features: int, num_fields: int | None = None, seed: int | None = None
) -> BaseModel:
    """Build the configured model; ``seed`` makes the worker-side dense init reproducible."""
    cls = model_class(str(conf["ml.model.class.name"]))
    cfg = model_config(conf, num_features, num_fields)
    if cls.needs_fields:
        _fields(cfg)
    if seed is None:
        return cls(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(cfg)
