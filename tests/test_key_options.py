"""Option objects filled from their keys (angelconf/options.py) and the job's options built once
(learners/job/job_options.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from angelconf.config import ConfigError, Key, at_least, load_config
from angelconf.options import check_keys, key_field, keyed, keyed_fields, read_keys
from angelps.options import PSOptions
from learners.data.options import DataOptions
from learners.job.action import JobAction
from learners.job.job_options import JobOptions
from learners.job.loop_options import TrainPlan
from learners.job.placement import Placement
from learners.job.sparse_keys import SparseOptions
from learners.keys import all_keys
from learners.models.config import ModelConfig
from learners.worker.feed import FeedOptions

SIZE = Key("t.size", "int", 4, "A size.", check=at_least(1, "an integer"))
KIND = Key("t.kind", "str", "fast", "A kind.", choices=("fast", "slow"))
NAMES = Key("t.names", "str_list", None, "Names.")
TAGS = Key("t.tags", "str", "a:1", "Tags.")


def _tags(text: str) -> dict[str, str]:
    return dict(item.split(":") for item in text.split(",") if item)


@dataclass(frozen=True)
class _Options:
    size: int = field(metadata=keyed(SIZE))
    names: tuple[str, ...] | None = field(
        metadata=keyed(NAMES, lambda v: None if v is None else tuple(v))
    )
    kind: str = key_field(KIND)
    tags: Mapping[str, str] = key_field(TAGS, convert=_tags)

    def __post_init__(self) -> None:
        check_keys(self)


def test_read_keys_takes_defaults_converts_and_checks_with_the_keys_words() -> None:
    assert read_keys(_Options, {}) == {
        "size": 4,
        "names": None,
        "kind": "fast",
        "tags": {"a": "1"},
    }
    got = _Options(**read_keys(_Options, {"t.size": "7", "t.names": "x, y", "t.kind": "SLOW"}))
    assert (got.size, got.names, got.kind) == (7, ("x", "y"), "slow")
    with pytest.raises(ConfigError, match=r"^t\.size=0 is not valid: expected an integer >= 1$"):
        read_keys(_Options, {"t.size": 0})
    with pytest.raises(
        ConfigError, match=r"^t\.kind=warp is not valid: expected one of fast, slow"
    ):
        read_keys(_Options, {"t.kind": "warp"})
    # check=False: converted to the key's type, its check left to the object
    assert read_keys(_Options, {"t.size": "0"}, check=False)["size"] == 0
    with pytest.raises(ConfigError, match=r"^t\.size=many is not valid: expected an integer$"):
        read_keys(_Options, {"t.size": "many"}, check=False)


def test_key_field_defaults_are_the_keys_and_direct_objects_are_checked_by_the_keys() -> None:
    a, b = _Options(size=2, names=None), _Options(size=2, names=None)
    assert (a.kind, a.tags) == ("fast", {"a": "1"})
    assert a.tags is not b.tags  # a mutable default is one per object
    assert _Options(size=2, names=None, kind="Slow").kind == "slow"  # the key's spelling
    with pytest.raises(ConfigError, match=r"^t\.size=0 is not valid: expected an integer >= 1$"):
        _Options(size=0, names=None)
    assert [(n, k) for n, k, _ in keyed_fields(_Options)] == [
        ("size", SIZE),
        ("names", NAMES),
        ("kind", KIND),
        ("tags", TAGS),
    ]


@pytest.mark.parametrize(
    "cls",
    [
        DataOptions,
        TrainPlan,
        ModelConfig,
        FeedOptions,
        SparseOptions,
        Placement,
        JobAction,
        PSOptions,
    ],
)
def test_every_keyed_field_names_a_declared_key(cls: type) -> None:
    declared = {k.name: k for k in all_keys()}
    keyed_names = [(name, key) for name, key, _ in keyed_fields(cls)]
    assert keyed_names, f"{cls.__name__} reads no key through its fields"
    for name, key in keyed_names:
        assert declared.get(key.name) is key, f"{cls.__name__}.{name}: {key.name} is not declared"


def test_a_plain_mapping_is_checked_by_the_keys_as_a_loaded_file_is() -> None:
    with pytest.raises(
        ConfigError, match=r"^ml\.epoch\.num=0 is not valid: expected a number >= 1"
    ):
        TrainPlan.from_config({**load_config(None, [], all_keys()), "ml.epoch.num": 0})
    with pytest.raises(ConfigError, match=r"^ml\.fm\.rank=0 is not valid: expected a number > 0"):
        ModelConfig.from_config({"ml.fm.rank": 0}, 10)
    cfg = ModelConfig.from_config({"ml.model.hidden.layers": "10,5"}, 10)
    assert cfg.hidden == (10, 5) and cfg.sized(20, 3).num_features == 20


def test_job_options_hold_each_section_built_once() -> None:
    conf = load_config(
        None,
        {
            "ml.data.type": "dummy",
            "ml.model.class.name": "FactorizationMachines",
            "angel.ps.number": 3,
            "angel.placement.strategy": "spread",
            "angel.worker.resources": "worker:1",
        },
        all_keys(),
    )
    options = JobOptions.from_config(conf)
    assert options.loop == TrainPlan.from_config(conf)
    assert options.data == DataOptions.from_config(conf) and options.data.kind == "dummy"
    assert options.resources.ps == PSOptions.from_config(conf)
    assert options.resources.ps.num_shards == 3
    assert options.resources.placement == Placement({}, {"worker": 1.0}, "spread")
    assert options.feed is options.loop.feed
    assert options.model is options.model  # read once, when first asked for
    assert options.model.model == "FactorizationMachines" and options.model.num_features == 0
    assert options.model.sized(100, 4) == ModelConfig.from_config(conf, 100, 4)


def test_an_unknown_model_is_reported_when_the_model_is_asked_for(tmp_path) -> None:
    conf = load_config(None, {"ml.model.class.name": "Nope"}, all_keys())
    options = JobOptions.from_config(conf)  # the keys alone are fine
    with pytest.raises(
        ConfigError, match=r"^ml\.model\.class\.name=Nope \(program\) is not a known model"
    ):
        _ = options.model
    job = tmp_path / "job.properties"  # a file's key is named by its file and line
    job.write_text("ml.epoch.num = 2\nml.model.class.name = LogisticRegresion\n")
    with pytest.raises(ConfigError) as e:
        _ = JobOptions.from_config(load_config(job, (), all_keys())).model
    assert str(e.value).startswith(
        f"ml.model.class.name=LogisticRegresion ({job}:2) is not a known model; valid names "
        "(closest first): LogisticRegression, "
    )


def test_job_options_load_neither_torch_nor_ray(heavy_after) -> None:
    code = (
        "from angelconf.config import load_config\nfrom learners.keys import all_keys\n"
        "from learners.job.job_options import JobOptions\n"
        "JobOptions.from_config(load_config(None, [], all_keys())).model"
    )
    assert heavy_after(code) == []
