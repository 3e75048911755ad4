"""Label transforms (applied while reading) and the binary / multiclass label checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from learners import data as D
from tests.learners.data_helpers import DNA, C, read_all, write

# --- labels --------------------------------------------------------------------------------------


def test_label_transforms_as_angel(tmp_path: Path) -> None:
    y = np.array([-1.0, 0.0, 0.5, 1.0, 3.0], np.float32)
    assert D.label_transform(y, "NoTrans").tolist() == y.tolist()
    assert D.label_transform(y, "PosNegTrans").tolist() == [-1, -1, 1, 1, 1]
    assert D.label_transform(y, "posnegtrans", 0.5).tolist() == [-1, -1, -1, 1, 1]
    assert D.label_transform(y, "ZeroOneTrans").tolist() == [0, 0, 1, 1, 1]
    assert D.label_transform(y, "ZeroOneTrans", 1.0).tolist() == [0, 0, 0, 0, 1]
    assert D.label_transform(y, "AddOneTrans").tolist() == [0, 1, 1.5, 2, 4]
    assert D.label_transform(y, "SubOneTrans").tolist() == [-2, -1, -0.5, 0, 2]
    with pytest.raises(ValueError, match="expected one of NoTrans, PosNegTrans"):
        D.label_transform(y, "Flip")
    # Applied while reading.
    p = write(tmp_path, "0 1:1\n1 1:1\n")
    b = read_all(
        p, C(**{"ml.data.label.trans.class": "PosNegTrans", "ml.data.label.trans.threshold": 0.5})
    )
    assert b.labels.tolist() == [-1.0, 1.0]
    dna = D.load_file(str(DNA), C(**{"ml.data.label.trans.class": "SubOneTrans"}))
    assert D.multiclass_labels(dna.labels, 3).tolist()[:3] == [2, 2, 2]


def test_binary_labels01_accepts_both_conventions() -> None:
    assert D.binary_labels01(np.array([-1, 1, -1])).tolist() == [0, 1, 0]
    assert D.binary_labels01(np.array([0, 1, 1])).tolist() == [0, 1, 1]
    assert D.binary_labels01(np.array([1, 1])).tolist() == [1, 1]
    assert D.binary_labels01(np.array([1, 1])).dtype == np.float32
    with pytest.raises(ValueError, match=r"binary labels must be -1/\+1 or 0/1; found -1, 0, 1 \("):
        D.binary_labels01(np.array([-1, 0, 1]))
    with pytest.raises(ValueError, match="found 0, 1, 2"):
        D.binary_labels01(np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="found 1, nan"):
        D.binary_labels01(np.array([np.nan, 1]))
    # a batch of one class only, of either convention; a mix of -1 and 0 with no 1
    assert D.binary_labels01(np.array([0.0, -0.0])).tolist() == [0, 0]
    assert D.binary_labels01(np.array([-1, -1])).tolist() == [0, 0]
    with pytest.raises(ValueError, match="found -1, 0 "):
        D.binary_labels01(np.array([-1, 0, 0]))
    with pytest.raises(ValueError, match=r"found 0\.5, 1 "):
        D.binary_labels01(np.array([1, 0.5]))


def test_multiclass_labels_checks_range() -> None:
    with pytest.raises(
        ValueError,
        match=r"0\.\.2 \(ml.num.class=3\); found 3 \(1-based class labels: set ml.data.label.trans.class=SubOneTrans\)",
    ):
        D.multiclass_labels(np.array([1.0, 2.0, 3.0]), 3)
    with pytest.raises(ValueError, match=r"found 0\.5"):
        D.multiclass_labels(np.array([0.5, 1.0]), 3)
