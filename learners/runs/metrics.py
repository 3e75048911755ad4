"""Validation metrics: binary, multi-class and regression; vectorized numpy, exact.

Definitions follow Angel's ``ValidationUtils`` (Angel-ML/angel:
angel-ps/mllib/.../core/utils/ValidationUtils.java) with two fixes:

* AUC averages the ranks of tied scores (the Mann-Whitney statistic, as
  ``sklearn.metrics.roc_auc_score``); Angel ranks ties in sort order, so its AUC depends on the
  order of equal predictions.
* Accuracy counts a prediction as positive iff ``prob >= 0.5``; Angel counts ``margin == 0`` as
  correct for both classes.

Every function takes the labels and predictions of the whole validation set: the learner gathers
each worker's rows on the driver and computes the metrics once over their union (an exact AUC
needs the global ranking). The functions check their input (shapes, finite values, valid
labels) and raise ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "EPS",
    "auc",
    "binary_metrics",
    "multiclass_metrics",
    "regression_metrics",
    "reported_names",
    "validation_metrics",
]

# Probabilities are clipped to [EPS, 1 - EPS] before the log, as sklearn's log_loss did
# (eps=1e-15) before it switched to the dtype's epsilon.
EPS = 1e-15


def _as_1d(name: str, x: npt.ArrayLike) -> np.ndarray:
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


def auc(y01: npt.ArrayLike, score: npt.ArrayLike) -> float:
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


def binary_metrics(y01: npt.ArrayLike, prob: npt.ArrayLike) -> dict[str, float]:
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


def multiclass_metrics(y: npt.ArrayLike, prob_matrix: npt.ArrayLike) -> dict[str, float]:
    """Accuracy (argmax, the first class on ties) and log-loss ``−mean log p[y]`` (clipped at
    EPS)."""
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
    yi = yy.astype(np.int64)
    picked = p[np.arange(yi.shape[0]), yi]
    return {
        "accuracy": float(np.mean(p.argmax(axis=1) == yi)),
        "logloss": -float(np.mean(np.log(np.clip(picked, EPS, 1.0)))),
        "count": float(yi.shape[0]),
    }


def regression_metrics(y: npt.ArrayLike, pred: npt.ArrayLike) -> dict[str, float]:
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


def validation_metrics(task: str, outs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job's validation metrics (``valid_*``) over every worker's predictions: ``outs`` are
    the workers' answers to ``validate`` (predictions, labels, rows, summed loss)."""
    key = "prob" if task == "multiclass" else "pred"
    pred = np.concatenate([o[key] for o in outs])
    labels = np.concatenate([o["labels"] for o in outs])
    rows = sum(o["rows"] for o in outs)
    loss = sum(o["loss_sum"] for o in outs) / max(rows, 1)
    if task == "binary":
        m = binary_metrics(labels, pred)
    elif task == "multiclass":
        m = multiclass_metrics(labels, pred)
    else:
        m = regression_metrics(labels, pred)
    out = {f"valid_{k}": v for k, v in dict(m).items()}
    out["valid_loss"] = loss
    out["valid_rows"] = rows
    return out


def reported_names(task: str) -> list[str]:
    """The ``valid_*`` names :func:`validation_metrics` reports for ``task`` (what
    ``ml.early.stop.metric`` may watch), from the metric functions themselves."""
    if task == "binary":
        names = binary_metrics([0.0, 1.0], [0.25, 0.75])
    elif task == "multiclass":
        names = multiclass_metrics([0.0, 1.0], [[0.75, 0.25], [0.25, 0.75]])
    else:
        names = regression_metrics([0.0, 1.0], [0.25, 0.75])
    return sorted([f"valid_{k}" for k in names] + ["valid_loss", "valid_rows"])
