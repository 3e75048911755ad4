"""A bad input's hint is right or absent: a class label is named as its file has it, with the
label transform in effect; a sample id already set is not suggested again, and the line is
quoted whole; a dummy line with a bad id is not called dense."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from angelconf.config import load_config
from learners import data as D
from learners.models import config as model_config
from learners.models.config import ModelConfig
from learners.models.zoo import build_model
from learners.worker.data_part import DataPart, check_rows_labels
from tests.learners.data_helpers import CENSUS_DUMMY, DNA, C, write

# --- class labels: as the file has them, with the transform in effect --------------------------


def _softmax_check(num_class: int):
    """The check a softmax worker applies to labels (TrainWorker._check_labels)."""
    keys = {"ml.model.class.name": "SoftmaxRegression", "ml.num.class": num_class}
    model = build_model(
        ModelConfig.from_config(load_config(None, keys, model_config.KEYS), 180, None)
    )

    def check(y: np.ndarray) -> None:
        model.prepare_labels(torch.from_numpy(np.ascontiguousarray(y, np.float32)))

    return check


def _dna_with(tmp_path: Path, label: str, others: str | None) -> str:
    """dna's first 10 lines, line 7's label ``label``, the others ``others`` (None: dna's, 1..3)."""
    rows = DNA.read_text().splitlines()[:10]
    rows = [(label if i == 6 else others or r[0]) + r[1:] for i, r in enumerate(rows)]
    return write(tmp_path, "\n".join(rows) + "\n", "dna.scale")


@pytest.mark.parametrize(
    ("trans", "label", "others", "said"),
    [
        (
            "SubOneTrans",
            "4",
            None,
            "label 4 (3 after ml.data.label.trans.class=SubOneTrans) is not a class index in "
            "0..2 (ml.num.class=3): labels 1..3 are expected with SubOneTrans",
        ),
        (
            "SubOneTrans",
            "0",
            None,
            "label 0 (-1 after ml.data.label.trans.class=SubOneTrans) is not a class index in "
            "0..2 (ml.num.class=3): labels 1..3 are expected with SubOneTrans",
        ),
        (
            "NoTrans",
            "3",
            "0",
            "label 3 is not a class index in 0..2 (ml.num.class=3): labels 1..3 need "
            "ml.data.label.trans.class=SubOneTrans",
        ),
        (
            "AddOneTrans",
            "2",
            "0",
            "label 2 (3 after ml.data.label.trans.class=AddOneTrans) is not a class index in "
            "0..2 (ml.num.class=3): labels -1..1 are expected with AddOneTrans",
        ),
    ],
)
def test_a_class_label_is_named_as_the_file_has_it(
    tmp_path: Path, trans: str, label: str, others: str | None, said: str
) -> None:
    path = _dna_with(tmp_path, label, others)
    opts = C(
        **{
            "angel.train.data.path": path,
            "ml.data.label.trans.class": trans,
            "ml.feature.index.range": 180,
            "ml.data.validate.ratio": 0.5,  # line 7 among the training rows or the validation ones
        }
    )
    check = _softmax_check(3)
    part = DataPart(opts, 0, 1, stream=False)
    with pytest.raises(D.DataError) as e:
        part.check_labels(check)
    assert str(e.value) == f"{path}:7: {said}"
    # predict and evaluate say it alike (learners/worker/predict.py: predict_file)
    with pytest.raises(D.DataError) as e:
        check_rows_labels(part.load_file(path), check, lambda i: D.line_of(path, opts, i))
    assert str(e.value) == f"{path}:7: {said}"


def test_a_class_label_of_rows_of_unknown_transform_has_no_guess() -> None:
    rows = D.Batch(
        labels=np.array([0.0, 3.0], np.float32),
        indptr=np.array([0, 1, 2]),
        ids=np.array([0, 1]),
        values=np.ones(2, np.float32),
        row_index=np.array([0, 1]),
    )
    with pytest.raises(D.DataError) as e:
        check_rows_labels(rows, _softmax_check(3), lambda i: f"table row {i}")
    assert str(e.value) == "table row 1: label 3 is not a class index in 0..2 (ml.num.class=3)"


# --- a sample id first, and no label ----------------------------------------------------------

SKIP = " (set ml.data.skip.bad.lines=true to skip malformed lines)"


def _error(path: str, **kv: object) -> str:
    with pytest.raises(D.DataError) as e:
        D.load_file(path, C(**kv))
    return str(e.value)


def test_with_a_sample_id_set_a_missing_label_says_has_label(tmp_path: Path) -> None:
    p = write(tmp_path, "s1 3:1 11:1\ns2 5:1\n", "sid.libsvm")
    assert _error(p, **{"ml.data.sid": True}) == (
        f"{p}:1: the label is '3:1', not a number (no label after the sample id? set "
        "ml.data.has.label=false); expected '<sid> <label> <id>:<value> ...' (libsvm), "
        "got 's1 3:1 11:1'" + SKIP
    )
    read = D.load_file(p, C(**{"ml.data.sid": True, "ml.data.has.label": False}))
    assert len(read) == 2


def test_without_a_sample_id_a_feature_first_says_has_label(tmp_path: Path) -> None:
    p = write(tmp_path, "3:1 11:1\n", "plain.libsvm")
    assert _error(p) == (
        f"{p}:1: the label is '3:1', not a number (no label? set ml.data.has.label=false); "
        "expected '<label> <id>:<value> ...' (libsvm), got '3:1 11:1'" + SKIP
    )


def test_with_a_sample_id_set_a_bad_line_is_quoted_whole(tmp_path: Path) -> None:
    p = write(tmp_path, "s1 1 3:1\ns2 1 3:x\n", "sid.libsvm")
    assert _error(p, **{"ml.data.sid": True}) == (
        f"{p}:2: the value of feature 3 is 'x', not a number; expected "
        "'<sid> <label> <id>:<value> ...' (libsvm), got 's2 1 3:x'" + SKIP
    )


# --- a dummy line with a bad id is not dense -----------------------------------------------------

CENSUS = {"ml.data.type": "dummy", "ml.feature.index.range": 148}


@pytest.mark.parametrize("bad", ["-11", "11.0"])
def test_a_bad_dummy_id_is_not_called_dense(tmp_path: Path, bad: str) -> None:
    rows = CENSUS_DUMMY.read_text().splitlines()[:5]
    assert len(rows[2].split()) == 14  # a label and 13 ids
    rows[2] = rows[2].replace(" 11 ", f" {bad} ", 1)
    p = write(tmp_path, "\n".join(rows) + "\n", "census.dummy")
    assert _error(p, **CENSUS) == (
        f"{p}:3: feature id '{bad}' is not a valid dummy id (a non-negative integer below "
        "ml.feature.index.range=148); expected '<label> <id> ...' (dummy), "
        f"got '{rows[2]}'" + SKIP
    )


def test_a_dense_row_in_a_dummy_input_is_still_called_dense(tmp_path: Path) -> None:
    row = "1 " + " ".join(["0.5", "0", "1", "-2"] * 37)  # 148 values
    p = write(tmp_path, row + "\n", "dense.txt")
    said = _error(p, **CENSUS)
    assert said.endswith("; the line is dense: set ml.data.type=dense?"), said
    # without ml.feature.index.range: values that are mostly not ids, or repeat
    p = write(tmp_path, "1 0.5 0.25 3\n", "dense2.txt")
    assert _error(p, **{"ml.data.type": "dummy"}).endswith("set ml.data.type=dense?")
    p = write(tmp_path, "1 0 0 0.5 1 0\n", "dense3.txt")
    assert _error(p, **{"ml.data.type": "dummy"}).endswith("set ml.data.type=dense?")
    p = write(tmp_path, "1 2 5 7.0 9\n", "dummy.txt")
    assert _error(p, **{"ml.data.type": "dummy"}) == (
        f"{p}:1: feature id '7.0' is not a valid dummy id (a non-negative integer); "
        "expected '<label> <id> ...' (dummy), got '1 2 5 7.0 9'" + SKIP
    )
