"""Validation metrics: binary, multi-class and regression; vectorized numpy, exact.

Definitions follow Angel's ``ValidationUtils`` (Angel-ML/angel:
angel-ps/mllib/.../core/utils/ValidationUtils.java) with two fixes:

* AUC averages the ranks of tied scores (the Mann-Whitney statistic, as
  ``sklearn.metrics.roc_auc_score``); Angel ranks ties in sort order, so its AUC depends on the
  order of equal predictions.
* Accuracy counts a prediction as positive iff ``prob >= 0.5``; Angel counts ``margin == 0`` as
  correct for both classes.

Across workers, metrics merge exactly through :class:`MetricState`: each worker adds its
predictions, the states are merged on the driver, and :meth:`MetricState.compute` gives the
metrics of the union. Binary states keep the (label, probability) pairs, since an exact AUC
needs the global ranking; multi-class and regression states keep sufficient statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "EPS",
    "MetricState",
    "auc",
    "binary_metrics",
    "multiclass_metrics",
    "regression_metrics",
]

# Probabilities are clipped to [EPS, 1 - EPS] before the log, as sklearn's log_loss did
# (eps=1e-15) before it switched to the dtype's epsilon.
EPS = 1e-15


def _as_1d(name: str, x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {a.shape}")
    return a


def _check_same_length(y: np.ndarray, p: np.ndarray, what: str) -> None:
    if y.shape[0] != p.shape[0]:
        raise ValueError(f"{what}: {y.shape[0]} labels but {p.shape[0]} predictions")
    if y.shape[0] == 0:
        raise ValueError(f"{what}: no rows to evaluate")


def _check_finite(name: str, a: np.ndarray) -> None:
    if not np.isfinite(a).all():
        bad = int(np.flatnonzero(~np.isfinite(a))[0])
        raise ValueError(f"{name} holds a non-finite value ({a.flat[bad]}) at row {bad}")


def auc(y01: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve with ties averaged: ``(Σ rank(pos) − P(P+1)/2) / (P·N)``.

    Ranks are 1-based over an ascending sort, tied scores share their mean rank. NaN when only
    one class is present (the AUC is undefined there).
    """
    y = np.asarray(y01) > 0.5
    s = np.asarray(score, dtype=np.float64)
    n_pos = int(y.sum())
    n_neg = y.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # Group equal scores; every member of a group gets the mean of the group's 1-based ranks.
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], s.shape[0]]
    mean_rank = (starts + 1 + ends) / 2.0
    ranks_sorted = np.repeat(mean_rank, ends - starts)
    rank_sum_pos = float(ranks_sorted[y[order]].sum())
    return (rank_sum_pos - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def binary_metrics(y01: np.ndarray, prob: np.ndarray) -> dict[str, float]:
    """AUC, log-loss, accuracy and the recalls of a binary classifier.

    ``y01`` holds 0/1 labels (see ``learners.data.binary_labels01``), ``prob`` the probability of
    class 1. ``logloss = −mean(y·log p + (1−y)·log(1−p))`` with ``p`` clipped to ``[EPS, 1−EPS]``;
    ``accuracy``: predicted positive iff ``p >= 0.5``; ``true_recall = TP/(TP+FN)``,
    ``false_recall = TN/(TN+FP)`` (Angel's names; NaN when that class is absent), ``auc`` as
    :func:`auc`. Also ``count``, the number of rows.
    """
    y = _as_1d("labels", y01)
    p = _as_1d("probabilities", prob)
    _check_same_length(y, p, "binary_metrics")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(
            "binary_metrics: labels must be 0/1 (convert -1/+1 with learners.data.binary_labels01)"
        )
    _check_finite("probabilities", p)
    if (p < 0).any() or (p > 1).any():
        raise ValueError("binary_metrics: probabilities must lie in [0, 1]")
    pc = np.clip(p, EPS, 1 - EPS)
    pos = y == 1.0
    logloss = -float(np.mean(np.where(pos, np.log(pc), np.log1p(-pc))))
    pred = p >= 0.5
    tp = int((pred & pos).sum())
    tn = int((~pred & ~pos).sum())
    n_pos = int(pos.sum())
    n_neg = y.shape[0] - n_pos
    return {
        "auc": auc(y, p),
        "logloss": logloss,
        "accuracy": (tp + tn) / y.shape[0],
        "true_recall": tp / n_pos if n_pos else float("nan"),
        "false_recall": tn / n_neg if n_neg else float("nan"),
        "count": float(y.shape[0]),
    }


def _multiclass_parts(y: Any, prob_matrix: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(prob_matrix, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(
            f"multiclass_metrics: prob_matrix must be [n, classes], got shape {p.shape}"
        )
    yy = _as_1d("labels", y)
    _check_same_length(yy, p, "multiclass_metrics")
    _check_finite("probabilities", p)
    ok = (yy == np.round(yy)) & (yy >= 0) & (yy < p.shape[1])
    if not ok.all():
        bad = yy[~ok][0]
        raise ValueError(
            f"multiclass_metrics: label {bad:g} is not a class index in 0..{p.shape[1] - 1}"
        )
    return yy.astype(np.int64), p


def multiclass_metrics(y: np.ndarray, prob_matrix: np.ndarray) -> dict[str, float]:
    """Accuracy (argmax, the first class on ties) and log-loss ``−mean log p[y]`` (clipped at EPS)."""
    yi, p = _multiclass_parts(y, prob_matrix)
    picked = p[np.arange(yi.shape[0]), yi]
    return {
        "accuracy": float(np.mean(p.argmax(axis=1) == yi)),
        "logloss": -float(np.mean(np.log(np.clip(picked, EPS, 1.0)))),
        "count": float(yi.shape[0]),
    }


def regression_metrics(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """MSE, RMSE, MAE and ``R² = 1 − Σ(y−ŷ)² / Σ(y−ȳ)²`` (NaN when every label is equal)."""
    yy = _as_1d("labels", y)
    pp = _as_1d("predictions", pred)
    _check_same_length(yy, pp, "regression_metrics")
    _check_finite("labels", yy)
    _check_finite("predictions", pp)
    err = yy - pp
    mse = float(np.mean(err * err))
    ss_tot = float(np.sum((yy - yy.mean()) ** 2))
    return {
        "mse": mse,
        "rmse": float(np.sqrt(mse)),
        "mae": float(np.mean(np.abs(err))),
        "r2": 1.0 - float(np.sum(err * err)) / ss_tot if ss_tot > 0 else float("nan"),
        "count": float(yy.shape[0]),
    }


TASKS = ("binary", "multiclass", "regression")


@dataclass
class MetricState:
    """Mergeable evaluation state of one task (``binary``, ``multiclass`` or ``regression``).

    ``add`` chunks of predictions, ``merge`` the states of several workers, ``compute`` the
    metrics of everything added: the same numbers as the ``*_metrics`` function on the
    concatenated predictions (exact for binary; to float64 rounding for the sums otherwise).
    ``to_dict``/``from_dict`` give plain numpy payloads to ship between processes.
    """

    task: str
    # binary: the pairs themselves (an exact AUC needs the global ranking)
    labels: list[np.ndarray] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)
    # multiclass / regression: sufficient statistics
    n: int = 0
    correct: int = 0
    nll_sum: float = 0.0
    sq_err: float = 0.0
    abs_err: float = 0.0
    y_mean: float = 0.0
    y_m2: float = 0.0  # Σ(y − mean)², merged with Chan et al.'s parallel update

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"MetricState: task {self.task!r} is not one of {', '.join(TASKS)}")

    def add(self, y: np.ndarray, pred: np.ndarray) -> MetricState:
        """Add a chunk: 0/1 labels and probabilities; class labels and a prob matrix; or values."""
        if self.task == "binary":
            self.labels.append(_as_1d("labels", y))
            self.probs.append(_as_1d("probabilities", pred))
            return self
        if self.task == "multiclass":
            yi, p = _multiclass_parts(y, pred)
            picked = p[np.arange(yi.shape[0]), yi]
            self.correct += int((p.argmax(axis=1) == yi).sum())
            self.nll_sum += -float(np.log(np.clip(picked, EPS, 1.0)).sum())
            self.n += int(yi.shape[0])
            return self
        yy = _as_1d("labels", y)
        pp = _as_1d("predictions", pred)
        _check_same_length(yy, pp, "regression_metrics")
        _check_finite("labels", yy)
        _check_finite("predictions", pp)
        err = yy - pp
        other = MetricState(
            "regression",
            n=int(yy.shape[0]),
            sq_err=float(np.sum(err * err)),
            abs_err=float(np.sum(np.abs(err))),
            y_mean=float(yy.mean()),
            y_m2=float(np.sum((yy - yy.mean()) ** 2)),
        )
        self._merge_sums(other)
        return self

    def _merge_sums(self, o: MetricState) -> None:
        n = self.n + o.n
        if n == 0:
            return
        delta = o.y_mean - self.y_mean
        self.y_m2 += o.y_m2 + delta * delta * self.n * o.n / n
        self.y_mean += delta * o.n / n
        self.n = n
        self.correct += o.correct
        self.nll_sum += o.nll_sum
        self.sq_err += o.sq_err
        self.abs_err += o.abs_err

    def merge(self, other: MetricState) -> MetricState:
        """A new state holding both states' rows."""
        if other.task != self.task:
            raise ValueError(f"MetricState.merge: cannot merge {other.task} into {self.task}")
        out = MetricState(
            self.task, labels=[*self.labels, *other.labels], probs=[*self.probs, *other.probs]
        )
        out._merge_sums(self)
        out._merge_sums(other)
        return out

    def compute(self) -> dict[str, float]:
        """The metrics of every row added."""
        if self.task == "binary":
            if not self.labels:
                raise ValueError("binary_metrics: no rows to evaluate")
            return binary_metrics(np.concatenate(self.labels), np.concatenate(self.probs))
        if self.n == 0:
            raise ValueError(f"{self.task}_metrics: no rows to evaluate")
        if self.task == "multiclass":
            return {
                "accuracy": self.correct / self.n,
                "logloss": self.nll_sum / self.n,
                "count": float(self.n),
            }
        mse = self.sq_err / self.n
        return {
            "mse": mse,
            "rmse": float(np.sqrt(mse)),
            "mae": self.abs_err / self.n,
            "r2": 1.0 - self.sq_err / self.y_m2 if self.y_m2 > 0 else float("nan"),
            "count": float(self.n),
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain values and numpy arrays (no pickled objects)."""
        d: dict[str, Any] = {
            "task": self.task,
            "n": self.n,
            "correct": self.correct,
            "nll_sum": self.nll_sum,
            "sq_err": self.sq_err,
            "abs_err": self.abs_err,
            "y_mean": self.y_mean,
            "y_m2": self.y_m2,
        }
        if self.task == "binary":
            d["labels"] = np.concatenate(self.labels) if self.labels else np.zeros(0)
            d["probs"] = np.concatenate(self.probs) if self.probs else np.zeros(0)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MetricState:
        """Inverse of :meth:`to_dict`."""
        s = cls(
            str(d["task"]),
            n=int(d["n"]),
            correct=int(d["correct"]),
            nll_sum=float(d["nll_sum"]),
            sq_err=float(d["sq_err"]),
            abs_err=float(d["abs_err"]),
            y_mean=float(d["y_mean"]),
            y_m2=float(d["y_m2"]),
        )
        if s.task == "binary" and len(d["labels"]):
            s.labels = [np.asarray(d["labels"], dtype=np.float64)]
            s.probs = [np.asarray(d["probs"], dtype=np.float64)]
        return s
