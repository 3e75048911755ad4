"""Labels: Angel's label transforms, and the checks that a model's labels are what it needs.

The transform runs while reading (``ml.data.label.trans.class``); the checks run where a model
takes the labels, with messages that say which key maps the labels found to the ones needed.
"""

from __future__ import annotations

import numpy as np

from learners.data.options import LABEL_TRANSFORMS
from learners.data.problems import DataError

__all__ = ["binary_labels01", "class_index_message", "label_transform", "multiclass_labels"]


def label_transform(
    labels: np.ndarray, name: str = "NoTrans", threshold: float = 0.0
) -> np.ndarray:
    """Angel's ``TransLabel`` (Angel-ML/angel: .../core/utils/TransLabel.scala), vectorized.

    NoTrans: y. PosNegTrans: 1 if y > threshold else -1. ZeroOneTrans: 1 if y > threshold else 0.
    AddOneTrans: y + 1. SubOneTrans: y - 1. Names are case-insensitive.
    """
    key = name.lower()
    y = np.asarray(labels)
    if key == "notrans":
        return y
    if key == "posnegtrans":
        return np.where(y > threshold, 1.0, -1.0).astype(y.dtype)
    if key == "zeroonetrans":
        return np.where(y > threshold, 1.0, 0.0).astype(y.dtype)
    if key == "addonetrans":
        return y + 1
    if key == "subonetrans":
        return y - 1
    raise ValueError(
        f"ml.data.label.trans.class={name} is not valid: expected one of {', '.join(LABEL_TRANSFORMS)}"
    )


def class_index_message(label: float, num_class: int, label_trans: str | None) -> str:
    """Why ``label``, as ``ml.data.label.trans.class=label_trans`` left it (None: the transform
    is not known), is not a class index of ``num_class`` classes: the label as the input has it
    where the transform can be undone, the transform, and the labels it expects.

    >>> class_index_message(3.0, 3, "SubOneTrans")
    'label 4 (3 after ml.data.label.trans.class=SubOneTrans) is not a class index in 0..2 (ml.num.class=3): labels 1..3 are expected with SubOneTrans'
    """
    c, v = num_class, float(label)
    not_index = f"is not a class index in 0..{c - 1} (ml.num.class={c})"
    key = (label_trans or "").lower()
    if key == "notrans":
        hint = ""
        if v == c:  # 1-based labels, most likely
            hint = f": labels 1..{c} need ml.data.label.trans.class=SubOneTrans"
        return f"label {v:g} {not_index}{hint}"
    if key in ("subonetrans", "addonetrans"):
        shift = -1 if key == "subonetrans" else 1
        lo, hi = -shift, c - 1 - shift
        expected = f"{lo}..{hi}" if hi > lo else f"{lo}"
        return (
            f"label {v - shift:g} ({v:g} after ml.data.label.trans.class={label_trans}) "
            f"{not_index}: labels {expected} are expected with {label_trans}"
        )
    if key in ("posnegtrans", "zeroonetrans"):
        makes = "-1 and 1" if key == "posnegtrans" else "0 and 1"
        return (
            f"label {v:g} after ml.data.label.trans.class={label_trans} {not_index}: "
            f"{label_trans} makes the labels {makes}"
        )
    return f"label {v:g} {not_index}"


def _show_values(values: np.ndarray, limit: int = 6) -> str:
    shown = ", ".join(f"{v:g}" for v in values[:limit])
    return shown + (f", ... ({values.size} distinct)" if values.size > limit else "")


def binary_labels01(labels: np.ndarray) -> np.ndarray:
    """Binary labels as float32 0/1, accepting a -1/+1 file or a 0/1 file.

    Raises DataError (a ValueError) when the labels are anything else (NaN, 2, a mix of -1 and 0, ...).
    """
    y = np.asarray(labels, dtype=np.float32)
    # Two comparisons a label, not a sort: this runs on every training batch (np.unique took
    # 97 us of 8,192 labels against 8 us for this); the distinct values only for the error.
    one = y == 1.0
    if not ((one | (y == 0.0)).all() or (one | (y == -1.0)).all()):
        distinct = np.unique(y)  # NaNs sort last and stay distinct
        raise DataError(  # bad input (exit 2), a ValueError as before
            f"binary labels must be -1/+1 or 0/1; found {_show_values(distinct)} "
            "(map other labels with ml.data.label.trans.class=ZeroOneTrans or PosNegTrans and "
            "ml.data.label.trans.threshold; if the first column is a sample id, as in Angel's "
            "predict files (sid i:v ...), set ml.data.sid=true, with ml.data.has.label=false "
            "when no label follows it)"
        )
    return one.astype(np.float32)


def multiclass_labels(labels: np.ndarray, num_class: int) -> np.ndarray:
    """Class labels as int64 in ``0 .. num_class-1``; ValueError for anything else."""
    y = np.asarray(labels, dtype=np.float64)
    distinct = np.unique(y)
    ok = (
        np.isfinite(distinct)
        & (distinct == np.round(distinct))
        & (distinct >= 0)
        & (distinct < num_class)
    )
    if not ok.all():
        hint = ""
        if (
            distinct.size
            and np.isfinite(distinct).all()
            and distinct.min() >= 1
            and distinct.max() <= num_class
        ):
            hint = " (1-based class labels: set ml.data.label.trans.class=SubOneTrans)"
        raise ValueError(
            f"class labels must be integers in 0..{num_class - 1} (ml.num.class={num_class}); "
            f"found {_show_values(distinct[~ok])}{hint}"
        )
    return y.astype(np.int64)
