"""Checkpoints on object storage (a local moto S3 server): generations committed by a pointer
written last, the previous one kept readable, stale generations removed, damage refused."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from angelps import checkpoint, checkpoint_remote, fs
from angelps.checkpoint import CheckpointDamaged, CheckpointError
from angelps.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec
from tests.object_store import make_bucket, s3_server

TABLES = [
    TableSpec("emb", rows=-1, cols=3, sparse=True, init="normal", init_std=0.1, seed=1,
              optimizer=OptimizerSpec("adam")),
    TableSpec("lin", rows=23, cols=1, optimizer=OptimizerSpec("momentum"), dtype="float64"),
]  # fmt: skip


@pytest.fixture(scope="module")
def bucket() -> Iterator[str]:
    with s3_server() as env, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        make_bucket(env, "ckpt")
        yield "s3://ckpt"


def _trained(seed: int) -> list[ParameterShard]:
    shards = [ParameterShard(i, 2, TABLES) for i in range(2)]
    rng = np.random.default_rng(seed)
    for step in range(3):
        for s in shards:
            keys = np.arange(s.shard_id, 40, 2)
            s.push(0, step, {"emb": (keys, rng.standard_normal((keys.size, 3)))}, 0.1)
    return shards


def _write(shards: list[ParameterShard], path: str, commit: bool = True) -> str:
    tmp = checkpoint.new_tmp_dir(path)
    infos = [s.save(tmp) for s in shards]
    checkpoint.write_manifest(tmp, checkpoint.build_manifest(TABLES, 2, "hash", infos))
    if commit:
        checkpoint.commit_dir(tmp, path)
    return tmp


def _rows(path: str) -> np.ndarray:
    m = checkpoint.read_manifest(path)
    shards = [ParameterShard(i, 2, TABLES) for i in range(2)]
    for s in shards:
        s.load(m["root"], m)
    return np.concatenate([s.export("emb")[1] for s in shards])


def _gens(path: str) -> list[str]:
    return [n for n, d in fs.list_dir(path) if d]


def test_save_and_load_round_trip_bit_identical(bucket: str) -> None:
    path = f"{bucket}/round"
    shards = _trained(1)
    _write(shards, path)
    want = np.concatenate([s.export("emb")[1] for s in shards])
    np.testing.assert_array_equal(_rows(path), want)
    assert checkpoint.verify(path)["root"].startswith(f"{path}/gen-")


def test_crash_before_the_pointer_keeps_the_previous_checkpoint(bucket: str) -> None:
    path = f"{bucket}/crash"
    first = _trained(1)
    _write(first, path)
    before = _rows(path)
    stale = _write(_trained(2), path, commit=False)  # every file and manifest, no pointer
    np.testing.assert_array_equal(_rows(path), before)  # still the first checkpoint
    assert checkpoint.read_manifest(path)["root"] != stale
    _write(_trained(3), path)  # the next save removes the uncommitted generation
    assert stale.rsplit("/", 1)[1] not in _gens(path)
    assert len(_gens(path)) == 2  # the latest and the previous one


def test_previous_generation_kept_older_ones_removed(bucket: str) -> None:
    path = f"{bucket}/gens"
    roots = []
    for seed in (1, 2, 3):
        _write(_trained(seed), path)
        roots.append(checkpoint.read_manifest(path)["root"])
    assert checkpoint.previous(path) == roots[1]
    assert sorted(_gens(path)) == sorted(r.rsplit("/", 1)[1] for r in roots[1:])


def test_damaged_table_file_refused_naming_it(bucket: str) -> None:
    path = f"{bucket}/damaged"
    _write(_trained(1), path)
    root = checkpoint.read_manifest(path)["root"]
    victim = f"{root}/emb/shard-1.parquet"
    data = bytearray(fs.read_bytes(victim))
    data[len(data) // 2] ^= 0xFF
    fs.write_bytes(victim, bytes(data))
    with pytest.raises(CheckpointDamaged, match=r"emb/shard-1\.parquet"):
        checkpoint.verify(path)
    with pytest.raises(CheckpointDamaged, match=r"emb/shard-1\.parquet"):
        _rows(path)


def test_set_aside_falls_back_to_the_previous_and_keeps_the_damaged(bucket: str) -> None:
    path = f"{bucket}/aside"
    _write(_trained(1), path)
    first = checkpoint.read_manifest(path)["root"]
    _write(_trained(2), path)
    damaged = checkpoint_remote.set_aside(path)
    assert checkpoint.read_manifest(path)["root"] == first
    _write(_trained(3), path)
    _write(_trained(4), path)
    assert damaged.rsplit("/", 1)[1] in _gens(path)  # never removed


def test_a_prefix_of_other_objects_or_a_file_is_refused(bucket: str) -> None:
    fs.write_bytes(f"{bucket}/other/notes.txt", b"mine")
    with pytest.raises(CheckpointError, match="without an angelps checkpoint"):
        checkpoint.new_tmp_dir(f"{bucket}/other")
    with pytest.raises(CheckpointError, match="is a file"):
        checkpoint.new_tmp_dir(f"{bucket}/other/notes.txt")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        checkpoint.read_manifest(f"{bucket}/nothing")


def test_damaged_pointer_is_refused_naming_it(bucket: str) -> None:
    path = f"{bucket}/pointer"
    _write(_trained(1), path)
    fs.write_bytes(f"{path}/LATEST.json", json.dumps({"format": "x", "current": "../x"}).encode())
    with pytest.raises(CheckpointDamaged, match=r"LATEST\.json"):
        checkpoint.read_manifest(path)
