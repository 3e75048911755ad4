"""Checkpoints: Parquet + JSON manifest, bit-identical restore into any shard count, atomic
writes, layout mismatch refused, no pickle."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from angelps import checkpoint
from angelps.checkpoint import CheckpointError
from angelps.partition import Partitioner
from angelps.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec

EMB = TableSpec(
    "emb",
    rows=-1,
    cols=3,
    sparse=True,
    init="normal",
    init_std=0.1,
    seed=1,
    optimizer=OptimizerSpec("adam"),
)
LIN = TableSpec(
    "lin",
    rows=23,
    cols=1,
    init="uniform",
    init_std=0.5,
    optimizer=OptimizerSpec("momentum"),
    dtype="float64",
)
FT = TableSpec("ft", rows=1000, cols=2, sparse=True, optimizer=OptimizerSpec("ftrl", l1=0.1))
TABLES = [EMB, LIN, FT]


def _trained(n, partitioner="hash", steps=5):
    shards = [ParameterShard(i, n, TABLES, partitioner=partitioner) for i in range(n)]
    parts = {t.name: Partitioner(t, n, partitioner) for t in TABLES}
    rng = np.random.default_rng(3)
    for step in range(steps):
        upd = {
            "emb": (rng.integers(-500, 500, 60), rng.standard_normal((60, 3))),
            "lin": (rng.integers(0, 23, 10), rng.standard_normal((10, 1))),
            "ft": (rng.integers(0, 1000, 30), rng.standard_normal((30, 2))),
        }
        for s in range(n):
            mine = {}
            for name, (k, g) in upd.items():
                m = parts[name].owns(s, k)
                mine[name] = (k[m], g[m])
            shards[s].push(0, step, mine, 0.05)
    return shards


def _union(shards):
    out = {}
    for t in TABLES:
        parts = [s.export(t.name) for s in shards]
        keys = np.concatenate([p[0] for p in parts])
        order = np.argsort(keys)
        out[t.name] = (
            keys[order],
            np.concatenate([p[1] for p in parts])[order],
            {k: np.concatenate([p[2][k] for p in parts])[order] for k in parts[0][2]},
        )
    return out


def _save(shards, path, partitioner="hash", extra=None):
    tmp = checkpoint.new_tmp_dir(str(path))
    infos = [s.save(tmp) for s in shards]
    m = checkpoint.build_manifest(TABLES, len(shards), partitioner, infos, extra)
    checkpoint.write_manifest(tmp, m)
    checkpoint.commit_dir(tmp, str(path))


def _load(n, path, partitioner="hash", tables=TABLES):
    m = checkpoint.read_manifest(str(path))
    checkpoint.check_layout(m, tables)
    shards = [ParameterShard(i, n, tables, partitioner=partitioner) for i in range(n)]
    for s in shards:
        s.load(m["root"], m)
    return shards, m


def _assert_same(a, b):
    for name in a:
        np.testing.assert_array_equal(a[name][0], b[name][0])
        assert a[name][1].dtype == b[name][1].dtype
        np.testing.assert_array_equal(a[name][1], b[name][1])  # bit-identical
        for k in a[name][2]:
            np.testing.assert_array_equal(a[name][2][k], b[name][2][k])


@pytest.mark.parametrize(
    ("n_save", "n_load", "part_load"),
    [(2, 2, "hash"), (2, 3, "hash"), (3, 1, "hash"), (2, 2, "range")],
)
def test_restore_is_bit_identical_into_any_shard_count(tmp_path, n_save, n_load, part_load):
    shards = _trained(n_save)
    _save(shards, tmp_path / "ck", extra={"scheduler": {"count": 5}, "epoch": 1})
    restored, m = _load(n_load, tmp_path / "ck", part_load)
    _assert_same(_union(shards), _union(restored))
    assert m["extra"] == {"scheduler": {"count": 5}, "epoch": 1}
    # Each restored row sits on the shard the new layout routes it to.
    for t in TABLES:
        part = Partitioner(t, n_load, part_load)
        for s in restored:
            assert part.owns(s.shard_id, s.export(t.name)[0]).all()
    # And training continues identically: one more step on both layouts.
    k = np.array([-7, 3, 400])
    g = np.ones((3, 3))
    ref = ParameterShard(0, 1, TABLES)
    ref.load(m["root"], m)
    ref.push(0, 0, {"emb": (k, g)}, 0.1)
    p = Partitioner(EMB, n_load, part_load)
    for s in restored:
        mine = p.owns(s.shard_id, k)
        s.push(0, 0, {"emb": (k[mine], g[mine])}, 0.1)
    got = np.concatenate([s.pull({"emb": k[p.owns(s.shard_id, k)]})["emb"] for s in restored])
    order = np.concatenate([np.flatnonzero(p.owns(s.shard_id, k)) for s in restored])
    np.testing.assert_array_equal(got[np.argsort(order)], ref.pull({"emb": k})["emb"])


def test_files_are_parquet_and_json_only(tmp_path):
    _save(_trained(2), tmp_path / "ck")
    names = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path / "ck")
        for d, _, fs in os.walk(tmp_path / "ck")
        for f in fs
    )
    assert names == [
        "emb/shard-0.parquet",
        "emb/shard-1.parquet",
        "ft/shard-0.parquet",
        "ft/shard-1.parquet",
        "lin/shard-0.parquet",
        "lin/shard-1.parquet",
        "manifest.json",
    ]
    m = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert m["format"] == "angelps-checkpoint" and m["num_shards"] == 2
    assert [t["name"] for t in m["tables"]] == ["emb", "lin", "ft"]
    for f in names:
        head = (tmp_path / "ck" / f).read_bytes()[:4]
        assert head in (b"PAR1", b'{\n "') or f.endswith(".json")
        assert b"\x80\x04\x95" not in (tmp_path / "ck" / f).read_bytes()  # no pickle stream


@pytest.mark.parametrize(
    ("table", "msg"),
    [
        (
            TableSpec("emb", rows=-1, cols=4, sparse=True, optimizer=OptimizerSpec("adam")),
            r"table 'emb' has cols=3 in the checkpoint but 4 here",
        ),
        (
            TableSpec("emb", rows=-1, cols=3, sparse=True, optimizer=OptimizerSpec("sgd")),
            r"table 'emb' has optimizer 'adam' in the checkpoint but 'sgd' here",
        ),
        (
            TableSpec("emb", rows=100, cols=3, sparse=False, optimizer=OptimizerSpec("adam")),
            r"table 'emb' has sparse=True in the checkpoint but False here",
        ),
    ],
)
def test_other_layout_is_refused(tmp_path, table, msg):
    _save(_trained(1), tmp_path / "ck")
    with pytest.raises(CheckpointError, match=msg):
        _load(1, tmp_path / "ck", tables=[table, LIN, FT])


def test_missing_table_is_refused(tmp_path):
    _save(_trained(1), tmp_path / "ck")
    with pytest.raises(
        CheckpointError,
        match=r"tables \['ft'\] are only in the checkpoint, "
        r"\['bias'\] only in this job",
    ):
        _load(1, tmp_path / "ck", tables=[EMB, LIN, TableSpec("bias", rows=1)])


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        checkpoint.read_manifest(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"is not a checkpoint: it has no manifest\.json"):
        checkpoint.read_manifest(str(tmp_path / "empty"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text('{"format": "x"}')
    with pytest.raises(CheckpointError, match=r"is not an angelps checkpoint \(format 'x'\)"):
        checkpoint.read_manifest(str(tmp_path / "other"))


def test_non_json_extra_refused_before_writing(tmp_path):
    with pytest.raises(CheckpointError, match="extra must be a JSON-safe dict"):
        checkpoint.build_manifest(TABLES, 1, "hash", [], {"x": object()})
    with pytest.raises(CheckpointError, match="extra must be a JSON-safe dict"):
        checkpoint.build_manifest(TABLES, 1, "hash", [], {"x": float("nan")})


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    first = _trained(2, steps=2)
    _save(first, tmp_path / "ck", extra={"v": 1})
    second = _trained(2, steps=4)

    def boom(root, manifest):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "write_manifest", boom)
    with pytest.raises(OSError, match="disk full"):
        _save(second, tmp_path / "ck", extra={"v": 2})
    monkeypatch.undo()
    restored, m = _load(2, tmp_path / "ck")
    assert m["extra"] == {"v": 1}
    _assert_same(_union(first), _union(restored))


def test_crash_between_renames_is_recovered(tmp_path):
    first = _trained(1, steps=2)
    _save(first, tmp_path / "ck", extra={"v": 1})
    # Simulate a crash after the old checkpoint was moved aside, before the new one landed.
    os.rename(tmp_path / "ck", tmp_path / "ck.old-123")
    restored, m = _load(1, tmp_path / "ck")
    assert m["extra"] == {"v": 1} and m["root"].endswith("ck.old-123")
    _assert_same(_union(first), _union(restored))
    # The next save cleans the leftovers.
    _save(first, tmp_path / "ck", extra={"v": 3})
    assert sorted(os.listdir(tmp_path)) == ["ck"]
