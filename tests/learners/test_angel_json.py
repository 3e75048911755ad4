"""Angel's JSON job description (``angel.ml.conf``): its sections as keys, its layers as a model.

The JSON files in tests/data/angel_json/ are the examples of Angel's documentation
(docs/algo/*_on_angel_en.md; dnn.json with its dangling ``inputlayer`` as published). A graph with
the layers of a built-in model is checked against that model as the oracle: the same seed gives
the same scores and the same gradients of every PS row and dense parameter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from angelconf.config import Config, ConfigError, load_config
from learners.cli.main import main
from learners.keys import all_keys
from learners.models.angel_graph import graph_from_text
from learners.models.angel_json import apply_angel_json
from learners.models.config import ModelConfig, job_model_info
from learners.models.sparse_input import SparseInput
from learners.models.table_decl import table_specs
from learners.models.tables import model_tables
from learners.models.zoo import BaseModel, build_model

ROOT = Path(__file__).resolve().parents[2]
JSONS = ROOT / "tests" / "data" / "angel_json"


def _conf(keys: dict[str, Any]) -> Config:
    return apply_angel_json(load_config(None, keys, all_keys()))


def _json_conf(name: str, **keys: Any) -> Config:
    return _conf({"angel.ml.conf": str(JSONS / name), **keys})


def _write(tmp_path: Path, doc: dict[str, Any] | str) -> str:
    p = tmp_path / "graph.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def _doc(name: str) -> dict[str, Any]:
    return json.loads((JSONS / name).read_text())


# --- the sections as keys -------------------------------------------------------------------------


def test_the_deepfm_json_sets_the_keys_of_its_sections() -> None:
    c = _json_conf("deepfm.json")
    src = str(JSONS / "deepfm.json")
    assert c["ml.model.class.name"] == "AngelModel"
    assert (c["ml.learn.rate"], c["ml.epoch.num"], c["ml.num.update.per.epoch"]) == (0.5, 10, 10)
    assert (c["ml.data.type"], c["ml.feature.index.range"], c["ml.fm.field.num"]) == (
        "dummy",
        148,
        13,
    )
    assert c["ml.data.validate.ratio"] == 0.1 and c["ml.opt.decay.beta"] == 0.01
    assert c["ml.embedding.optimizer"] == "Momentum" == c["ml.fclayer.optimizer"]
    assert c.source("ml.learn.rate") == f"{src}: train.lr"
    assert c.source("ml.fm.field.num") == f"{src}: data.numfield"
    info = job_model_info(c)
    assert (info.angel_name, info.task, info.needs_fields) == ("AngelModel", "binary", True)


def test_default_optimizer_parameters_become_the_optimizer_keys() -> None:
    c = _json_conf("wideanddeep.json")
    assert c["ml.opt.momentum.momentum"] == 0.9 and c["ml.reg.l2"] == 0.01
    assert c["ml.learn.decay"] == 0.8  # Angel's train.decay: StandardDecay's alpha
    c = _json_conf("lr.json")
    assert c["ml.inputlayer.optimizer"] == "SGD" and c["ml.data.use.shuffle"] is True


def test_keys_of_the_job_win_over_the_json(tmp_path: Path) -> None:
    props = tmp_path / "job.properties"
    props.write_text(f"angel.ml.conf = {JSONS / 'deepfm.json'}\nml.epoch.num = 3\n")
    c = apply_angel_json(load_config(props, ["ml.learn.rate=0.02"], all_keys()))
    assert (c["ml.epoch.num"], c["ml.learn.rate"]) == (3, 0.02)
    assert c.source("ml.learn.rate") == "command line"
    assert c.source("ml.epoch.num") == f"{props}:2"
    assert c["ml.num.update.per.epoch"] == 10  # the JSON's, not set by the job
    # applied once: a second pass (the command line, then GraphLearner) changes nothing
    assert dict(apply_angel_json(c)) == dict(c)


def test_angels_updates_per_epoch_apply_unless_the_job_sizes_batches() -> None:
    # fm.json gives neither numupdateperepoch nor batchsize: Angel's default of 10 updates
    c = _json_conf("fm.json")
    assert c["ml.num.update.per.epoch"] == 10 and c.is_set("ml.num.update.per.epoch")
    c = _json_conf("fm.json", **{"ml.minibatch.size": 64})
    assert not c.is_set("ml.num.update.per.epoch")


def test_an_angel_model_class_with_a_json_builds_the_layers() -> None:
    for name in (
        "com.tencent.angel.ml.core.graphsubmit.AngelModel",
        "com.tencent.angel.ml.core.graphsubmit.GraphModel",
        "com.tencent.angel.ml.classification.DeepFM",
    ):
        c = _json_conf("deepfm.json", **{"ml.model.class.name": name})
        assert ModelConfig.from_config(c, 148, 13).model == "AngelModel"
    with pytest.raises(ConfigError, match=r"ml\.model\.class\.name=DeepFMM is not a known model"):
        _json_conf("deepfm.json", **{"ml.model.class.name": "DeepFMM"})


def test_angel_model_without_a_json_says_what_is_missing() -> None:
    c = _conf({"ml.model.class.name": "com.tencent.angel.ml.core.graphsubmit.AngelModel"})
    with pytest.raises(
        ConfigError, match=r"builds its network from a JSON graph: set angel\.ml\.conf"
    ):
        job_model_info(c)


# --- tables -----------------------------------------------------------------------------------------


def test_input_layers_and_embeddings_are_ps_tables_with_their_own_optimizers() -> None:
    c = _json_conf("deepfm.json")
    decls = model_tables(ModelConfig.from_config(c, 148, 13))
    assert [(d.name, d.rows, d.cols, d.sparse, d.role) for d in decls] == [
        ("wide_weight", 148, 1, True, "inputlayer"),
        ("wide_bias", 1, 1, False, "inputlayer"),
        ("embedding_embedding", 148, 8, True, "embedding"),
    ]
    specs = {s.name: s for s in table_specs(c, decls)}
    assert specs["embedding_embedding"].optimizer.name == "momentum"
    assert specs["embedding_embedding"].optimizer.l2 == 0.01  # the layer's reg2
    assert specs["wide_weight"].optimizer.l2 == 0.0  # the default optimizer's (none)


def test_the_driver_reads_a_graph_without_torch(heavy_after) -> None:
    code = (
        "from angelconf.config import load_config\nfrom learners.keys import all_keys\n"
        "from learners.models.angel_json import apply_angel_json\n"
        "from learners.models.config import ModelConfig, job_model_info\n"
        "c = apply_angel_json(load_config(None, "
        "{'angel.ml.conf': 'tests/data/angel_json/deepfm.json'}, all_keys()))\n"
        "assert job_model_info(c).needs_fields\n"
        "from learners.models.tables import model_tables\n"
        "assert len(model_tables(ModelConfig.from_config(c, 148, 13))) == 3\n"
    )
    assert "torch" not in heavy_after(code)


# --- the graph against the built-in models ------------------------------------------------------


def _batch(tables: dict[str, tuple[int, bool]], b: int, n: int, f: int | None, seed: int = 0):
    """A CSR batch (one id per field when ``f``) with pulled rows for ``tables`` (name ->
    (cols, sparse)); the same ids and rows for every call with the same seed."""
    rng = np.random.default_rng(seed)
    if f is None:
        counts = rng.integers(1, 6, size=b)
        ids = np.concatenate([np.sort(rng.choice(n, size=c, replace=False)) for c in counts])
    else:
        per, counts = n // f, np.full(b, f)
        ids = np.concatenate([np.arange(f) * per + rng.integers(0, per, size=f) for _ in range(b)])
    indptr = np.concatenate([[0], np.cumsum(counts)])
    values = rng.uniform(0.5, 1.5, size=ids.size).astype(np.float32)
    uniq, inv = np.unique(ids, return_inverse=True)
    gen = torch.Generator().manual_seed(seed)
    rows = {
        name: (torch.randn(uniq.size if sparse else 1, cols, generator=gen) * 0.3).requires_grad_()
        for name, (cols, sparse) in tables.items()
    }
    return SparseInput.from_csr(indptr, inv, values, rows, f)


def _same_model(graph: BaseModel, builtin: BaseModel, names: dict[str, str], n: int, f: int | None):
    """Scores, loss and every gradient of ``graph`` equal those of ``builtin`` (its tables
    ``names[builtin table] = graph table``) on the same batch."""
    shapes = {t.name: (t.cols, t.sparse) for t in builtin.tables()}
    assert {names[t.name]: (t.cols, t.sparse) for t in builtin.tables()} == {
        t.name: (t.cols, t.sparse) for t in graph.tables()
    }
    xb = _batch(shapes, 16, n, f)
    xg = _batch({names[k]: v for k, v in shapes.items()}, 16, n, f)
    y = torch.tensor([1.0, 0.0] * 8)
    sb, sg = builtin(xb), graph(xg)
    torch.testing.assert_close(sg, sb, rtol=1e-6, atol=1e-6)
    builtin.loss(sb, y).backward()
    graph.loss(sg, y).backward()
    for k, v in names.items():
        torch.testing.assert_close(xg.rows[v].grad, xb.rows[k].grad, rtol=1e-5, atol=1e-7)
    pb, pg = list(builtin.parameters()), list(graph.parameters())
    assert [p.shape for p in pg] == [p.shape for p in pb]
    for p, q in zip(pg, pb, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


_WIDE = {"wide": "wide_weight", "wide_bias": "wide_bias", "embedding": "embedding_embedding"}


@pytest.mark.parametrize(
    ("json_name", "builtin", "keys", "names", "fields"),
    [
        ("lr.json", "LogisticRegression", {}, {"weight": "wide_weight", "bias": "wide_bias"}, None),
        ("fm.json", "FactorizationMachines", {}, _WIDE, None),
        ("fm.json", "FactorizationMachines", {}, _WIDE, 13),
        ("deepfm.json", "DeepFM", {"ml.model.hidden.layers": "100,100"}, _WIDE, 13),
        ("wideanddeep.json", "WideAndDeep", {"ml.model.hidden.layers": "100,100"}, _WIDE, 13),
        ("nfm.json", "NeuralFactorizationMachines", {"ml.model.hidden.layers": "50,50"}, _WIDE, 13),
        ("pnn.json", "ProductNeuralNetwork", {"ml.model.hidden.layers": "200,200"}, _WIDE, 13),
    ],
)
def test_a_documented_graph_is_its_built_in_model(json_name, builtin, keys, names, fields) -> None:
    n = 148
    g = ModelConfig.from_config(_json_conf(json_name), n, fields)
    b = ModelConfig.from_config(_conf({"ml.model.class.name": builtin, **keys}), n, fields)
    _same_model(build_model(g, seed=5), build_model(b, seed=5), names, n, fields)


def test_a_dnn_graph_is_the_built_in_dnn(tmp_path: Path) -> None:
    doc = _doc("dnn.json")
    doc["layers"][1]["inputlayer"] = "simpleinputlayer"  # the published file names no such layer
    del doc["data"]["posnegratio"]
    c = _conf({"angel.ml.conf": _write(tmp_path, doc)})
    b = _conf({"ml.model.class.name": "DNN", "ml.model.hidden.layers": "500,100"})
    names = {"input": "simpleinputlayer_weight", "input_bias": "simpleinputlayer_bias"}
    g_model = build_model(ModelConfig.from_config(c, 300, None), seed=2)
    b_model = build_model(ModelConfig.from_config(b, 300, None), seed=2)
    assert g_model.tables()[0].init_std == b_model.tables()[0].init_std
    _same_model(g_model, b_model, names, 300, None)


def test_a_custom_graph_composes_the_layers(tmp_path: Path) -> None:
    """Two input layers, an embedding read three ways, a concatenation, pooling, dropout and a
    per-layer FC optimizer: a graph no built-in model has, trained one step."""
    doc = {
        "default_transfunc": "relu",
        "layers": [
            {"name": "wide", "type": "SimpleInputLayer", "outputdim": 1},
            {"name": "deep_in", "type": "SparseInputLayer", "outputdim": 6, "transfunc": "tanh"},
            {"name": "emb", "type": "Embedding", "numfactors": 3, "outputdim": 12},
            {"name": "bi", "type": "BiInteractionCross", "inputlayer": "emb", "outputdim": 3},
            {"name": "pairs", "type": "BiInnerCross", "inputlayer": "emb", "outputdim": 6},
            {"name": "fm", "type": "BiInnerSumCross", "inputlayer": "emb"},
            {
                "name": "cat",
                "type": "ConcatLayer",
                "inputlayers": ["deep_in", "bi", "pairs", "emb"],
                "outputdim": 27,
            },
            {
                "name": "mlp",
                "type": "FCLayer",
                "inputlayer": "cat",
                "outputdims": [8, 1],
                "transfuncs": [{"type": "dropout", "proba": 0.2}, "identity"],
                "optimizer": {"type": "adam", "beta": 0.8},
            },
            {"name": "out", "type": "SumPooling", "inputlayers": ["wide", "fm", "mlp"]},
            {
                "name": "loss",
                "type": "SimpleLossLayer",
                "lossfunc": "hingeloss",
                "inputlayer": "out",
            },
        ],
    }
    c = _conf({"angel.ml.conf": _write(tmp_path, doc), "ml.fm.field.num": 4})
    m = build_model(ModelConfig.from_config(c, 40, 4), seed=0)
    assert [t.name for t in m.tables()] == [
        "wide_weight",
        "wide_bias",
        "deep_in_weight",
        "deep_in_bias",
        "emb_embedding",
    ]
    x = _batch({t.name: (t.cols, t.sparse) for t in m.tables()}, 8, 40, 4)
    scores = m(x)
    assert scores.shape == (8,)
    m.loss(scores, torch.ones(8)).backward()
    assert all(x.rows[t.name].grad is not None for t in m.tables())
    from angelps.table import OptimizerSpec

    opt = m.dense_optimizer(list(m.parameters()), OptimizerSpec("momentum"))
    assert {s.name for s in opt.specs} == {"adam"} and opt.specs[0].beta1 == 0.8
    before = [p.detach().clone() for p in m.parameters()]
    opt.step(0.01)
    assert all(not torch.equal(p, q) for p, q in zip(m.parameters(), before, strict=True))
    assert m.predict(scores).min() >= 0  # hinge: sigmoid(2f)
    # angel.dense.placement=ps: the layer's parameters are PS tables with its optimizer
    from learners.worker.dense import dense_tables_on_ps

    placed: list[Any] = []
    dense_tables_on_ps(m, placed, set())
    assert {d.name: d.optimizer for d in placed}["dense.fc.mlp.0.weight"] == (
        "adam",
        (("beta1", 0.8),),
    )


# --- errors -----------------------------------------------------------------------------------------


def _error(tmp_path: Path, doc: dict[str, Any] | str, **keys: Any) -> str:
    path = _write(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        c = _conf({"angel.ml.conf": path, **keys})
        model_tables(ModelConfig.from_config(c, 148, c["ml.fm.field.num"]))
    msg = str(e.value)
    assert "\n" not in msg
    return msg.replace(path, "FILE")


def _with(file: str, i: int, /, **changes: Any) -> dict[str, Any]:
    doc = _doc(file)
    doc["layers"][i].update(changes)
    return doc


def test_errors_name_the_json_path(tmp_path: Path) -> None:
    cases = [
        (
            _with("deepfm.json", 3, type="Foo"),
            'FILE: layers[3].type: unknown layer type "Foo" (known: SimpleInputLayer',
        ),
        (
            _with("deepfm.json", 1, numfactor=8),
            "FILE: layers[1].numfactor: embedding has no parameter numfactor (known: name, "
            "numfactors, optimizer, outputdim, type)",
        ),
        (
            _with("deepfm.json", 2, transfuncs=["relu", "relu"]),
            "FILE: layers[2].transfuncs: expected a list of 3 transfer functions, one per output",
        ),
        (
            _with("deepfm.json", 2, transfuncs=["relu", "swish", "identity"]),
            'FILE: layers[2].transfuncs[1]: unknown transfer function "swish" (known: identity, '
            "relu, sigmoid, tanh, softmax, dropout)",
        ),
        (
            _with("deepfm.json", 1, optimizer={"type": "momentum", "lr": 0.1}),
            "FILE: layers[1].optimizer.lr: a per-layer learning rate is not supported",
        ),
        (
            _with("deepfm.json", 1, optimizer={"type": "nadam"}),
            'FILE: layers[1].optimizer.type: unknown optimizer "nadam" (known: sgd, momentum',
        ),
        (
            _with("deepfm.json", 5, lossfunc="focal"),
            'FILE: layers[5].lossfunc: unknown loss function "focal" (known: logloss, hingeloss',
        ),
        (
            _with("deepfm.json", 4, inputlayers=["wide", "fclayer"]),
            'FILE: layers[3]: layer "biinnersumcross" does not lead to the loss layer',
        ),
        (
            _with("deepfm.json", 4, inputlayers=["wide", "embedding"]),
            'FILE: layers[2]: layer "fclayer" does not lead to the loss layer',
        ),
        (
            _with("deepfm.json", 1, name="wide"),
            'FILE: layers[1].name: "wide" is already the name of layers[0]',
        ),
        (
            _with("deepfm.json", 1, outputdim=100),
            "FILE: layers[1].outputdim: 100 does not match the layer's output width 104 "
            "(13 fields x numfactors 8)",
        ),
        (
            _with("pnn.json", 2, outputdim=77),
            "FILE: layers[2].outputdim: 77 does not match the layer's output width 78",
        ),
        (
            _with("fm.json", 3, inputlayers=["wide", "biinnersumcross", "embedding"]),
            "FILE: layers[3].inputlayers: inputs of different widths (wide 1, biinnersumcross 1, "
            "embedding 104)",
        ),
        (
            _with("lr.json", 1, inputlayer="nothing"),
            'FILE: layers[1].inputlayer: no layer is named "nothing" (layers: wide, '
            "simplelosslayer)",
        ),
        (
            _with("lr.json", 0, inputlayer="simplelosslayer"),
            "FILE: layers[0].inputlayer: an input layer or an Embedding reads the sample: it has no "
            "input layer",
        ),
        (
            _with("lr.json", 0, outputdim=3),
            'FILE: layers[1]: logloss needs one score per sample, but its input "wide" has width 3',
        ),
        ({**_doc("lr.json"), "layer": []}, "FILE: layer: unknown section (known: data, model"),
        (
            {**_doc("lr.json"), "train": {"epochs": 3}},
            "FILE: train.epochs: unknown key of train (known: batchsize, decay, decayalpha",
        ),
        (
            {**_doc("lr.json"), "train": {"epoch": 0}},
            "FILE: train.epoch: ml.epoch.num=0 is not valid",
        ),
        (_doc("dnn.json"), "FILE: data.posnegratio: resampling positives and negatives is not"),
    ]
    for doc, want in cases:
        assert want in _error(tmp_path, doc), want


def test_the_published_dnn_json_names_its_dangling_input(tmp_path: Path) -> None:
    doc = _doc("dnn.json")
    del doc["data"]["posnegratio"]
    assert _error(tmp_path, doc) == (
        'FILE: layers[1].inputlayer: no layer is named "denseinputlayer" '
        "(layers: simpleinputlayer, fclayer, simplelosslayer)"
    )


def test_a_cycle_is_named(tmp_path: Path) -> None:
    doc = {
        "layers": [
            {"name": "a", "type": "FCLayer", "outputdim": 1, "inputlayer": "b"},
            {"name": "b", "type": "FCLayer", "outputdim": 1, "inputlayer": "a"},
            {"name": "l", "type": "SimpleLossLayer", "inputlayer": "a"},
        ]
    }
    assert _error(tmp_path, doc) == "FILE: layers[0]: the layers form a cycle: a -> b -> a"


def test_malformed_json_names_the_file_line_and_column(tmp_path: Path) -> None:
    text = '{\n  "data": {\n    "format": "dummy",\n  }\n}\n'
    assert _error(tmp_path, text) == (
        "FILE:4:3: malformed JSON: Expecting property name enclosed in double quotes "
        "(a trailing comma before 4:3 is not allowed in JSON)"
    )


def test_a_key_given_twice_in_one_object_is_refused(tmp_path: Path) -> None:
    """A JSON parser keeps the last silently (lr 4.0, then 0.001 trained at 0.001); a key
    given twice in a .properties file is an error, and so it is here: the file, the line and
    column of the second, its JSON path and both values as written."""
    text = (
        '{\n  "train": {"epoch": 1, "lr": 4.0,\n'
        '            "lr": 0.001, "decayalpha": 0.01, "decayalpha": 0.9}\n}\n'
    )
    assert _error(tmp_path, text) == (
        'FILE:3:13: train.lr: given twice in one object: "lr": 4.0 at line 2, then '
        '"lr": 0.001 at line 3; keep one'
    )
    # keys are read case-insensitively; on one line the columns tell them apart
    text = '{"train": {"epoch": 1, "lr": 4.0, "LR": 1e-3}}'
    assert _error(tmp_path, text) == (
        'FILE:1:35: train.LR: given twice in one object: "lr": 4.0 at line 1 column 24, then '
        '"LR": 1e-3 at line 1 column 35 (keys are read case-insensitively); keep one'
    )
    # in a layer: its index in the path; a long object or list is shortened
    doc = _doc("lr.json")
    lines = json.dumps(doc, indent=2).splitlines()
    at = next(i for i, x in enumerate(lines) if '"inputlayer": "wide"' in x)
    lines.insert(at, '      "inputlayer": ["simpleinputlayer", "wide", "some", "other", "layers"],')
    assert _error(tmp_path, "\n".join(lines)) == (
        f'FILE:{at + 2}:7: layers[1].inputlayer: given twice in one object: "inputlayer": [...] '
        f'at line {at + 1}, then "inputlayer": "wide" at line {at + 2}; keep one'
    )
    text = '{"train": {"epoch": 1}, "data": {}, "train": {"lr": 0.1}}'
    assert _error(tmp_path, text) == (
        'FILE:1:37: train: given twice in one object: "train": {"epoch": 1} at line 1 column 2, '
        'then "train": {"lr": 0.1} at line 1 column 37; keep one'
    )
    # The same key in two objects (every layer's "name") is no repeat.
    assert _json_conf("deepfm.json")["ml.model.graph"]


def test_a_key_given_twice_in_a_models_graph_is_refused() -> None:
    text = '{"layers": [{"name": "a", "type": "SimpleInputLayer", "outputdim": 1, "name": "b"}]}'
    with pytest.raises(ConfigError) as e:
        graph_from_text(text, "--set")
    assert str(e.value) == (
        'ml.model.graph (--set): layers[0].name: given twice in one object: "name": "a" at '
        'column 14, then "name": "b" at column 71; keep one'
    )


def test_an_invalid_json_value_is_refused_where_a_job_key_overrides_it(tmp_path: Path) -> None:
    """The job's ml.learn.rate wins over the JSON's lr; the JSON's "fast" is still an error
    (it was ignored without a word)."""
    text = '{"train": {"epoch": 1, "lr": "fast"}}'
    assert _error(tmp_path, text, **{"ml.learn.rate": "0.1"}) == (
        "FILE: train.lr: ml.learn.rate=fast is not valid: expected a number"
    )
    text = '{"data": {"format": "libsvn"}, "train": {"epoch": 1}}'
    assert _error(tmp_path, text, **{"ml.data.type": "libsvm"}) == (
        "FILE: data.format: ml.data.type=libsvn is not valid: expected one of libsvm, dummy, "
        "dense, parquet (did you mean libsvm?)"
    )
    doc = {**_doc("lr.json"), "default_optimizer": {"type": "momentum", "momentum": 2}}
    assert _error(tmp_path, doc, **{"ml.opt.momentum.momentum": "0.5"}) == (
        "FILE: default_optimizer.momentum: 2 must be in [0, 1)"
    )


def test_the_command_line_exits_2_on_a_repeated_or_shadowed_invalid_json_value(
    tmp_path: Path, capsys
) -> None:
    data = tmp_path / "d.libsvm"
    data.write_text("1 1:1\n0 2:1\n")
    job = tmp_path / "job.properties"
    job.write_text(
        f"angel.train.data.path = {data}\nml.learn.rate = 0.1\nml.data.type = libsvm\n"
        f"angel.log.path = {tmp_path / 'log'}\n"
    )
    graph = tmp_path / "g.json"
    doc = _doc("lr.json")
    doc["train"] = {"epoch": 1, "lr": 4.0, "decayalpha": 0.01}
    text = json.dumps(doc, indent=2)
    graph.write_text(text.replace('"decayalpha": 0.01', '"decayalpha": 0.01, "decayalpha": 0.9'))
    argv = ["train", "--conf", str(job), "--set", f"angel.ml.conf={graph}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    line = text.splitlines().index('    "decayalpha": 0.01') + 1
    assert err == (
        f"angelps: error: {graph}:{line}:25: train.decayalpha: given twice in one object: "
        f'"decayalpha": 0.01 at line {line} column 5, then "decayalpha": 0.9 at line {line} '
        "column 25; keep one"
    )
    doc["train"] = {"epoch": 1, "lr": "fast"}
    doc["data"]["format"] = "libsvn"
    graph.write_text(json.dumps(doc))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"angelps: error: {graph}: data.format: ml.data.type=libsvn is not valid: expected one "
        "of libsvm, dummy, dense, parquet (did you mean libsvm?)"
    )
    doc["data"]["format"] = "libsvm"
    graph.write_text(json.dumps(doc))
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"angelps: error: {graph}: train.lr: ml.learn.rate=fast is not valid: expected a number"
    )


def test_a_missing_json_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"angel\.ml\.conf=.*nope\.json: the JSON file does not exist"
    ):
        _conf({"angel.ml.conf": str(tmp_path / "nope.json")})


@pytest.mark.parametrize(
    ("loss", "builtin", "cols", "labels"),
    [
        ("l2loss", "LinearRegression", 1, [0.5, -1.0, 2.0, 0.0]),
        ("huberloss", "RobustRegression", 1, [0.5, -1.0, 2.0, 0.0]),
        ("hingeloss", "SupportVectorMachine", 1, [1.0, 0.0, 1.0, 0.0]),
        ("softmaxloss", "SoftmaxRegression", 3, [0.0, 2.0, 1.0, 2.0]),
    ],
)
def test_each_loss_is_its_linear_models(tmp_path: Path, loss, builtin, cols, labels) -> None:
    """A SimpleInputLayer and a SimpleLossLayer: the linear model of the loss (task, scores,
    loss and prediction)."""
    doc = {
        "layers": [
            {"name": "lin", "type": "SimpleInputLayer", "outputdim": cols},
            {"name": "loss", "type": "SimpleLossLayer", "lossfunc": loss, "inputlayer": "lin"},
        ]
    }
    c = _conf({"angel.ml.conf": _write(tmp_path, doc), "ml.num.class": 3})
    b = _conf({"ml.model.class.name": builtin, "ml.num.class": 3})
    g_model = build_model(ModelConfig.from_config(c, 30, None))
    b_model = build_model(ModelConfig.from_config(b, 30, None))
    assert job_model_info(c).task == job_model_info(b).task == g_model.task
    shapes = {"weight": (cols, True), "bias": (cols, False)}
    xb = _batch(shapes, 4, 30, None)
    xg = _batch({"lin_weight": (cols, True), "lin_bias": (cols, False)}, 4, 30, None)
    y = torch.tensor(labels)
    sg, sb = g_model(xg), b_model(xb)
    torch.testing.assert_close(sg, sb)
    torch.testing.assert_close(
        g_model.loss(sg, g_model.prepare_labels(y)), b_model.loss(sb, b_model.prepare_labels(y))
    )
    torch.testing.assert_close(g_model.predict(sg), b_model.predict(sb))


def test_softmax_scores_must_be_one_per_class(tmp_path: Path) -> None:
    doc = {
        "layers": [
            {"name": "lin", "type": "SimpleInputLayer", "outputdim": 4},
            {
                "name": "l",
                "type": "SimpleLossLayer",
                "lossfunc": "softmaxloss",
                "inputlayer": "lin",
            },
        ]
    }
    assert _error(tmp_path, doc, **{"ml.num.class": 3}) == (
        "FILE: layers[1]: softmaxloss reads 4 scores but ml.num.class=3: make them equal"
    )
    # a graph that reached the workers otherwise (ml.model.graph set directly) is refused there
    c = _conf({"ml.model.graph": json.dumps(doc), "ml.num.class": 3})
    with pytest.raises(
        ConfigError, match=r"ml\.model\.graph \(program\): layers\[1\]: softmaxloss"
    ):
        build_model(ModelConfig.from_config(c, 30, None))


def test_a_saved_graph_must_be_the_jobs_network() -> None:
    """Prediction, evaluation, --resume and angel.load.model.path with a JSON: the saved
    network's layers (not their optimizers) must be the job's."""
    from learners.models.angel_json import check_saved_graph

    saved = {"conf": {"ml.model.graph": _json_conf("deepfm.json")["ml.model.graph"]}}
    check_saved_graph(_json_conf("deepfm.json"), saved, "m")
    other_opt = _doc("deepfm.json")
    other_opt["layers"][1]["optimizer"] = "adam"
    check_saved_graph(_conf({"ml.model.graph": json.dumps(other_opt)}), saved, "m")
    check_saved_graph(_conf({}), saved, "m")  # no network named: the saved one applies
    with pytest.raises(ConfigError) as e:
        check_saved_graph(_json_conf("fm.json"), saved, "m")
    assert str(e.value) == (
        f"angel.load.model.path=m holds an AngelModel whose network is not the job's "
        f"(ml.model.graph from {JSONS / 'fm.json'}: layers): layer 3 is fclayer (fc 100,100,1) "
        "there, biinnersumcross (innersumcross 1) here; use the JSON the model was trained with"
    )


def test_the_json_may_be_on_object_storage(tmp_path: Path, monkeypatch) -> None:
    from tests.object_store import make_bucket, s3_server, upload_tree

    with s3_server() as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        make_bucket(env, "angel")
        upload_tree(env, str(JSONS / "fm.json"), "s3://angel/jsons/fm.json")
        c = _conf({"angel.ml.conf": "s3://angel/jsons/fm.json"})
        assert c["ml.learn.rate"] == 0.8
        assert c.source("ml.learn.rate") == "s3://angel/jsons/fm.json: train.lr"
        # The same lines as for a local path (one reader for both: angelps.file_store).
        with pytest.raises(
            ConfigError, match=r"^angel\.ml\.conf=s3://angel/jsons/no\.json: the JSON file does "
        ):
            _conf({"angel.ml.conf": "s3://angel/jsons/no.json"})
        with pytest.raises(
            ConfigError, match=r"^angel\.ml\.conf=s3://angel/jsons: the JSON file is a directory$"
        ):
            _conf({"angel.ml.conf": "s3://angel/jsons"})


def test_a_decay_key_the_json_sets_and_its_schedule_ignores_is_a_note(capsys) -> None:
    """Angel's documented DeepFM JSON sets ``decaybeta`` beside StandardDecay, which ignores
    it (as Angel's did): one note line, not a warning on every run. The same key set by the
    job itself still warns."""
    import warnings

    from learners.job.table_schedules import job_schedule

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job_schedule(_json_conf("deepfm.json"), 100)
    assert [str(w.message) for w in caught] == []
    src = str(JSONS / "deepfm.json")
    assert capsys.readouterr().err == (
        f"angelps: note: ml.opt.decay.beta=0.01 ({src}: train.decaybeta) is not used by "
        "StandardDecay (nor was it by Angel's)\n"
    )
    with pytest.warns(UserWarning) as said:
        job_schedule(_json_conf("deepfm.json", **{"ml.opt.decay.beta": 0.2}), 100)
    assert [str(w.message) for w in said] == [
        "ml.opt.decay.beta: set but not used by StandardDecay"
    ]
    assert capsys.readouterr().err == ""
