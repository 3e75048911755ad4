"""Placement keys: custom resources, the strategy, bundles and the pre-launch check (no Ray)."""

from __future__ import annotations

import pytest

from angelconf.config import ConfigError, load_config
from angelps import PSOptions
from learners.job.cluster import bundles, job_asks, shortfalls
from learners.job.loop_options import TrainPlan, parse_resources
from learners.job.placement import Layout, Placement
from learners.keys import all_keys


def _conf(*sets: str):  # type: ignore[no-untyped-def]
    return load_config(None, list(sets), all_keys())


def test_parse_resources() -> None:
    assert parse_resources("") == {}
    assert parse_resources(None) == {}
    assert parse_resources("ps:1") == {"ps": 1.0}
    assert parse_resources(" ps : 2 , ssd:0.5 ,") == {"ps": 2.0, "ssd": 0.5}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("ps", "'ps' is not NAME:AMOUNT"),
        (":1", "':1' is not NAME:AMOUNT"),
        ("ps:x", "ps: 'x' is not a number"),
        ("ps:0", "ps: the amount must be a number > 0"),
        ("ps:-1", "ps: the amount must be a number > 0"),
        ("ps:nan", "ps: the amount must be a number > 0"),
        ("ps:1,ps:2", "ps is named twice"),
        ("CPU:2", "CPU has a key of its own (angel.*.cpus, .gpus, angel.ps.memory)"),
    ],
)
def test_bad_resources_are_one_clear_config_error(value: str, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        _conf(f"angel.ps.resources={value}")
    assert str(e.value) == (
        f"command line: angel.ps.resources={value} is not valid: expected Ray custom "
        "resources as NAME:AMOUNT pairs separated by commas, such as ps:1 (named by "
        f"`ray start --resources`); {why}"
    )


def test_bad_strategy() -> None:
    with pytest.raises(
        ConfigError,
        match=r"angel.placement.strategy=packed is not valid: "
        r"expected one of none, pack, spread",
    ):
        _conf("angel.placement.strategy=packed")


def test_placement_from_config() -> None:
    p = Placement.from_config(
        _conf(
            "angel.ps.resources=ps:1",
            "angel.worker.resources=worker:1,ssd:0.5",
            "angel.placement.strategy=SPREAD",
        )
    )
    assert p == Placement({"ps": 1.0}, {"worker": 1.0, "ssd": 0.5}, "spread")
    assert Placement.from_config(_conf()) == Placement({}, {}, "none")


def test_layout_options_without_a_group() -> None:
    layout = Layout(Placement({"ps": 1.0}, {}, "none"), None, num_workers=2)
    assert layout.worker(0) == {}
    assert layout.shard(1) == {"resources": {"ps": 1.0}}


def test_custom_resource_no_node_has_is_named() -> None:
    conf = _conf(
        "angel.ps.resources=ps:1",
        "angel.worker.resources=worker:2",
        "angel.ps.number=2",
        "angel.workergroup.number=2",
    )
    asks = job_asks(
        TrainPlan.from_config(conf), PSOptions.from_config(conf), Placement.from_config(conf)
    )
    nodes = [{"CPU": 2.0, "memory": 1024.0, "worker": 3.0}, {"CPU": 1.0, "worker": 1.0}]
    assert shortfalls(asks, nodes) == [
        "angel.ps.resources=ps:1 with 2 shard(s) needs 2 of resource 'ps' but the Ray cluster has 0"
    ]
    nodes[0]["ps"] = 2.0
    assert shortfalls(asks, nodes) == []
    nodes[0]["worker"] = 1.0
    assert shortfalls(asks, nodes) == [
        "angel.worker.resources=worker:2 with 2 worker(s) needs 4 of resource 'worker' but "
        "the Ray cluster has 2"
    ]
    # enough in total, but no single node holds one worker's share
    nodes[:] = [
        {"CPU": 2.0, "ps": 2.0, "worker": 1.5},
        {"CPU": 1.0, "worker": 1.5},
        {"worker": 1.5},
    ]
    assert shortfalls(asks, nodes) == [
        "angel.worker.resources=worker:2: no node of the Ray cluster has 2 of resource "
        "'worker' for one worker (the largest has 1.5)"
    ]


def test_bundles_one_per_actor_workers_first() -> None:
    conf = _conf(
        "angel.ps.resources=ps:1",
        "angel.ps.memory=64",
        "angel.workergroup.number=2",
        "angel.worker.cpus=1",
    )
    asks = job_asks(
        TrainPlan.from_config(conf), PSOptions.from_config(conf), Placement.from_config(conf)
    )
    assert bundles(asks) == [
        {"CPU": 1.0},
        {"CPU": 1.0},
        {"memory": 64.0 * 2**20, "ps": 1.0},
    ]
    plain = _conf()
    asks = job_asks(TrainPlan.from_config(plain), PSOptions.from_config(plain))
    assert bundles(asks) == [{"CPU": 1.0}, {"CPU": 0.01}]  # a shard asking nothing
