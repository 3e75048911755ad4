"""Checkpoints on object storage (a local moto S3 server): generations committed by a pointer
written last, the previous one kept readable, stale generations removed, damage refused."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import numpy as np
import pytest
import ray

from angelps import fs
from angelps.checkpoint import backups
from angelps.checkpoint import files as checkpoint
from angelps.checkpoint import remote as checkpoint_remote
from angelps.checkpoint.files import CheckpointDamaged, CheckpointError
from angelps.server.shard import ParameterShard
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


def test_a_copy_equals_its_source_and_replaces_the_old_copy_only_when_complete(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, best = f"{bucket}/cp", f"{bucket}/cp.best"
    _write(_trained(1), path)
    first = _rows(path)
    gen = checkpoint_remote.copy_checkpoint(path, best)
    np.testing.assert_array_equal(_rows(best), first)
    src = checkpoint.read_manifest(path)["root"]
    assert fs.list_files(gen) == fs.list_files(src)  # every object, the same sizes
    assert fs.read_bytes(f"{gen}/manifest.json") == fs.read_bytes(f"{src}/manifest.json")
    checkpoint.verify(best)  # every table file against the copied manifest's SHA-256

    _write(_trained(2), path)
    copied: list[str] = []
    real = fs.copy_file

    def dies_on_the_third(a: str, b: str) -> None:
        if len(copied) == 2:
            raise OSError("connection reset")  # as a crash mid-copy would stop it
        copied.append(b)
        real(a, b)

    monkeypatch.setattr(fs, "copy_file", dies_on_the_third)
    with pytest.raises(OSError, match="connection reset"):
        checkpoint_remote.copy_checkpoint(path, best)
    assert not any(c.endswith("manifest.json") for c in copied)  # the manifest comes last
    np.testing.assert_array_equal(_rows(best), first)  # the old copy, whole
    checkpoint.verify(best)
    monkeypatch.setattr(fs, "copy_file", real)
    gen = checkpoint_remote.copy_checkpoint(path, best)
    np.testing.assert_array_equal(_rows(best), _rows(path))
    # The old copy and the partial one are gone; a copy keeps no previous generation.
    assert _gens(best) == [gen.rsplit("/", 1)[1]]
    assert checkpoint.previous(best) is None


def test_remove_takes_only_the_pointer_and_the_generations(bucket: str) -> None:
    path, kept = f"{bucket}/rm", f"{bucket}/rm.epoch-1"
    _write(_trained(1), path)
    checkpoint_remote.copy_checkpoint(path, kept)
    fs.write_bytes(f"{kept}/notes.txt", b"mine")
    fs.write_bytes(f"{kept}/sub/data.csv", b"a,b\n")
    checkpoint_remote.remove(kept)
    assert fs.list_dir(kept) == [("notes.txt", False), ("sub", True)]
    assert fs.read_bytes(f"{kept}/notes.txt") == b"mine"
    with pytest.raises(CheckpointError, match=r"it has no LATEST\.json"):
        checkpoint.read_manifest(kept)
    # A LATEST.json that angelps did not write: nothing is removed.
    fs.write_bytes(f"{bucket}/theirs/LATEST.json", b'{"current": "v1"}')
    fs.write_bytes(f"{bucket}/theirs/gen-1-ab/x", b"x")
    with pytest.raises(CheckpointDamaged, match=r"theirs/LATEST\.json is damaged"):
        checkpoint_remote.remove(f"{bucket}/theirs")
    assert fs.list_dir(f"{bucket}/theirs") == [("LATEST.json", False), ("gen-1-ab", True)]


def test_a_copy_past_the_single_request_limit_is_streamed(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = np.random.default_rng(0).bytes(3000)
    fs.write_bytes(f"{bucket}/big/a.bin", data)
    fs.copy_file(f"{bucket}/big/a.bin", f"{bucket}/big/server-side.bin")
    monkeypatch.setattr(fs, "COPY_OBJECT_MAX_BYTES", 1000)
    monkeypatch.setattr(fs, "_COPY_CHUNK", 1024)  # two whole chunks and a part
    fs.copy_file(f"{bucket}/big/a.bin", f"{bucket}/big/streamed.bin")
    assert fs.read_bytes(f"{bucket}/big/server-side.bin") == data
    assert fs.read_bytes(f"{bucket}/big/streamed.bin") == data


# --- a shard's backups on a URL (angel.ps.backup.path=s3://...) -------------------------------


def _state(shard: ParameterShard) -> dict[str, tuple[np.ndarray, ...]]:
    """Every table's keys, rows and optimizer slots, sorted by key."""
    out = {}
    for name in ("emb", "lin"):
        keys, w, state = shard.export(name)
        order = np.argsort(keys)
        out[name] = (keys[order], w[order], *(state[s][order] for s in sorted(state)))
    return out


def _same(a: ParameterShard, b: ParameterShard) -> None:
    sa, sb = _state(a), _state(b)
    for name in sa:
        assert len(sa[name]) == len(sb[name])
        for x, y in zip(sa[name], sb[name], strict=True):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)  # bit for bit


def _restored(path: str) -> ParameterShard:
    info = backups.read_backup(path)
    assert info is not None
    root, meta = info
    fresh = ParameterShard(0, 2, TABLES)
    fresh.load(root, meta)
    fresh.restore_state(meta)
    return fresh


def test_a_backup_reads_back_bit_exact_and_replaces_the_last(bucket: str) -> None:
    path = f"{bucket}/bk/job-1/shard-0"
    assert backups.read_backup(path) is None and backups.backup_version(path) is None
    shard = _trained(1)[0]
    v1 = backups.write_backup(path, shard, shard.backup_meta())
    assert re.fullmatch(r"gen-\d+-[0-9a-f]{8}", v1)
    assert backups.backup_version(path) == v1
    assert sorted(n for n, _ in fs.list_dir(path)) == ["LATEST.json", v1]
    restored = _restored(path)
    _same(restored, shard)
    assert restored.backup_meta()["clocks"] == shard.backup_meta()["clocks"]
    # A second backup replaces the first, which is removed (a restart needs the latest only).
    shard.push(0, 3, {"emb": (np.arange(0, 40, 2), np.ones((20, 3)))}, 0.1)
    v2 = backups.write_backup(path, shard, shard.backup_meta())
    assert v2 != v1 and backups.backup_version(path) == v2
    assert sorted(n for n, _ in fs.list_dir(path)) == ["LATEST.json", v2]
    pointer = json.loads(fs.read_bytes(f"{path}/LATEST.json"))
    assert (pointer["current"], pointer["previous"], pointer["kept"]) == (v2, None, [])
    _same(_restored(path), shard)


def test_a_backup_that_dies_before_its_pointer_keeps_the_last_good_one(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = f"{bucket}/bk/job-2/shard-0"
    shard = _trained(1)[0]
    good = backups.write_backup(path, shard, shard.backup_meta())
    before = _state(_restored(path))
    newer = _trained(2)[0]

    def die(*args: object, **kw: object) -> None:
        raise OSError("killed before the pointer")  # every file and the manifest are written

    monkeypatch.setattr(checkpoint_remote, "commit_dir", die)
    with pytest.raises(OSError, match="killed before the pointer"):
        backups.write_backup(path, newer, newer.backup_meta())
    monkeypatch.undo()
    names = [n for n, _ in fs.list_dir(path)]
    assert len(names) == 3  # the pointer, the good generation, the half-written one
    assert backups.backup_version(path) == good
    after = _state(_restored(path))
    for name in before:
        for x, y in zip(before[name], after[name], strict=True):
            np.testing.assert_array_equal(x, y)
    # The next backup commits and removes the half-written generation.
    last = backups.write_backup(path, newer, newer.backup_meta())
    assert sorted(n for n, _ in fs.list_dir(path)) == ["LATEST.json", last]
    _same(_restored(path), newer)


def test_a_damaged_backup_pointer_is_refused_naming_it(bucket: str) -> None:
    path = f"{bucket}/bk/job-3/shard-0"
    fs.write_bytes(
        f"{path}/LATEST.json", b'{"format": "angelps-checkpoint-pointer", "current": "../x"}'
    )
    with pytest.raises(
        CheckpointDamaged, match=rf"checkpoint file {path}/LATEST.json is damaged: not an angelps"
    ):
        backups.read_backup(path)


def test_a_shard_backs_up_to_a_prefix_of_its_own_and_shutdown_removes_only_it(
    bucket: str,
) -> None:
    from angelps.checkpoint.remote_backup import remove_launch
    from angelps.options import PSOptions
    from angelps.server.launch import shard_options
    from angelps.server.shard_server import ShardServer

    ray_before = ray.is_initialized()
    conf = {
        "angel.job.name": "s3bk",
        "angel.ps.backup.interval": 5,
        "angel.ps.backup.path": f"{bucket}/launches",
    }
    opts = shard_options(PSOptions.from_config(conf), 1)
    other = shard_options(PSOptions.from_config(conf), 1)
    assert re.fullmatch(rf"{bucket}/launches/s3bk-[0-9a-f]{{12}}", opts.backup_dir)
    assert other.backup_dir != opts.backup_dir  # a prefix per launch: never an older backup
    servers = [ShardServer(i, 2, TABLES, opts) for i in range(2)] + [
        ShardServer(0, 2, TABLES, other)
    ]
    for srv in servers:  # each wrote its first backup (clock 0) under its own prefix
        assert srv.backups.dir.startswith(f"{bucket}/launches/s3bk-")
        assert backups.backup_version(srv.backups.dir) is not None
    fs.write_bytes(f"{opts.backup_dir}/notes.txt", b"not a backup")
    remove_launch(opts.backup_dir)
    assert [n for n, _ in fs.list_dir(opts.backup_dir)] == ["notes.txt"]  # only the backups
    assert backups.backup_version(servers[2].backups.dir) is not None  # the other launch
    fs.delete_file(f"{opts.backup_dir}/notes.txt")
    remove_launch(opts.backup_dir)  # now empty: the prefix goes too
    remove_launch(other.backup_dir)
    assert fs.list_dir(f"{bucket}/launches") == []
    assert ray.is_initialized() == ray_before  # a shard used in-process starts no Ray
