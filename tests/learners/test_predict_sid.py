"""Angel's predict files: ``ml.data.sid=true`` (a sample id first on each line, carried to the
output), Angel's output columns (``angel.predict.out.format=angel``), labels written as read,
and the label error's hint (learners/runs/predict_output.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pytest

from learners.cli.main import main
from learners.data.labels import binary_labels01
from learners.runs.predict_output import prediction_columns

ROOT = Path(__file__).resolve().parents[2]
ROWS = 600


@pytest.fixture(scope="module")
def model(tmp_path_factory, ray_local) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("sid")
    lines = (ROOT / "data/a9a/a9a_123d_train.libsvm").read_text().splitlines()[:ROWS]
    data = tmp / "train.libsvm"
    data.write_text("\n".join(lines) + "\n")
    argv = [
        "train", "--conf", str(ROOT / "conf/lr_a9a.properties"),
        "--angel.train.data.path", str(data), "--ml.epoch.num", "1",
        "--angel.save.model.path", str(tmp / "model"), "--angel.log.path", str(tmp / "runs"),
    ]  # fmt: skip
    assert main(argv) == 0
    # Angel's predict layout: a sample id (numbers and strings), then the features
    sids = [f"u{i}" if i % 2 else str(1000 + i) for i in range(50)]
    feats = [line.split(None, 1)[1] for line in lines[:50]]
    angel = tmp / "predict.libsvm"
    angel.write_text("".join(f"{s} {f}\n" for s, f in zip(sids, feats, strict=True)))
    labelled = tmp / "predict_labelled.libsvm"
    labelled.write_text("".join(f"{s} {line}\n" for s, line in zip(sids, lines[:50], strict=True)))
    plain = tmp / "plain.libsvm"
    plain.write_text("".join(f + "\n" for f in feats))
    return {
        "tmp": tmp, "model": tmp / "model", "angel": angel, "labelled": labelled,
        "plain": plain, "sids": sids, "labels": [ln.split()[0] for ln in lines[:50]],
    }  # fmt: skip


def _predict(m: dict, data: Path, out: Path, *sets: str) -> int:
    argv = ["predict", "--model", str(m["model"]), "--input", str(data), "--out", str(out)]
    return main([*argv, *sets])


@pytest.mark.slow
def test_sample_ids_are_carried_to_the_output(model, capsys) -> None:
    out = model["tmp"] / "sid.csv"
    assert (
        _predict(model, model["angel"], out, "-Dml.data.sid=true", "-Dml.data.has.label=false") == 0
    )
    table = pacsv.read_csv(
        out, convert_options=pacsv.ConvertOptions(column_types={"sid": "string"})
    )
    assert table.column_names == ["sid", "pred"]
    assert table["sid"].to_pylist() == model["sids"]
    # the same predictions as the file without ids
    plain = model["tmp"] / "plain.csv"
    assert _predict(model, model["plain"], plain, "--ml.data.has.label", "false") == 0
    np.testing.assert_allclose(table["pred"].to_numpy(), pacsv.read_csv(plain)["pred"].to_numpy())
    # a sample id, then the label: labels written as read (-1 stays -1)
    out2 = model["tmp"] / "sid_label.csv"
    assert _predict(model, model["labelled"], out2, "--ml.data.sid", "true") == 0
    t2 = pacsv.read_csv(out2, convert_options=pacsv.ConvertOptions(column_types={"sid": "string"}))
    assert t2.column_names == ["sid", "pred", "label"]
    assert t2["label"].to_pylist() == [float(y) for y in model["labels"]]
    assert -1.0 in t2["label"].to_pylist()


@pytest.mark.slow
def test_angels_output_columns(model) -> None:
    out = model["tmp"] / "angel.csv"
    sets = ["-Dml.data.sid=true", "-Dangel.predict.out.format=angel"]
    assert _predict(model, model["labelled"], out, *sets) == 0
    table = pacsv.read_csv(
        out, convert_options=pacsv.ConvertOptions(column_types={"sid": "string"})
    )
    assert table.column_names == ["sid", "pred", "proba", "label"]
    assert table["sid"].to_pylist() == model["sids"]
    proba, score = table["proba"].to_numpy(), table["pred"].to_numpy()
    np.testing.assert_allclose(1 / (1 + np.exp(-score)), proba, rtol=1e-6)
    assert table["label"].to_pylist() == [1 if p > 0.5 else -1 for p in proba]
    # without sample ids, Angel's sid is the row number from 0
    out2 = model["tmp"] / "angel2.csv"
    assert (
        _predict(
            model,
            model["plain"],
            out2,
            "-Dml.data.has.label=false",
            "-Dangel.predict.out.format=angel",
        )
        == 0
    )
    assert pacsv.read_csv(out2)["sid"].to_pylist() == list(range(50))


@pytest.mark.slow
def test_an_id_column_read_as_a_label_says_the_right_fix(model, capsys) -> None:
    out = model["tmp"] / "bad.csv"
    assert _predict(model, model["angel"], out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("angelps: error: ") and len(err.splitlines()) == 1
    assert "predict.libsvm:2: the label is 'u1', not a number (a sample id first? set " in err
    assert "ml.data.sid=true)" in err
    # numeric ids only: read as labels, they fail the binary label check, with the fix named
    numeric = model["tmp"] / "numeric.libsvm"
    numeric.write_text("".join(ln for ln in model["angel"].read_text().splitlines(True)[::2]))
    assert _predict(model, numeric, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "binary labels must be -1/+1 or 0/1; found 1000, " in err
    assert "set ml.data.sid=true, with ml.data.has.label=false when no label follows it" in err


def test_the_label_error_names_the_sid_key() -> None:
    with pytest.raises(ValueError, match=r"found 1000, 1001, 1002 \(.*set ml\.data\.sid=true"):
        binary_labels01(np.array([1000.0, 1001.0, 1002.0]))


def test_prediction_columns_of_each_layout() -> None:
    pred = {
        "pred": np.array([0.8, 0.2], np.float32),
        "label": np.array([1.0, -1.0], np.float32),
        "row_index": np.array([2, 0]),
    }
    sids = np.array(["a", "", "c"], dtype=object)
    ours = prediction_columns(pred, "binary", "angelps", sids)
    assert list(ours) == ["sid", "pred", "label"] and list(ours["sid"]) == ["c", "a"]
    angel = prediction_columns(pred, "binary", "angel", None)
    assert list(angel) == ["sid", "pred", "proba", "label"]
    np.testing.assert_allclose(angel["pred"], [np.log(4.0), -np.log(4.0)], rtol=1e-6)
    assert list(angel["label"]) == [1, -1] and list(angel["sid"]) == [0, 1]
