"""The data keys and DataOptions."""

from __future__ import annotations

import pytest

from angelconf.config import ConfigError
from learners.data.options import KEYS, DataOptions, split_period
from tests.learners.data_helpers import C, conf


def test_keys_check_values() -> None:
    with pytest.raises(
        ConfigError, match=r"ml.data.validate.ratio=1.5 is not valid: expected a number in \[0, 1\)"
    ):
        C(**{"ml.data.validate.ratio": "1.5"})
    with pytest.raises(ConfigError, match=r"ml.data.splitor=s\+ is not valid: .*write \\\\s\+"):
        C(**{"ml.data.splitor": "s+"})
    with pytest.raises(
        ConfigError,
        match=r"ml\.data\.type=csv is not valid: expected one of libsvm, dummy, dense, parquet",
    ):
        C(**{"ml.data.type": "csv"})
    with pytest.raises(ConfigError, match=r"ml\.feature\.index\.range=0 is not valid"):
        C(**{"ml.feature.index.range": "0"})
    assert (
        conf(**{"ml.data.label.trans.class": "posnegtrans"})["ml.data.label.trans.class"]
        == "PosNegTrans"
    )


def test_options_from_a_partial_mapping_take_the_declared_defaults() -> None:
    opts = DataOptions.from_config({"ml.data.type": "Dummy", "ml.data.chunk.rows": None})
    defaults = {k.name: k.default for k in KEYS}
    assert opts.kind == "dummy" and opts.chunk_rows == defaults["ml.data.chunk.rows"]
    assert opts == C(**{"ml.data.type": "dummy"})
    assert split_period(opts) == 20 and opts.holds_out_validation
    assert not DataOptions.from_config({"angel.validate.data.path": "v"}).holds_out_validation
    assert split_period(DataOptions(validate_ratio=0.0)) == 1


@pytest.mark.parametrize(
    ("kv", "message"),
    [
        ({"ml.data.type": "csv"}, "ml.data.type=csv is not valid: expected one of libsvm"),
        ({"ml.data.validate.ratio": 1.0}, r"ml.data.validate.ratio=1.0 is not valid"),
        ({"ml.data.splitor": "s+"}, r"ml.data.splitor=s\+ is not valid"),
        ({"ml.data.label.trans.class": "Flip"}, "expected one of NoTrans, PosNegTrans"),
        ({"ml.data.chunk.rows": 0}, r"ml.data.chunk.rows=0 is not valid: expected an integer >= 1"),
    ],
)
def test_options_from_a_plain_mapping_are_checked(kv: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataOptions.from_config(kv)


def test_options_module_imports_neither_numpy_nor_pyarrow(heavy_after) -> None:
    assert heavy_after("import learners.data.options") == []
