"""Errors in Angel's JSON job description (``angel.ml.conf``), found when the job's configuration
is read (``angelps conf``, the train preflight): one line naming the file and the place in it,
exit 2, before Ray starts. No Ray, no training."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from learners.cli.main import main

JSONS = Path(__file__).resolve().parents[2] / "tests" / "data" / "angel_json"


def _deepfm() -> dict[str, Any]:
    return copy.deepcopy(json.loads((JSONS / "deepfm.json").read_text()))


def _run_conf(
    tmp_path: Path, doc: dict[str, Any] | bytes, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str, Path]:
    """``angelps conf`` of the JSON ``doc`` saved as deepfm.json: (exit, out, err, its path)."""
    p = tmp_path / "deepfm.json"
    if isinstance(doc, bytes):
        p.write_bytes(doc)
    else:
        p.write_text(json.dumps(doc, indent=2))
    capsys.readouterr()
    rc = main(["conf", "--angel.ml.conf", str(p)])
    said = capsys.readouterr()
    return rc, said.out, said.err.strip(), p


def _conf(tmp_path: Path, doc: dict[str, Any] | bytes, capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of ``angelps conf`` (exit 2) on ``doc``, after the file's name."""
    rc, _, err, p = _run_conf(tmp_path, doc, capsys)
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    prefix = f"angelps: error: {p}"
    assert err.startswith(prefix), err
    return err[len(prefix) :]


def _ok(tmp_path: Path, doc: dict[str, Any] | bytes, capsys: pytest.CaptureFixture[str]) -> str:
    rc, out, err, _ = _run_conf(tmp_path, doc, capsys)
    assert rc == 0, err
    return out


# --- 1. a layer's optimizer values, checked by the optimizer's own rules -------------------------


@pytest.mark.parametrize(
    ("opt", "msg"),
    [
        ({"type": "momentum", "momentum": 0.9, "reg2": -1}, ".reg2: -1 must be >= 0"),
        ({"type": "momentum", "momentum": 1.5}, ".momentum: 1.5 must be in [0, 1)"),
        ({"type": "adam", "epsilon": 0}, ".epsilon: 0 must be > 0"),
        ({"type": "ftrl", "beta": -0.5}, ".beta: -0.5 must be >= 0"),
    ],
)
def test_a_layer_optimizer_value_out_of_range_names_its_place(tmp_path, capsys, opt, msg):
    doc = _deepfm()
    doc["layers"][1]["optimizer"] = opt
    assert _conf(tmp_path, doc, capsys) == f": layers[1].optimizer{msg}"


def test_default_optimizer_value_out_of_range_names_its_place(tmp_path, capsys):
    doc = _deepfm()
    doc["default_optimizer"] = {"type": "momentum", "momentum": 1.5}
    assert _conf(tmp_path, doc, capsys) == ": default_optimizer.momentum: 1.5 must be in [0, 1)"


# --- 2. an optimizer the workers' dense layers cannot run ---------------------------------------

_NOT_DENSE = (
    'cannot run on the workers, where the FCLayer "fclayer" (layers[2]) runs with '
    "angel.dense.placement=worker (FTRL ignores the step size; valid for worker-side dense "
    "layers: SGD, Momentum, Adam, AdaGrad, RMSProp)"
)


def test_ftrl_on_an_fclayer_names_the_layer(tmp_path, capsys):
    doc = _deepfm()
    doc["layers"][2]["optimizer"] = "ftrl"
    assert _conf(tmp_path, doc, capsys) == f": layers[2].optimizer=ftrl {_NOT_DENSE}"


def test_ftrl_as_default_optimizer_names_default_optimizer(tmp_path, capsys):
    doc = _deepfm()
    doc["default_optimizer"] = "FTRL"
    assert _conf(tmp_path, doc, capsys) == f": default_optimizer.type=FTRL {_NOT_DENSE}"


def test_ftrl_on_sparse_layers_is_fine(tmp_path, capsys):
    doc = _deepfm()
    doc["layers"][1]["optimizer"] = "ftrl"
    _ok(tmp_path, doc, capsys)


# --- 3. layer keys ----------------------------------------------------------------------------------


def test_known_parameters_list_the_input_key(tmp_path, capsys):
    doc = _deepfm()
    doc["layers"][2]["foo"] = 1
    assert _conf(tmp_path, doc, capsys) == (
        ": layers[2].foo: FCLayer has no parameter foo (known: inputlayer, name, optimizer, "
        "outputdim, outputdims, transfunc, transfuncs, type)"
    )
    doc = _deepfm()
    doc["layers"][4]["foo"] = 1
    assert _conf(tmp_path, doc, capsys) == (
        ": layers[4].foo: SumPooling has no parameter foo (known: inputlayers, name, outputdim, "
        "type)"
    )


def test_layer_keys_are_read_case_insensitively(tmp_path, capsys):
    doc = _deepfm()
    doc["layers"][0]["Type"] = doc["layers"][0].pop("type")
    doc["layers"][0]["Name"] = doc["layers"][0].pop("name")
    del doc["layers"][1]["optimizer"]
    doc["layers"][1]["Optimizer"] = {"Type": "momentum", "Reg2": 0.01}
    doc["Default_Optimizer"] = doc.pop("default_optimizer")
    out = _ok(tmp_path, doc, capsys)
    assert "AngelModel" in out


@pytest.mark.parametrize("key", ["name", "type"])
def test_a_missing_name_or_type_is_said_missing(tmp_path, capsys, key):
    doc = _deepfm()
    del doc["layers"][0][key]
    assert _conf(tmp_path, doc, capsys) == (
        f": layers[0]: {key} is missing (a layer is a JSON object with name and type)"
    )


def test_transfunc_and_transfuncs_together_are_refused(tmp_path, capsys):
    doc = _deepfm()
    doc["layers"][2]["transfunc"] = "relu"
    assert _conf(tmp_path, doc, capsys) == (
        ": layers[2].transfunc: give transfuncs or transfunc, not both"
    )


def test_inputlayer_and_inputlayers_together_are_refused(tmp_path, capsys):
    doc = _deepfm()
    doc["layers"][2]["inputlayers"] = ["embedding"]
    assert _conf(tmp_path, doc, capsys) == (
        ": layers[2].inputlayers: this layer takes inputlayer, not inputlayers"
    )
    doc = _deepfm()
    doc["layers"][4]["inputlayer"] = "wide"
    assert _conf(tmp_path, doc, capsys) == (
        ": layers[4].inputlayer: this layer takes inputlayers, not inputlayer"
    )


# --- 4. malformed JSON ------------------------------------------------------------------------------


def test_a_utf8_bom_is_read(tmp_path, capsys):
    _ok(tmp_path, b"\xef\xbb\xbf" + (JSONS / "deepfm.json").read_bytes(), capsys)


def test_a_trailing_comma_is_named(tmp_path, capsys):
    assert _conf(tmp_path, b'{"data": {"format": "dummy",\n}}', capsys) == (
        ":2:1: malformed JSON: Expecting property name enclosed in double quotes "
        "(a trailing comma before 2:1 is not allowed in JSON)"
    )
    assert _conf(tmp_path, b'{"layers": [1, 2,]}', capsys) == (
        ":1:18: malformed JSON: Expecting value (a trailing comma before 1:18 is not allowed in JSON)"
    )


@pytest.mark.parametrize("comment", ["// the data", "/* the data */"])
def test_a_comment_is_named(tmp_path, capsys, comment):
    text = '{\n  "train": {"epoch": 1}, ' + comment + '\n  "data": {}\n}'
    assert _conf(tmp_path, text.encode(), capsys) == (
        ":2:26: malformed JSON: Expecting property name enclosed in double quotes "
        "(JSON has no comments: remove them)"
    )
