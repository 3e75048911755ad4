"""A label that does not fit the model stops ``predict`` and ``evaluate`` as it stops training:
a DataError (exit 2) naming the file and line of the first bad one, before any prediction
(learners/worker/predict.py); rows without labels still predict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from learners import GraphLearner
from learners.cli.main import main
from learners.data import DataError

ROOT = Path(__file__).resolve().parents[2]
DNA = ROOT / "data/dna/dna.scale"
BAD_LINE = 17


@pytest.fixture(scope="module")
def model(tmp_path_factory, ray_local) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("labels")
    lines = DNA.read_text().splitlines()[:300]
    train = tmp / "train.libsvm"
    train.write_text("\n".join(lines) + "\n")
    sets = [
        f"angel.train.data.path={train}",
        "ml.epoch.num=1",
        f"angel.save.model.path={tmp / 'model'}",
        f"angel.log.path={tmp / 'runs'}",
    ]
    argv = ["train", "--conf", str(ROOT / "conf/softmax_dna.properties")]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    # dna's labels are 1..3 (SubOneTrans: classes 0..2): 4 is class 3, which the model lacks
    rows = lines[:40]
    rows[BAD_LINE - 1] = "4" + rows[BAD_LINE - 1][1:]
    bad = tmp / "bad.libsvm"
    bad.write_text("\n".join(rows) + "\n")
    plain = tmp / "plain.libsvm"
    plain.write_text("".join(r.split(None, 1)[1] + "\n" for r in rows))
    return {"tmp": tmp, "model": tmp / "model", "bad": bad, "plain": plain}


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("verb", ["predict", "evaluate"])
def test_a_bad_label_is_named_by_its_file_and_line(model, capsys, verb: str) -> None:
    argv = [verb, "--model", str(model["model"]), "--input", str(model["bad"])]
    out = model["tmp"] / f"{verb}.csv"
    if verb == "predict":
        argv += ["--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 2
    said = _last_line(capsys.readouterr().err)
    assert said.startswith("angelps: error: "), said
    assert (
        f"{model['bad']}:{BAD_LINE}: label 4 (3 after ml.data.label.trans.class=SubOneTrans) "
        "is not a class index in 0..2 (ml.num.class=3): labels 1..3 are expected with SubOneTrans"
        in said
    ), said
    assert not out.exists()


def test_rows_without_labels_still_predict(model) -> None:
    out = model["tmp"] / "plain.csv"
    argv = ["predict", "--model", str(model["model"]), "--input", str(model["plain"])]
    assert main([*argv, "--out", str(out), "--set", "ml.data.has.label=false"]) == 0
    assert len(out.read_text().splitlines()) == 41  # a header, a row a line


def test_an_in_memory_bad_label_is_named_by_its_row(model) -> None:
    lines = model["bad"].read_text().splitlines()
    table = pa.table(
        {
            "ids": [[int(t.split(":")[0]) - 1 for t in ln.split()[1:]] for ln in lines],
            "label": [float(ln.split()[0]) for ln in lines],
        }
    )
    with GraphLearner.load(model["model"]) as learner:
        with pytest.raises(
            DataError,
            match=rf"^Table row {BAD_LINE - 1}: label 4 \(3 after ml\.data\.label\.trans\.class="
            r"SubOneTrans\) is not a class",
        ):
            learner.evaluate(table)
        ok = np.asarray(learner.evaluate(table.slice(0, BAD_LINE - 1))["valid_accuracy"])
    assert 0.0 <= float(ok) <= 1.0
