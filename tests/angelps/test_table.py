"""TableSpec / OptimizerSpec validation, Angel's keys, deterministic initialisation."""

from __future__ import annotations

import numpy as np
import pytest

from angelconf.config import load_config
from angelps.options import KEYS
from angelps.table import OptimizerSpec, TableSpec, init_rows


def test_optimizer_names_case_insensitive_and_unknown_rejected():
    assert OptimizerSpec("AdaGrad").name == "adagrad"
    assert OptimizerSpec(" FTRL ").name == "ftrl"
    with pytest.raises(
        ValueError,
        match=r"unknown optimizer 'AdaDelta'; valid names: SGD, "
        r"Momentum, Adam, AdaGrad, RMSProp, FTRL",
    ):
        OptimizerSpec("AdaDelta")


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"l1": -1.0}, r"l1=-1.0 must be >= 0"),
        ({"momentum": 1.0}, r"momentum=1.0 must be in \[0, 1\)"),
        ({"beta2": -0.1}, r"beta2=-0.1 must be in \[0, 1\)"),
        ({"eps": 0.0}, r"eps=0.0 must be > 0"),
        ({"l2": float("nan")}, r"l2=nan is not a finite number"),
    ],
)
def test_optimizer_bad_hyperparameters(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        OptimizerSpec("sgd", **kwargs)


def test_from_conf_reads_angel_keys():
    conf = load_config(
        None,
        [
            "ml.embedding.optimizer=adam",
            "ml.opt.adam.beta=0.8",
            "ml.opt.adam.gamma=0.95",
            "ml.reg.l2=0.01",
            "ml.opt.momentum.momentum=0.5",
        ],
        KEYS,
    )
    spec = OptimizerSpec.from_conf(conf, "ml.embedding.optimizer")
    assert spec == OptimizerSpec("adam", beta1=0.8, beta2=0.95, l2=0.01, momentum=0.5)
    # Angel's default for every layer is Momentum with m = 0.9.
    default = OptimizerSpec.from_conf(load_config(None, [], KEYS), "ml.fclayer.optimizer")
    assert default == OptimizerSpec("momentum", momentum=0.9)
    # A plain dict works too; absent keys take Angel's defaults.
    assert OptimizerSpec.from_conf(
        {"ml.inputlayer.optimizer": "FTRL"}, "ml.inputlayer.optimizer"
    ) == (OptimizerSpec("ftrl", ftrl_alpha=0.1, ftrl_beta=1.0))


def test_conf_rejects_unknown_optimizer_name():
    with pytest.raises(ValueError, match=r"ml\.embedding\.optimizer"):
        load_config(None, ["ml.embedding.optimizer=AdaDelta"], KEYS)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"rows": 0}, r"table 't': a dense table needs rows >= 1, got 0"),
        ({"rows": -1}, r"a dense table needs rows >= 1, got -1"),
        ({"rows": 0, "sparse": True}, r"rows=0 must be -1 \(any key\) or >= 1"),
        ({"rows": 3, "cols": 0}, r"cols=0 must be an integer >= 1"),
        ({"rows": 3, "dtype": "int32"}, r"dtype='int32' is not one of float32, float64"),
        ({"rows": 3, "init": "xavier"}, r"init='xavier' is not one of zeros, normal"),
        ({"rows": 3, "init_std": -1.0}, r"init_std=-1.0 must be a finite number >= 0"),
    ],
)
def test_table_spec_validation(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        TableSpec("t", **kwargs)


def test_table_spec_roundtrips_through_dict():
    spec = TableSpec(
        "emb",
        rows=-1,
        cols=8,
        sparse=True,
        init="uniform",
        init_std=0.01,
        seed=7,
        optimizer=OptimizerSpec("adam", l2=0.1),
    )
    assert TableSpec.from_dict(spec.to_dict()) == spec


def test_init_is_a_pure_function_of_seed_and_key():
    spec = TableSpec("t", rows=-1, cols=4, sparse=True, init="normal", init_std=0.5, seed=3)
    keys = np.array([0, 1, -5, 2**62, 123456789], dtype=np.int64)
    a = init_rows(spec, keys)
    b = init_rows(spec, keys[::-1])[::-1]
    np.testing.assert_array_equal(a, b)
    # Each row alone gives the same values as in a batch.
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(init_rows(spec, np.array([k]))[0], a[i])
    # Another seed gives other values.
    other = init_rows(
        TableSpec("t", rows=-1, cols=4, sparse=True, init="normal", init_std=0.5, seed=4), keys
    )
    assert not np.allclose(a, other)
    assert a.dtype == np.float32 and a.shape == (5, 4)


def test_init_pinned_values():
    # Pinned so that a change to the hash (which would change every model's start) is noticed.
    spec = TableSpec("t", rows=10, cols=2, init="uniform", init_std=1.0, seed=0)
    v = init_rows(spec, np.array([0, 1]))
    np.testing.assert_allclose(
        v, [[0.766621589660, -0.136944010854], [0.499496489763, -0.255213141441]], rtol=1e-6
    )


@pytest.mark.parametrize(
    ("init", "std"), [("normal", 0.1), ("uniform", 0.3), ("constant", 0.25), ("zeros", 0.0)]
)
def test_init_distributions(init, std):
    spec = TableSpec(
        "t", rows=-1, cols=10, sparse=True, init=init, init_std=std, seed=1, dtype="float64"
    )
    v = init_rows(spec, np.arange(20000))
    if init == "normal":
        assert abs(v.mean()) < 0.002 and v.std() == pytest.approx(0.1, rel=0.01)
    elif init == "uniform":
        assert v.min() >= -0.3 and v.max() < 0.3
        assert v.std() == pytest.approx(0.3 / np.sqrt(3), rel=0.01)
    elif init == "constant":
        assert (v == 0.25).all()
    else:
        assert (v == 0).all()
