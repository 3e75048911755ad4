"""Validation metrics against scikit-learn, tie handling and input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn import metrics as skm

from learners.runs.metrics import (
    auc,
    binary_metrics,
    multiclass_metrics,
    regression_metrics,
)


@pytest.mark.parametrize("seed", range(5))
def test_binary_metrics_match_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 3000))
    y = (rng.random(n) < rng.uniform(0.05, 0.6)).astype(np.float64)
    # Rounded scores give many ties, which is where rank-sum AUCs differ.
    p = np.round(1 / (1 + np.exp(-(2 * y - 1 + rng.normal(0, 1.5, n)))), int(rng.integers(1, 4)))
    p = np.clip(p, 0.0, 1.0)
    m = binary_metrics(y, p)
    assert m["auc"] == pytest.approx(skm.roc_auc_score(y, p), abs=1e-12)
    assert m["logloss"] == pytest.approx(skm.log_loss(y, np.clip(p, 1e-15, 1 - 1e-15)), rel=1e-12)
    pred = (p >= 0.5).astype(int)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, pred), abs=1e-15)
    assert m["true_recall"] == pytest.approx(skm.recall_score(y, pred), abs=1e-15)
    assert m["false_recall"] == pytest.approx(skm.recall_score(1 - y, 1 - pred), abs=1e-15)
    assert m["count"] == n


def test_auc_pinned_values_and_ties() -> None:
    # Pairs (pos, neg): 0.9>0.1, 0.9>0.5, 0.5=0.5 (half), 0.5>0.1 → 3.5 / 4.
    assert auc(np.array([1, 0, 1, 0]), np.array([0.9, 0.5, 0.5, 0.1])) == 0.875
    assert auc(np.array([1, 1, 0, 0]), np.array([0.3, 0.3, 0.3, 0.3])) == 0.5
    assert auc(np.array([0, 0, 1]), np.array([0.1, 0.2, 0.3])) == 1.0
    assert auc(np.array([1, 1, 0]), np.array([0.1, 0.2, 0.3])) == 0.0
    assert math.isnan(auc(np.array([1, 1]), np.array([0.1, 0.2])))
    m = binary_metrics(np.array([1.0, 1.0]), np.array([0.2, 0.7]))
    assert math.isnan(m["auc"]) and math.isnan(m["false_recall"]) and m["true_recall"] == 0.5


def test_binary_metrics_reject_bad_input() -> None:
    with pytest.raises(ValueError, match=r"labels must be 0/1 \(convert -1/\+1"):
        binary_metrics(np.array([-1.0, 1.0]), np.array([0.2, 0.8]))
    with pytest.raises(
        ValueError, match=r"probabilities holds a non-finite value \(nan\) at row 1"
    ):
        binary_metrics(np.array([0.0, 1.0]), np.array([0.2, np.nan]))
    with pytest.raises(ValueError, match=r"probabilities must lie in \[0, 1\]"):
        binary_metrics(np.array([0.0, 1.0]), np.array([0.2, 1.5]))
    with pytest.raises(ValueError, match="2 labels but 3 predictions"):
        binary_metrics(np.array([0.0, 1.0]), np.array([0.2, 0.3, 0.4]))
    with pytest.raises(ValueError, match="no rows to evaluate"):
        binary_metrics(np.array([]), np.array([]))


@pytest.mark.parametrize("seed", range(3))
def test_multiclass_metrics_match_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c = 500, 4
    logits = rng.normal(size=(n, c))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = rng.integers(0, c, n)
    m = multiclass_metrics(y, p)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, p.argmax(1)), abs=1e-15)
    assert m["logloss"] == pytest.approx(skm.log_loss(y, p, labels=list(range(c))), rel=1e-12)
    with pytest.raises(ValueError, match=r"label 4 is not a class index in 0\.\.3"):
        multiclass_metrics(np.r_[y[:-1], 4], p)


@pytest.mark.parametrize("seed", range(3))
def test_regression_metrics_match_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.normal(10, 3, 400)
    pred = y + rng.normal(0, 2, 400)
    m = regression_metrics(y, pred)
    assert m["mse"] == pytest.approx(skm.mean_squared_error(y, pred), rel=1e-12)
    assert m["rmse"] == pytest.approx(math.sqrt(skm.mean_squared_error(y, pred)), rel=1e-12)
    assert m["mae"] == pytest.approx(skm.mean_absolute_error(y, pred), rel=1e-12)
    assert m["r2"] == pytest.approx(skm.r2_score(y, pred), rel=1e-12)
    assert regression_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])) == {
        "mse": 1 / 3,
        "rmse": math.sqrt(1 / 3),
        "mae": 1 / 3,
        "r2": 0.5,
        "count": 3.0,
    }
    assert math.isnan(regression_metrics(np.ones(3), np.zeros(3))["r2"])
