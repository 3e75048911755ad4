"""Checkpoints: Parquet + JSON manifest, bit-identical restore into any shard count, atomic
writes, layout mismatch refused, no pickle."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from angelps.checkpoint import backups
from angelps.checkpoint import files as checkpoint
from angelps.checkpoint.files import CheckpointError
from angelps.partition import Partitioner
from angelps.server.shard import ParameterShard
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
    old = str(tmp_path / "ck.old-123")
    # A reader is told where the older checkpoint is, never handed it silently.
    with pytest.raises(checkpoint.NoCheckpoint, match=f"an older checkpoint is at {old}: pass"):
        _load(1, tmp_path / "ck")
    assert checkpoint.resolve(str(tmp_path / "ck"), fallback=True) == old  # --resume's way
    restored, m = _load(1, old)
    assert m["extra"] == {"v": 1} and m["root"] == old
    _assert_same(_union(first), _union(restored))
    # The next save cleans the leftovers.
    _save(first, tmp_path / "ck", extra={"v": 3})
    assert sorted(os.listdir(tmp_path)) == ["ck"]


# --- integrity: checksums in the manifest, verified on every read -------------------------------


def _flip(path, offset=None):
    """Flip one byte of ``path`` (in the middle of the file unless ``offset``)."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def test_manifest_records_every_file_checksum_and_rows(tmp_path):
    import hashlib

    shards = _trained(2)
    _save(shards, tmp_path / "ck")
    m = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert m["version"] == 2 and len(m["manifest_sha256"]) == 64
    assert sorted(m["files"]) == [
        f"{t}/shard-{i}.parquet" for t in ("emb", "ft", "lin") for i in (0, 1)
    ]
    for rel, entry in m["files"].items():
        data = (tmp_path / "ck" / rel).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["bytes"] == len(data)
        table, shard = rel.split("/")
        assert entry["rows"] == shards[int(shard[6])].export(table)[0].size
    assert "files" not in m["shards"][0]


def test_flipped_byte_in_a_table_file_is_refused_naming_it(tmp_path):
    _save(_trained(2), tmp_path / "ck")
    bad = tmp_path / "ck" / "emb" / "shard-1.parquet"
    _flip(bad)
    with pytest.raises(
        checkpoint.CheckpointDamaged,
        match=rf"^checkpoint file {bad} is damaged: its SHA-256 does not match the manifest$",
    ):
        _load(2, tmp_path / "ck")
    with pytest.raises(checkpoint.CheckpointDamaged, match=f"checkpoint file {bad} is damaged"):
        checkpoint.verify(str(tmp_path / "ck"))
    # A damaged checkpoint is a ConfigError: the command line answers it with exit code 2.
    from angelconf.config import ConfigError

    assert issubclass(checkpoint.CheckpointDamaged, ConfigError)


def test_page_checksums_catch_damage_without_the_manifest(tmp_path):
    """Even read unchecked (a version 1 reader), a flipped data byte fails the page CRC."""
    _save(_trained(1), tmp_path / "ck")
    path = tmp_path / "ck" / "emb" / "shard-0.parquet"
    keys, w, _ = checkpoint.read_table_file(str(path))
    _flip(path, 200)  # inside the first column's data page
    with pytest.raises(
        checkpoint.CheckpointDamaged, match=rf"checkpoint file {path} is damaged or unreadable: "
    ):
        checkpoint.read_table_file(str(path))
    assert len(keys) == len(w) > 0


def test_row_count_and_missing_file_are_refused(tmp_path):
    _save(_trained(1), tmp_path / "ck")
    m = checkpoint.read_manifest(str(tmp_path / "ck"))
    path = checkpoint.table_file(m["root"], "ft", 0)
    entry = dict(checkpoint.file_entry(m, "ft", 0), rows=7)
    with pytest.raises(
        checkpoint.CheckpointDamaged, match=r"is damaged: \d+ rows, the manifest says 7"
    ):
        checkpoint.read_table_file(path, entry)
    os.remove(path)
    with pytest.raises(checkpoint.CheckpointDamaged, match=rf"^checkpoint file {path} is missing$"):
        _load(1, tmp_path / "ck")


def test_damaged_manifest_is_refused(tmp_path):
    _save(_trained(1), tmp_path / "ck", extra={"epoch": 3})
    p = tmp_path / "ck" / "manifest.json"
    p.write_text(p.read_text().replace('"epoch": 3', '"epoch": 8'))
    with pytest.raises(
        checkpoint.CheckpointDamaged,
        match=rf"^checkpoint file {p} is damaged: its checksum does not match$",
    ):
        checkpoint.read_manifest(str(tmp_path / "ck"))
    p.write_text(p.read_text()[:-40])
    with pytest.raises(
        checkpoint.CheckpointDamaged, match=rf"checkpoint file {p} is damaged or unreadable"
    ):
        checkpoint.read_manifest(str(tmp_path / "ck"))


def test_version_1_checkpoint_without_checksums_still_loads(tmp_path):
    shards = _trained(2)
    _save(shards, tmp_path / "ck", extra={"v": 1})
    p = tmp_path / "ck" / "manifest.json"
    m = json.loads(p.read_text())
    for k in ("files", "manifest_sha256"):
        del m[k]
    m["version"] = 1
    p.write_text(json.dumps(m, indent=1, sort_keys=True))
    restored, m2 = _load(3, tmp_path / "ck")
    assert m2["version"] == 1 and m2["extra"] == {"v": 1}
    _assert_same(_union(shards), _union(restored))


def test_backup_files_are_checked_on_restore(tmp_path):
    shard = _trained(1)[0]
    backups.write_backup(str(tmp_path / "b"), shard, shard.backup_meta())
    root, meta = backups.read_backup(str(tmp_path / "b"))
    fresh = ParameterShard(0, 1, TABLES)
    fresh.load(root, meta)
    _assert_same(_union([shard]), _union([fresh]))
    _flip(tmp_path / "b" / os.path.basename(root) / "lin" / "shard-0.parquet")
    with pytest.raises(checkpoint.CheckpointDamaged, match=r"lin/shard-0\.parquet is damaged"):
        fresh.load(root, meta)


# --- the save path and the previous checkpoint -------------------------------------------------


def _tree(root):
    """Every file under ``root`` with its bytes."""
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _, fs in os.walk(root)
        for f in fs
    }


def test_previous_checkpoint_is_kept_as_prev(tmp_path):
    first, second, third = _trained(1, steps=1), _trained(1, steps=2), _trained(1, steps=3)
    _save(first, tmp_path / "ck", extra={"v": 1})
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    _save(second, tmp_path / "ck", extra={"v": 2})
    assert sorted(os.listdir(tmp_path)) == ["ck", "ck.prev"]
    assert checkpoint.previous(str(tmp_path / "ck")) == str(tmp_path / "ck.prev")
    _save(third, tmp_path / "ck", extra={"v": 3})
    assert sorted(os.listdir(tmp_path)) == ["ck", "ck.prev"]
    assert _load(1, tmp_path / "ck")[1]["extra"] == {"v": 3}
    restored, m = _load(1, tmp_path / "ck.prev")
    assert m["extra"] == {"v": 2}
    _assert_same(_union(second), _union(restored))


@pytest.mark.parametrize("stop", ["files", "manifest", "first-rename", "second-rename"])
def test_crash_at_any_point_of_a_save_keeps_a_loadable_checkpoint(tmp_path, stop):
    """A save stopped after each of its steps (the functions called in order, then nothing):
    the last good checkpoint still loads, and the next save removes the leftovers."""
    first, second = _trained(2, steps=2), _trained(2, steps=4)
    _save(first, tmp_path / "ck", extra={"v": 1})
    path = str(tmp_path / "ck")
    tmp = checkpoint.new_tmp_dir(path)
    infos = [s.save(tmp) for s in second]
    if stop != "files":
        checkpoint.write_manifest(
            tmp, checkpoint.build_manifest(TABLES, 2, "hash", infos, {"v": 2})
        )
    if stop in ("first-rename", "second-rename"):
        os.rename(path, path + ".prev")  # commit_dir's renames, one at a time
    if stop == "second-rename":
        os.rename(tmp, path)
    if stop == "first-rename":  # only --resume falls back to <path>.prev (and says so)
        with pytest.raises(checkpoint.NoCheckpoint, match=r"no checkpoint at .*ck; an older"):
            _load(2, tmp_path / "ck")
    last = tmp_path / ("ck.prev" if stop == "first-rename" else "ck")
    restored, m = _load(2, last)
    want, v = (second, 2) if stop == "second-rename" else (first, 1)
    assert m["extra"] == {"v": v}
    _assert_same(_union(want), _union(restored))
    _save(second, tmp_path / "ck", extra={"v": 3})
    assert sorted(os.listdir(tmp_path)) == ["ck", "ck.prev"]
    assert _load(2, tmp_path / "ck")[1]["extra"] == {"v": 3}
    assert _load(2, tmp_path / "ck.prev")[1]["extra"] == {"v": 1 if stop == "files" else v}


@pytest.mark.parametrize("kind", ["file", "user-dir"])
def test_save_refuses_a_file_or_a_directory_of_other_files(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "file":
        target.write_bytes(b"precious\x00bytes")
        msg = rf"^{target} is a file, not a checkpoint directory: angelps will not replace it"
    else:
        (target / "sub").mkdir(parents=True)
        (target / "notes.txt").write_text("mine")
        (target / "sub" / "data.bin").write_bytes(b"\x01\x02")
        msg = (
            rf"^{target} is a non-empty directory without an angelps checkpoint \(manifest\.json\)"
        )
    before = _tree(tmp_path)
    with pytest.raises(CheckpointError, match=msg):
        _save(_trained(1), target)
    assert _tree(tmp_path) == before  # nothing written, nothing renamed, byte for byte
    assert sorted(os.listdir(tmp_path)) == ["out"]
    # commit_dir refuses too, should the path change during a save.
    tmp = checkpoint.new_tmp_dir(str(tmp_path / "ok"))
    with pytest.raises(CheckpointError, match=msg):
        checkpoint.commit_dir(tmp, str(target))
    assert (_tree(tmp_path / "out") if kind != "file" else target.read_bytes()) == (
        {k[4:]: v for k, v in before.items()} if kind != "file" else before["out"]
    )


def test_save_into_an_empty_directory(tmp_path):
    (tmp_path / "ck").mkdir()
    _save(_trained(1), tmp_path / "ck", extra={"v": 1})
    assert _load(1, tmp_path / "ck")[1]["extra"] == {"v": 1}
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_table_files_keep_dictionaries_for_repeated_values_and_none_for_keys(tmp_path) -> None:
    """Keys are unique: no dictionary is tried on them. Values that repeat (rows barely
    trained) are written with one; distinct values give it up early, written plain."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 50_000
    keys = np.sort(rng.choice(2**62, n, replace=False)).astype(np.int64)
    few = rng.choice(np.float32([0.0, 0.001, -0.002]), (n, 1))
    distinct = rng.standard_normal((n, 1)).astype(np.float32)
    for name, w in (("few", few), ("distinct", distinct)):
        path = str(tmp_path / f"{name}.parquet")
        entry = checkpoint.write_table_chunks(path, [(keys, w, {"momentum": w * 0.5})])
        assert entry["rows"] == n
        meta = pq.ParquetFile(path).metadata.row_group(0)
        encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(3)}
        assert set(encodings) == {"key", "w.list.element", "state.momentum.list.element"}
        assert "RLE_DICTIONARY" not in encodings["key"]
        for i, col in ((1, "w.list.element"), (2, "state.momentum.list.element")):
            assert "RLE_DICTIONARY" in encodings[col]
            c = meta.column(i)
            dictionary_bytes = c.data_page_offset - c.dictionary_page_offset
            if name == "few":  # three values
                assert dictionary_bytes < 100, dictionary_bytes
            else:  # 16k values at most (64 KiB), then plain: Parquet's default took 256k
                assert "PLAIN" in encodings[col]
                assert 60_000 < dictionary_bytes < 70_000, dictionary_bytes
        got = list(checkpoint.iter_table_file(path, entry))
        np.testing.assert_array_equal(np.concatenate([k for k, _, _ in got]), keys)
        np.testing.assert_array_equal(np.concatenate([v for _, v, _ in got]), w)
