"""Each model's forward and backward over pulled rows, checked against direct formulas."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from angelconf.config import ConfigError, load_config
from learners.models import config as model_config
from learners.models import zoo as models
from learners.models.config import ModelConfig
from learners.models.sparse_input import SparseInput
from learners.models.zoo import MODELS, build_model, model_class


def _conf_keys(d: dict[str, object]):
    return load_config(None, d, model_config.KEYS)


def _model(conf, num_features: int, num_fields: int | None = None, seed: int | None = None):
    return build_model(ModelConfig.from_config(conf, num_features, num_fields), seed=seed)


def _random_batch(model: models.BaseModel, b: int, n: int, fields: int | None, seed: int = 0):
    """A random CSR batch (one id per field when fields is set), rows pulled as leaf tensors."""
    rng = np.random.default_rng(seed)
    if fields is None:
        counts = rng.integers(1, 6, size=b)
        ids = np.concatenate([np.sort(rng.choice(n, size=c, replace=False)) for c in counts])
    else:
        per = n // fields
        counts = np.full(b, fields)
        ids = np.concatenate(
            [np.arange(fields) * per + rng.integers(0, per, size=fields) for _ in range(b)]
        )
    indptr = np.concatenate([[0], np.cumsum(counts)])
    values = rng.uniform(0.5, 1.5, size=ids.size).astype(np.float32)
    uniq, inv = np.unique(ids, return_inverse=True)
    gen = torch.Generator().manual_seed(seed)
    rows = {}
    for t in model.tables():
        r = uniq.size if t.sparse else t.rows
        rows[t.name] = (torch.randn(r, t.cols, generator=gen) * 0.3).requires_grad_(True)
    x = SparseInput.from_csr(indptr, inv, values, rows, fields)
    return x, ids, indptr, values, uniq


def test_registry_has_every_angel_model():
    assert sorted(MODELS) == sorted(
        [
            "LogisticRegression",
            "SupportVectorMachine",
            "SoftmaxRegression",
            "MixedLogisticRegression",
            "LinearRegression",
            "RobustRegression",
            "FactorizationMachines",
            "DeepFM",
            "WideAndDeep",
            "NeuralFactorizationMachines",
            "ProductNeuralNetwork",
            "DNN",
        ]
    )
    assert model_class("deepfm") is models.DeepFM
    assert model_class("  logisticregression ") is models.LogisticRegression


def test_the_driver_s_model_table_says_what_the_classes_say():
    """learners.models.registry (torch-free, read by the driver before Ray starts) names
    every model class, and each class carries its entry's task and field needs."""
    from learners.models.registry import MODELS as REGISTRY

    # Every entry but Angel's graph model (its class: learners/models/graph_model.py) is a zoo
    # class.
    assert [n for n in REGISTRY if n != "AngelModel"] == list(MODELS)
    assert REGISTRY["AngelModel"].load_class().__name__ == "GraphModel"
    for name, cls in MODELS.items():
        entry = REGISTRY[name]
        assert entry.load_class() is cls, name
        assert (entry.task, entry.needs_fields) == (cls.task, cls.needs_fields), name


def test_unknown_model_lists_valid_names_closest_first():
    with pytest.raises(ConfigError) as e:
        model_class("LogisticRegresion")
    msg = str(e.value)
    assert msg.startswith("ml.model.class.name=LogisticRegresion is not a known model")
    listed = msg.split("closest first): ")[1].split(", ")
    assert listed[0] == "LogisticRegression"
    assert sorted(listed) == sorted([*MODELS, "AngelModel"])


def test_field_models_require_field_num():
    conf = _conf_keys({"ml.model.class.name": "DeepFM"})
    with pytest.raises(ConfigError, match=r"ml\.fm\.field\.num is required"):
        _model(conf, 148, None)


def test_activation_count_must_match_layers():
    conf = _conf_keys(
        {
            "ml.model.class.name": "DNN",
            "ml.model.hidden.layers": "8,4,2",
            "ml.model.activations": "relu,tanh",
        }
    )
    with pytest.raises(ConfigError, match="has 2 names for 3 hidden layers"):
        _model(conf, 10)


def test_a_dnn_without_hidden_layers_is_refused_by_name():
    # `ml.model.hidden.layers=` reads as no layer at all: fine for an MLP head, but DNN's first
    # hidden layer is its PS table (it used to fail with a bare IndexError).
    conf = _conf_keys({"ml.model.class.name": "DNN", "ml.model.hidden.layers": ""})
    with pytest.raises(ConfigError) as e:
        _model(conf, 10)
    assert str(e.value) == (
        "ml.model.hidden.layers is empty, but DNN needs at least one hidden layer (its first "
        "is the sparse PS table): set it (default 500,100) or leave it unset"
    )


def test_the_driver_s_tables_are_the_models_own():
    # The driver starts the shards from learners.models.tables (no torch); every model class
    # declares exactly those tables, with the default DNN width among them.
    from learners.models.tables import model_tables

    for name in MODELS:
        conf = _conf_keys({"ml.model.class.name": name, "ml.num.class": "3"})
        cfg = ModelConfig.from_config(conf, 40, 4)
        assert build_model(cfg, seed=0).tables() == model_tables(cfg), name
    dnn = ModelConfig.from_config(_conf_keys({"ml.model.class.name": "DNN"}), 40, None)
    assert [(t.name, t.cols) for t in model_tables(dnn)] == [("input", 500), ("input_bias", 500)]


def test_bad_activation_name_is_rejected_by_the_loader():
    with pytest.raises(ConfigError, match=r"ml\.model\.activations=relu,swishy is not valid"):
        _conf_keys({"ml.model.activations": "relu,swishy"})


def test_activation_names_match_the_torch_classes():
    # The key module lists the names without torch; the model zoo maps each to its class.
    assert sorted(models._ACTIVATIONS) == sorted(model_config.ACTIVATIONS)


def test_model_config_reads_declared_defaults_from_a_partial_mapping():
    cfg = ModelConfig.from_config({"ml.fm.rank": 3, "ml.model.hidden.layers": [4, 2]}, 10, 5)
    assert (cfg.model, cfg.num_features, cfg.num_fields) == ("LogisticRegression", 10, 5)
    assert (cfg.fm_rank, cfg.hidden, cfg.activations) == (3, (4, 2), None)
    assert cfg == ModelConfig.from_config(
        _conf_keys({"ml.fm.rank": 3, "ml.model.hidden.layers": "4,2"}), 10, 5
    )


def _dense_x(ids, indptr, values, n):
    b = indptr.size - 1
    x = np.zeros((b, n), dtype=np.float64)
    for i in range(b):
        for j in range(indptr[i], indptr[i + 1]):
            x[i, ids[j]] += values[j]
    return x


def _full(rows: torch.Tensor, uniq: np.ndarray, n: int) -> np.ndarray:
    w = np.zeros((n, rows.shape[1]))
    w[uniq] = rows.detach().numpy()
    return w


def test_logistic_regression_is_wx_plus_b_and_logloss():
    n = 20
    m = _model(_conf_keys({}), n)
    x, ids, indptr, values, uniq = _random_batch(m, 7, n, None)
    scores = m(x)
    xd = _dense_x(ids, indptr, values, n)
    expect = xd @ _full(x.rows["weight"], uniq, n)[:, 0] + x.rows["bias"].item()
    np.testing.assert_allclose(scores.detach().numpy(), expect, rtol=1e-5, atol=1e-6)
    y = torch.tensor([1, 0, 1, 1, 0, 0, 1], dtype=torch.float32)
    loss = m.loss(scores, y)
    s = torch.tensor(expect)
    ref = torch.mean(torch.log1p(torch.exp(-(2 * y.double() - 1) * s)))  # Angel: log(1+e^{-yf})
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    loss.backward()
    # d loss / d w_u = mean_i (σ(f_i) − y_i) x_iu, only on pulled rows.
    g = (torch.sigmoid(s) - y.double()).numpy() @ xd / 7
    np.testing.assert_allclose(x.rows["weight"].grad[:, 0].numpy(), g[uniq], rtol=1e-4, atol=1e-6)
    assert x.rows["bias"].grad.item() == pytest.approx(
        float((torch.sigmoid(s) - y.double()).mean()), rel=1e-4
    )


def test_svm_hinge_loss_and_probability():
    m = _model(_conf_keys({"ml.model.class.name": "SupportVectorMachine"}), 5)
    scores = torch.tensor([2.0, 0.5, -0.5, -3.0])
    y = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # max(0, 1 - y f) with y in ±1: 0, 0.5, 1.5, 0
    assert m.loss(scores, y).item() == pytest.approx(0.5)
    assert m.predict(torch.tensor([0.5])).item() == pytest.approx(1 / (1 + math.exp(-1.0)))


def test_softmax_regression_logits_and_label_check():
    n = 12
    m = _model(_conf_keys({"ml.model.class.name": "SoftmaxRegression", "ml.num.class": 3}), n)
    x, ids, indptr, values, uniq = _random_batch(m, 5, n, None)
    scores = m(x)
    assert scores.shape == (5, 3)
    xd = _dense_x(ids, indptr, values, n)
    expect = xd @ _full(x.rows["weight"], uniq, n) + x.rows["bias"].detach().numpy()[0]
    np.testing.assert_allclose(scores.detach().numpy(), expect, rtol=1e-5, atol=1e-6)
    y = m.prepare_labels(torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0]))
    assert y.dtype == torch.int64
    m.loss(scores, y).backward()
    assert x.rows["weight"].grad.shape == (uniq.size, 3)
    assert m.predict(scores).tolist() == expect.argmax(1).tolist()
    with pytest.raises(
        ValueError, match=r"label 3 is not a class index in 0..2 \(ml.num.class=3\)"
    ):
        m.prepare_labels(torch.tensor([0.0, 3.0]))


def test_mixed_lr_matches_direct_formula():
    n = 15
    m = _model(_conf_keys({"ml.model.class.name": "MixedLogisticRegression", "ml.mlr.rank": 4}), n)
    x, ids, indptr, values, uniq = _random_batch(m, 6, n, None)
    logit = m(x)
    xd = torch.tensor(_dense_x(ids, indptr, values, n))
    z = (
        xd @ torch.tensor(_full(x.rows["sigmoid_weight"], uniq, n))
        + x.rows["sigmoid_bias"].detach().double()
    )
    u = (
        xd @ torch.tensor(_full(x.rows["softmax_weight"], uniq, n))
        + x.rows["softmax_bias"].detach().double()
    )
    p = (torch.softmax(u, 1) * torch.sigmoid(z)).sum(1)
    np.testing.assert_allclose(torch.sigmoid(logit).detach().numpy(), p.numpy(), rtol=1e-5)
    y = torch.tensor([1.0, 0, 1, 0, 1, 1])
    loss = m.loss(logit, y)
    ce = -(y.double() * p.log() + (1 - y.double()) * (1 - p).log()).mean()
    assert loss.item() == pytest.approx(ce.item(), rel=1e-5)
    loss.backward()
    assert torch.isfinite(x.rows["softmax_weight"].grad).all()


def test_regression_losses():
    lin = _model(_conf_keys({"ml.model.class.name": "LinearRegression"}), 4)
    f = torch.tensor([1.0, 3.0, -2.0])
    y = torch.tensor([0.0, 3.5, 2.0])
    assert lin.loss(f, y).item() == pytest.approx((0.5 * (1 + 0.25 + 16)) / 3)
    assert lin.predict(f) is f
    rob = _model(
        _conf_keys(
            {"ml.model.class.name": "RobustRegression", "ml.robustregression.loss.delta": 1.5}
        ),
        4,
    )
    # residuals 1, 0.5, 4: ½r² below δ=1.5, δ(|r| − δ/2) above.
    expect = (0.5 + 0.125 + 1.5 * (4 - 0.75)) / 3
    assert rob.loss(f, y).item() == pytest.approx(expect)


def test_fm_interaction_equals_pairwise_sum():
    n = 30
    m = _model(_conf_keys({"ml.model.class.name": "FactorizationMachines", "ml.fm.rank": 3}), n)
    x, ids, indptr, values, uniq = _random_batch(m, 6, n, None)
    out = m(x).detach().numpy()
    w = _full(x.rows["wide"], uniq, n)[:, 0]
    v = _full(x.rows["embedding"], uniq, n)
    b = x.rows["wide_bias"].item()
    for i in range(6):
        sl = slice(indptr[i], indptr[i + 1])
        ii, vv = ids[sl], values[sl]
        expect = b + sum(w[a] * xa for a, xa in zip(ii, vv, strict=True))
        for (a, xa), (c, xc) in itertools.combinations(zip(ii, vv, strict=True), 2):
            expect += v[a] @ v[c] * xa * xc
        assert out[i] == pytest.approx(expect, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize(
    "name", ["DeepFM", "WideAndDeep", "NeuralFactorizationMachines", "ProductNeuralNetwork"]
)
def test_deep_models_forward_backward(name):
    n, f = 40, 5
    conf = _conf_keys(
        {"ml.model.class.name": name, "ml.fm.rank": 4, "ml.model.hidden.layers": "16,8"}
    )
    m = _model(conf, n, f, seed=1)
    x, *_ = _random_batch(m, 8, n, f)
    out = m(x)
    assert out.shape == (8,)
    loss = m.loss(out, torch.tensor([1.0, 0, 1, 0, 1, 0, 0, 1]))
    loss.backward()
    for t in m.tables():
        g = x.rows[t.name].grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, t.name
    for p in m.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
    # The same seed builds the same worker-side layers (every worker starts identical).
    m2 = _model(conf, n, f, seed=1)
    for p, q in zip(m.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p, q)


def test_pnn_input_size_counts_pairs():
    conf = _conf_keys({"ml.model.class.name": "ProductNeuralNetwork", "ml.fm.rank": 8})
    m = _model(conf, 148, 13)
    # Angel's census PNN: 13·8 embeddings + 78 pairwise products = 182 inputs.
    assert m.mlp[0].in_features == 182
    assert [layer.out_features for layer in m.mlp if isinstance(layer, torch.nn.Linear)] == [
        200,
        200,
        1,
    ]


def test_deepfm_fm_part_matches_fm_on_fields():
    n, f = 40, 5
    conf = _conf_keys(
        {"ml.model.class.name": "DeepFM", "ml.fm.rank": 4, "ml.model.hidden.layers": "8"}
    )
    m = _model(conf, n, f, seed=0)
    fm = _model(_conf_keys({"ml.model.class.name": "FactorizationMachines", "ml.fm.rank": 4}), n)
    x, *_ = _random_batch(m, 6, n, f)
    deep = m.mlp(x.field_embeddings("embedding").flatten(1)).squeeze(1)
    torch.testing.assert_close(m(x), fm(x) + deep)


def test_field_embeddings_need_fields():
    m = _model(_conf_keys({"ml.model.class.name": "FactorizationMachines"}), 10)
    x, *_ = _random_batch(m, 3, 10, None)
    with pytest.raises(ValueError, match=r"exactly ml\.fm\.field\.num non-zeros per sample"):
        x.field_embeddings("embedding")


def test_dnn_first_layer_is_a_sparse_table():
    n = 50
    conf = _conf_keys({"ml.model.class.name": "DNN", "ml.model.hidden.layers": "6,3"})
    m = _model(conf, n, seed=0)
    t = {d.name: d for d in m.tables()}
    assert (t["input"].rows, t["input"].cols, t["input"].sparse) == (50, 6, True)
    assert t["input"].init_std == pytest.approx(1 / math.sqrt(50))
    x, ids, indptr, values, uniq = _random_batch(m, 4, n, None)
    h = torch.relu(
        torch.tensor(_dense_x(ids, indptr, values, n), dtype=torch.float32)
        @ torch.tensor(_full(x.rows["input"], uniq, n), dtype=torch.float32)
        + x.rows["input_bias"].detach()
    )
    torch.testing.assert_close(m(x), m.mlp(h).squeeze(1), rtol=1e-4, atol=1e-5)
    m.loss(m(x), torch.ones(4)).backward()
    assert x.rows["input"].grad.shape == (uniq.size, 6)


@pytest.mark.parametrize("unit_values", [True, False], ids=["one-hot", "valued"])
@pytest.mark.parametrize("fields", [None, 4], ids=["samples", "fields"])
@pytest.mark.parametrize("repeats", [1, 40], ids=["few-repeats", "many-repeats"])
def test_sparse_input_fast_paths_match_index_add(unit_values, fields, repeats):
    """The CSR backward of the row gather and the per-sample sums give index_add's gradients.

    ``repeats`` picks the path: with many repeats per pulled row the backward is a CSR product,
    with few it is index_add; without fields the per-sample sum is a CSR product too.
    """
    rng = np.random.default_rng(repeats)
    b, dim = 96, 3
    u = max(2, (b * 4) // repeats)
    counts = np.full(b, fields) if fields else rng.integers(1, 8, size=b)
    nnz = int(counts.sum())
    slots = rng.integers(0, u, size=nnz)
    slots[:u] = np.arange(u)  # every pulled row is used: max slot + 1 == u
    indptr = np.concatenate([[0], np.cumsum(counts)])
    values = (
        np.ones(nnz, dtype=np.float32)
        if unit_values
        else rng.uniform(0.5, 1.5, size=nnz).astype(np.float32)
    )
    base = torch.randn(u, dim, dtype=torch.float64).float()
    rows = base.clone().requires_grad_(True)
    x = SparseInput.from_csr(indptr, slots, values, {"t": rows}, fields)
    assert (x.rows_t is not None) == (nnz >= 4 * u)
    assert (x.value is None) == unit_values
    assert (x.samples_s is not None) == (fields is None)
    out = x.linear("t")
    weights = torch.arange(b * dim, dtype=torch.float32).view(b, dim) / (b * dim)
    (out * weights).sum().backward()

    ref_rows = base.clone().requires_grad_(True)
    sample = torch.from_numpy(np.repeat(np.arange(b), counts))
    e = ref_rows[torch.from_numpy(slots)] * torch.from_numpy(values).unsqueeze(1)
    ref = torch.zeros(b, dim).index_add(0, sample, e)
    (ref * weights).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows.grad, ref_rows.grad, rtol=1e-5, atol=1e-6)
