"""Storage at scale: paged rows, admission (frequency filter), expiry, chunked checkpoints."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from angelconf.config import ConfigError, load_config
from angelps.checkpoint import files as checkpoint
from angelps.options import KEYS, PSOptions, ShardOptions
from angelps.server.shard import ParameterShard
from angelps.storage import rows
from angelps.storage import table_rows as storage
from angelps.table import OptimizerSpec, TableSpec, init_rows

MOM = OptimizerSpec("momentum", momentum=0.9)
EMB = TableSpec("emb", rows=-1, cols=3, sparse=True, init="normal", init_std=0.1, optimizer=MOM)
ADAM = TableSpec(
    "emb",
    rows=-1,
    cols=3,
    sparse=True,
    init="uniform",
    init_std=0.1,
    optimizer=OptimizerSpec("adam"),
)
LR = 0.5


def _grads(n, cols=3, seed=0):
    return np.random.default_rng(seed).standard_normal((n, cols)).astype(np.float32)


def _rows(shard):
    return shard.stats()["rows"]["emb"]


# --- paged rows --------------------------------------------------------------------------------


def _drive(shard, steps, seed):
    """Random pulls and pushes of any int64 keys (negatives too), new and old; every pull."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(-(2**63), 2**63 - 1, 3000, endpoint=True)
    out = []
    for clock in range(steps):
        keys = rng.choice(pool, rng.integers(1, 400))
        out.append(shard.pull({"emb": keys})["emb"])
        push = rng.choice(pool, rng.integers(1, 400))
        shard.push(0, clock, {"emb": (push, _grads(len(push), seed=clock))}, LR)
    return out


def test_rows_over_many_small_pages_match_one_page(monkeypatch):
    one = ParameterShard(0, 1, [ADAM])
    monkeypatch.setattr(rows, "PAGE_BYTES", 1 << 10)  # 64 rows of 4 bytes x 4+... a page
    paged = ParameterShard(0, 1, [ADAM])
    assert paged.tables["emb"].rows.page_rows < 100
    for a, b in zip(_drive(one, 12, 3), _drive(paged, 12, 3), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(paged.tables["emb"].rows.pages) > 10
    ka, wa, sa = one.export("emb")
    kb, wb, sb = paged.export("emb")
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(wa, wb)
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k])


def test_stats_report_memory_per_row():
    s = ParameterShard(0, 1, [EMB])
    s.pull({"emb": np.arange(-5000, 5000) * 7919})
    st = s.stats()
    assert st["rows"] == {"emb": 10000} and st["index"] == {"emb": "hash"}
    # 3 weights + 3 momentum float32 (24 bytes), the key (8), the index: more than 32 a row.
    assert st["bytes"]["emb"] >= 10000 * 32
    assert st["bytes_per_row"]["emb"] == pytest.approx(st["bytes"]["emb"] / 10000)


# --- admission ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_key_seen_fewer_than_n_times_has_no_row(device):
    s = ParameterShard(0, 1, [EMB], admission_min_count=3, device=device)
    key = np.array([-(2**62) - 5])
    init = init_rows(EMB, key)
    np.testing.assert_array_equal(s.pull({"emb": key})["emb"], init)  # pulls do not count
    s.push(0, 0, {"emb": (key, _grads(1))}, LR)
    s.push(0, 1, {"emb": (key, _grads(1))}, LR)  # seen twice: N - 1
    assert _rows(s) == 0
    np.testing.assert_array_equal(s.pull({"emb": key})["emb"], init)
    adm = s.stats()["admission"]["emb"]
    assert adm == {"dropped": 2, "admitted": 0, "pending": 1}
    g = _grads(1, seed=7)
    s.push(0, 2, {"emb": (key, g)}, LR)  # the third sighting creates the row and applies g
    assert _rows(s) == 1
    np.testing.assert_array_equal(s.pull({"emb": key})["emb"], init - np.float32(LR) * g)
    assert s.stats()["admission"]["emb"] == {"dropped": 2, "admitted": 1, "pending": 0}


def test_admission_counts_per_key_in_mixed_pushes():
    s = ParameterShard(0, 1, [EMB], admission_min_count=2)
    s.push(0, 0, {"emb": (np.array([1, 2, 3]), _grads(3))}, LR)
    s.push(0, 1, {"emb": (np.array([2, 3, 4]), _grads(3))}, LR)  # 2 and 3 admitted
    k, _, _ = s.export("emb")
    np.testing.assert_array_equal(k, [2, 3])
    assert s.stats()["admission"]["emb"] == {"dropped": 4, "admitted": 2, "pending": 2}
    s.push(0, 2, {"emb": (np.array([1, 2, 4]), _grads(3))}, LR)  # 1 and 4: second sighting
    np.testing.assert_array_equal(s.export("emb")[0], [1, 2, 3, 4])


def test_admission_off_creates_rows_on_pull_as_before():
    for n in (0, 1):
        s = ParameterShard(0, 1, [EMB], admission_min_count=n)
        s.pull({"emb": np.array([5, 6])})
        assert _rows(s) == 2 and s.stats()["admission"] == {}


# --- expiry ------------------------------------------------------------------------------------


def test_rows_not_updated_for_ttl_updates_are_evicted_at_save(tmp_path):
    s = ParameterShard(0, 1, [EMB], eviction_ttl_updates=2)
    s.push(0, 0, {"emb": (np.array([10, 20]), _grads(2))}, LR)  # update 1
    s.push(0, 1, {"emb": (np.array([20]), _grads(1))}, LR)  # update 2
    s.push(0, 2, {"emb": (np.array([30]), _grads(1))}, LR)  # update 3: 10 is 2 updates old
    info = s.save(str(tmp_path / "a"))
    assert info["evicted"] == {"emb": 1} and info["rows"] == {"emb": 2}
    assert s.stats()["evicted"] == {"emb": 1}
    np.testing.assert_array_equal(s.export("emb")[0], [20, 30])
    # An evicted row comes back exactly as a new row of that key: initial value, zero state.
    np.testing.assert_array_equal(
        s.pull({"emb": np.array([10])})["emb"], init_rows(EMB, np.array([10]))
    )
    fresh = ParameterShard(0, 1, [EMB])
    g = _grads(1, seed=4)
    s.push(0, 3, {"emb": (np.array([10]), g)}, LR)
    fresh.push(0, 0, {"emb": (np.array([10]), g)}, LR)
    a, b = s.export("emb"), fresh.export("emb")
    np.testing.assert_array_equal(a[1][0], b[1][0])
    np.testing.assert_array_equal(a[2]["v"][0], b[2]["v"][0])
    # Update 4: 20 was last updated 2 updates ago and goes; 30 and 10 keep their values.
    kept = {int(k): w for k, w in zip(a[0], a[1], strict=True)}
    assert s.save(str(tmp_path / "b"))["evicted"] == {"emb": 1}
    k, w, _ = s.export("emb")
    np.testing.assert_array_equal(k, [10, 30])
    np.testing.assert_array_equal(w, np.stack([kept[10], kept[30]]))
    assert s.stats()["evicted"] == {"emb": 2}


@pytest.mark.parametrize("device", [None, "cpu"])  # numpy pages, torch rows
def test_eviction_compacts_across_pages_and_keeps_the_rest(monkeypatch, device):
    monkeypatch.setattr(rows, "PAGE_BYTES", 1 << 9)
    s = ParameterShard(0, 1, [EMB], eviction_ttl_updates=1, device=device)
    ref = ParameterShard(0, 1, [EMB])
    keys = np.arange(-600, 600) * 1_000_003
    g = _grads(len(keys))
    for shard in (s, ref):
        shard.push(0, 0, {"emb": (keys, g)}, LR)
        shard.push(0, 1, {"emb": (keys[::3], g[::3])}, LR)
    assert s.evict() == {"emb": len(keys) - len(keys[::3])}
    k, w, st = s.export("emb")
    rk, rw, rst = ref.export("emb")
    mine = np.isin(rk, keys[::3])
    np.testing.assert_array_equal(k, rk[mine])
    np.testing.assert_array_equal(w, rw[mine])
    np.testing.assert_array_equal(st["v"], rst["v"][mine])
    # The index was rebuilt: pulls find the kept rows, updates land on them.
    np.testing.assert_array_equal(s.pull({"emb": keys[::3]})["emb"], rw[mine])


def test_admission_and_expiry_options_are_validated():
    for kw, key in (
        ({"admission_min_count": -1}, "angel.ps.admission.min.count"),
        ({"eviction_ttl_updates": -2}, "angel.ps.eviction.ttl.updates"),
    ):
        with pytest.raises(ValueError, match=rf"{key}=-\d is not valid: expected an integer >= 0"):
            ParameterShard(0, 1, [EMB], **kw)
    with pytest.raises(ValueError, match=r"angel.ps.eviction.ttl.updates=1.5 is not valid"):
        ParameterShard(0, 1, [EMB], eviction_ttl_updates=1.5)
    with pytest.raises(ValueError, match=r"angel.ps.admission.min.count=-3 is not valid"):
        PSOptions.from_config({"angel.ps.admission.min.count": -3})


def test_the_keys_reach_a_shard_through_its_options(tmp_path):
    conf_file = tmp_path / "job.properties"
    conf_file.write_text("angel.ps.admission.min.count=4\nangel.ps.eviction.ttl.updates=100\n")
    conf = load_config(str(conf_file), (), KEYS)
    opts = ShardOptions.from_config(conf)
    assert (opts.admission_min_count, opts.eviction_ttl_updates) == (4, 100)
    conf_file.write_text("angel.ps.eviction.ttl.updates=-1\n")
    with pytest.raises(ConfigError, match=r"angel.ps.eviction.ttl.updates"):
        load_config(str(conf_file), (), KEYS)


# --- chunked checkpoints -----------------------------------------------------------------------


def _save(shards, specs, path):
    tmp = checkpoint.new_tmp_dir(path)
    infos = [s.save(tmp) for s in shards]
    checkpoint.write_manifest(tmp, checkpoint.build_manifest(specs, len(shards), "hash", infos))
    checkpoint.commit_dir(tmp, path)


def test_checkpoint_written_and_read_in_chunks_restores_into_another_shard_count(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(storage, "CHUNK_ROWS", 100)
    monkeypatch.setattr(checkpoint, "READ_CHUNK_ROWS", 64)
    specs = [ADAM, TableSpec("d", rows=250, cols=2, optimizer=MOM)]
    shards = [ParameterShard(i, 2, specs) for i in range(2)]
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, 900, endpoint=True))
    for i, s in enumerate(shards):
        mine = s.tables["emb"].part.owns(i, keys)
        s.push(0, 0, {"emb": (keys[mine], _grads(int(mine.sum())))}, LR)
        lo, hi = s.tables["d"].lo, s.tables["d"].hi
        s.push(0, 1, {"d": (np.arange(lo, hi), _grads(hi - lo, 2))}, LR)
    path = str(tmp_path / "ck")
    _save(shards, specs, path)
    manifest = checkpoint.verify(path)
    f = os.path.join(path, "emb", "shard-0.parquet")
    assert pq.ParquetFile(f).metadata.num_row_groups > 1  # written in chunks
    restored = [ParameterShard(i, 3, specs) for i in range(3)]
    for s in restored:
        s.load(manifest["root"], manifest)
    for name in ("emb", "d"):
        before = [s.export(name) for s in shards]
        after = [s.export(name) for s in restored]
        kb = np.concatenate([p[0] for p in before])
        ka = np.concatenate([p[0] for p in after])
        ob, oa = np.argsort(kb), np.argsort(ka)
        np.testing.assert_array_equal(kb[ob], ka[oa])
        np.testing.assert_array_equal(
            np.concatenate([p[1] for p in before])[ob], np.concatenate([p[1] for p in after])[oa]
        )
        for slot in before[0][2]:
            np.testing.assert_array_equal(
                np.concatenate([p[2][slot] for p in before])[ob],
                np.concatenate([p[2][slot] for p in after])[oa],
            )


def test_a_damaged_chunked_file_is_refused_before_any_row_is_restored(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "CHUNK_ROWS", 50)
    s = ParameterShard(0, 1, [EMB])
    s.pull({"emb": np.arange(300)})
    path = str(tmp_path / "ck")
    _save([s], [EMB], path)
    f = os.path.join(path, "emb", "shard-0.parquet")
    data = bytearray(open(f, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(f, "wb") as out:
        out.write(bytes(data))
    manifest = checkpoint.read_manifest(path)
    other = ParameterShard(0, 1, [EMB])
    with pytest.raises(checkpoint.CheckpointDamaged, match=r"SHA-256 does not match"):
        other.load(manifest["root"], manifest)
    assert _rows(other) == 0


def _chunks(n: int, sizes: list[int]):
    """Chunks of random (incompressible) rows: the file is as large as the rows."""
    rng, start = np.random.default_rng(7), 0
    for m in sizes:
        keys = np.arange(start, start + m, dtype=np.int64)
        w = rng.standard_normal((m, n)).astype(np.float32)
        yield keys, w, {"velocity": w * 2}
        start += m


def test_table_file_read_back_a_row_group_at_a_time_holding_one_chunk(tmp_path):
    import pyarrow as pa

    f = str(tmp_path / "t" / "shard-0.parquet")
    entry = checkpoint.write_table_chunks(f, _chunks(8, [20_000] * 12 + [5]))
    assert entry["rows"] == 240_005
    sizes, peak = [], 0
    for keys, w, state in checkpoint.iter_table_file(f, entry, chunk=20_000):
        sizes.append(len(keys))
        peak = max(peak, pa.total_allocated_bytes())
        assert w.shape == (len(keys), 8)
        np.testing.assert_array_equal(state["velocity"], w * 2)
    assert sizes == [20_000] * 12 + [5]
    # A chunk is 20k rows x 72 bytes (1.4 MB): Arrow holds a few (decoding), never the whole
    # file (17 MB; reading with pre_buffer on held all of it: 32 MB measured).
    assert peak < 6 * 20_000 * 72, peak
    # A row group larger than the chunk (a file written in one piece) is read in batches.
    one = str(tmp_path / "one" / "shard-0.parquet")
    e1 = checkpoint.write_table_chunks(one, _chunks(2, [250]))
    got = [len(k) for k, _, _ in checkpoint.iter_table_file(one, e1, chunk=64)]
    assert got == [64, 64, 64, 58]
