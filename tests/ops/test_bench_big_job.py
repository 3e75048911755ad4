"""bench/big_job.py: the chunked spread data, the memory sampler, and the whole job at a small
size (train, save, resume, predict, evaluate; every phase ok, the JSON fields there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from big_job import Sampler, memory, tree
from synthetic import SyntheticSpec, cover_chunk, generate, write_parquet_chunks

from tests.child_env import python_path

REPO = Path(__file__).resolve().parents[2]


def test_cover_chunks_walk_every_spread_id_once_per_field(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    spec = SyntheticSpec(num_ids=2_600, spread=True)
    v = spec.ids_per_field
    chunks = [cover_chunk(spec, a, min(a + 37, v)) for a in range(0, v, 37)]
    ids = np.concatenate([c.ids for c in chunks])
    assert ids.shape == (v, 26)
    assert len(np.unique(ids)) == 2_600  # distinct across fields: the map is a bijection
    assert ids.min() >= 0 and ids.max() > 2**62  # spread over [0, 2^63)
    # The same ids as the unspread walk, mapped: each field's column is a permutation.
    plain = np.concatenate(
        [cover_chunk(SyntheticSpec(num_ids=2_600), a, min(a + 37, v)).ids for a in range(0, v, 37)]
    )
    for f in range(26):
        assert np.array_equal(np.sort(plain[:, f]), np.arange(f * v, (f + 1) * v))
    # Chunks are independent of the chunk size.
    assert np.array_equal(cover_chunk(spec, 10, 60).ids, ids[10:60])
    path, rows = write_parquet_chunks(tmp_path / "t.parquet", [*chunks, generate(spec, 50)])
    t = pq.read_table(path)
    assert rows == t.num_rows == v + 50
    assert np.array_equal(np.array(t["ids"].to_pylist())[:v], ids)


def test_sampler_sums_this_process_and_its_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = tree(os.getpid())
        assert os.getpid() in pids and child.pid in pids
        rss, pss = memory(pids)
        own, _ = memory([os.getpid()])
        assert rss > own > 0 and 0 < pss <= rss
        s = Sampler(0.01)
        s.start()
        s.stop()
        assert s.peak_rss >= own and s.peak_procs >= 2
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow  # three real jobs (15-60 s); the data and the sampler are checked above
def test_big_job_runs_every_phase_at_a_small_size(tmp_path: Path) -> None:
    out = tmp_path / "big.json"
    env = {**os.environ, "PYTHONPATH": python_path(REPO)}
    cmd = [sys.executable, str(REPO / "bench" / "big_job.py"), "--json", str(out)]
    cmd += ["--ids", "2600", "--zipf-rows", "400", "--valid-rows", "300", "--batch", "64"]
    cmd += ["--tier-rows", "2000"]  # a device tier of 2000 of the 2600 rows a table
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r["phases"]) == {"train", "save", "resume", "predict", "evaluate"}
    assert all(p["ok"] and p["seconds"] >= 0 for p in r["phases"].values()), r["phases"]
    assert all(0 < p["peak_rss_mib"] <= r["peak_rss_mib_total"] for p in r["phases"].values())
    assert r["placement"] == "worker" and r["device_tier"]["rows_per_table"] == 2000
    assert 0 < r["device_tier"]["hit_rate"] < 1 and r["device_tier"]["misses_per_step"] > 0
    # FM: every id has a row in the weight table and in the embedding table, plus the bias.
    assert r["data"]["distinct_ids"] == 2600
    # (the bias is held by the worker, with the sparse tables)
    assert r["shards_after_train"]["rows"] == {"wide": 2600, "embedding": 2600}
    assert r["rows_on_workers"] == {"wide_bias": 1}
    assert r["rows_held"] == 5201
    assert r["shards_after_resume"]["rows"] == r["shards_after_train"]["rows"]
    assert "hash" in r["shards_after_train"]["index"]
    # 8 float32 columns and Momentum: 64 B of rows, 8 B of key, at most 8 B of index.
    assert 72 < r["shards_after_train"]["bytes_per_row"]["embedding"] <= 80
    assert 0 < r["bytes_per_row_shards"] <= 80
    assert r["predictions"] == 300 and 0 <= r["evaluate"]["valid_auc"] <= 1
    assert r["checkpoint_bytes"] > 2600 * 4 * 9
    assert r["peak_rss_mib_total"] > 100 and r["peak_processes"] > 3
    assert r["samples_per_s"] > 0
