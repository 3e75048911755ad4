"""The package face and the typed options (angelps.options)."""

from __future__ import annotations

import pickle

import pytest

import angelps
from angelconf.config import load_config
from angelps.options import KEYS, ClientOptions, PSOptions, ShardOptions
from angelps.table import OptimizerSpec


def test_public_face():
    from angelps import OptimizerSpec, ParameterShard, PSClient, TableSpec, load_config

    assert PSClient.__module__ == "angelps.client.ps_client"
    assert ParameterShard.__module__ == "angelps.server.shard"
    assert TableSpec.__module__ == OptimizerSpec.__module__ == "angelps.table"
    assert callable(load_config)
    for name in angelps.__all__:
        assert getattr(angelps, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        angelps.nope  # noqa: B018


def test_options_module_loads_no_numpy_torch_or_ray(heavy_after):
    assert heavy_after("import angelps.options") == []


def test_ps_options_take_declared_defaults():
    ps = PSOptions.from_config({})
    defaults = {k.name: k.default for k in KEYS}
    assert ps.job == defaults["angel.job.name"]
    assert ps.num_shards == defaults["angel.ps.number"]
    assert ps.transport == defaults["angel.ps.transport"] == "socket"
    assert ps.timeout_ms == defaults["angel.matrixtransfer.request.timeout.ms"]
    assert PSOptions.from_config(load_config(None, [], KEYS)) == ps
    # None means unset, as in a loaded Config.
    assert PSOptions.from_config({"angel.ps.number": None}) == ps


def test_ps_options_check_their_choices():
    with pytest.raises(ValueError, match=r"angel.ps.partitioner='round' is not one of hash, range"):
        PSOptions.from_config({"angel.ps.partitioner": "round"})
    with pytest.raises(ValueError, match=r"angel.ps.transport='udp' is not one of socket, ray"):
        PSOptions.from_config({"angel.ps.transport": "udp"})
    with pytest.raises(ValueError, match=r"angel.ps.number=0 must be >= 1"):
        PSOptions.from_config({"angel.ps.number": 0})
    assert PSOptions.from_config({"angel.ps.nan.policy": "SKIP"}).nan_policy == "skip"


def test_the_public_load_config_knows_the_ps_keys():
    # (it was angelconf's, which knows no key unless given them: every key was refused, and
    # with none an empty Config gave OptimizerSpec.from_conf its defaults silently)
    from angelps import load_config as public

    conf = public(None, {"ml.inputlayer.optimizer": "Adam", "angel.ps.number": 2})
    assert OptimizerSpec.from_conf(conf, "ml.inputlayer.optimizer").name == "adam"
    assert PSOptions.from_config(conf).num_shards == 2
    assert public()["angel.ps.number"] == PSOptions.from_config({}).num_shards
    with pytest.raises(ValueError) as e:
        public(None, {"ml.model.class.name": "FM", "angel.ps.numbr": 2})
    assert str(e.value) == (
        "2 unknown keys: override: ml.model.class.name; override: angel.ps.numbr (did you mean "
        "angel.ps.number?); the parameter server's keys are angelps.options.KEYS (a job's: pass "
        "keys=learners.keys.all_keys(); `angelps conf --keys` lists them)"
    )
    from learners.keys import all_keys

    job = public(None, {"ml.model.class.name": "FM"}, all_keys())
    assert job["ml.model.class.name"] == "FM" and job.is_set("ml.model.class.name")


def test_shard_and_client_options_pickle():
    shard = ShardOptions.from_config({"angel.staleness": 2}, num_workers=3, token="t")
    client = ClientOptions(shard, transport="socket", data_host="127.0.0.1")
    assert pickle.loads(pickle.dumps(client)) == client
    assert shard.staleness == 2 and shard.num_workers == 3 and shard.timeout_s == 120.0


def test_optimizer_spec_reads_the_declared_keys():
    assert OptimizerSpec.from_conf({}, "ml.embedding.optimizer") == OptimizerSpec("momentum")
    with pytest.raises(ValueError, match=r"'ml.nope.optimizer' is not one of"):
        OptimizerSpec.from_conf({}, "ml.nope.optimizer")


def test_swap_threads_are_checked_and_reach_the_shard():
    """angel.ps.swap.threads: an integer >= 0 (0: from the node's cores), in the words of the
    key, from a job file's string as from a direct construction; the shard's options carry it."""
    assert PSOptions.from_config({}).swap_threads == 0
    assert ShardOptions.from_config({"angel.ps.swap.threads": "3"}).swap_threads == 3
    bad = r"angel.ps.swap.threads=-1 is not valid: expected an integer >= 0 \(0: from the node's"
    with pytest.raises(ValueError, match=bad):
        PSOptions.from_config({"angel.ps.swap.threads": -1})
    with pytest.raises(ValueError, match=bad):
        ShardOptions.from_config({}).__class__(
            **{**ShardOptions.from_config({}).__dict__, "swap_threads": -1}
        )
    with pytest.raises(ValueError, match=r"angel\.ps\.swap\.threads"):
        load_config(None, ["angel.ps.swap.threads=many"], KEYS)
