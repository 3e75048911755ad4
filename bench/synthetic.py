"""Synthetic power-law click data with labels from a known teacher model.

Each row has one id in each of ``fields`` fields (Criteo-like: 26). Field ``f`` owns the id range
``[f·V, (f+1)·V)`` with ``V = num_ids // fields``; inside a field, the id of popularity rank
``r`` (1 = most frequent) is drawn with probability ∝ ``r^-zipf`` (Zipf exponent about 1.1, as
click logs show) and mapped to a scattered id by ``(r·A) mod V`` with ``A`` coprime to ``V``, so
popular ids are not neighbours in memory.

Labels come from a teacher FM, ``p = σ(b + Σ_f w(id_f) + Σ_{f<g} <v(id_f), v(id_g)>)``, whose
parameters are a pure function of (seed, field, rank) (hashed, nothing stored): only the
``signal_ranks`` most popular ids of each field carry signal, the rest have zero weights, as a
model could never learn a weight from a handful of sightings. The best reachable AUC on a sample
is the AUC of the teacher's own probabilities on it (the Bayes-optimal ranking): it is computed
and returned with the data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# One AUC for every system compared: the one angelps reports (ties share their mean rank).
from learners.runs.metrics import auc

__all__ = [
    "Synthetic",
    "SyntheticSpec",
    "auc",
    "cover_chunk",
    "generate",
    "write_parquet",
    "write_parquet_chunks",
]


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of the data and of its teacher."""

    num_ids: int = 100_000
    fields: int = 26
    zipf: float = 1.1
    signal_ranks: int = 2_000
    teacher_rank: int = 4
    weight_std: float = 0.35
    factor_std: float = 0.22
    bias: float = -1.0
    seed: int = 7
    #: Map each id through a bijection of ``[0, 2^63)`` (:func:`_mix63`), so ids span the whole
    #: non-negative int64 range (a table of unbounded keys, ``ml.feature.index.range=-1``; the
    #: data readers take 0-based ids, so no negatives).
    spread: bool = False

    @property
    def ids_per_field(self) -> int:
        return self.num_ids // self.fields


@dataclass
class Synthetic:
    """Rows (``ids`` [n, fields] int64, 0-based), labels in {0, 1} and the teacher's P(y=1)."""

    ids: np.ndarray
    labels: np.ndarray
    teacher_p: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def best_auc(self) -> float:
        """AUC of the teacher's probabilities: the most any model can reach on these rows."""
        return auc(self.labels, self.teacher_p)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a well-spread 64-bit hash of each element."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_M63 = np.uint64((1 << 63) - 1)


def _mix63(x: np.ndarray) -> np.ndarray:
    """A bijection of ``[0, 2^63)`` that scatters consecutive values over all of it: odd
    multipliers modulo 2^63 and xor-shifts inside 63 bits are each invertible."""
    z = x.astype(np.uint64) & _M63
    z = (z * np.uint64(0xBF58476D1CE4E5B9)) & _M63
    z ^= z >> np.uint64(31)
    z = (z * np.uint64(0x94D049BB133111EB)) & _M63
    z ^= z >> np.uint64(29)
    return z.view(np.int64)


def _hash_normal(keys: np.ndarray, stream: int, seed: int) -> np.ndarray:
    """A standard normal per key, a pure function of (seed, stream, key) (Box-Muller)."""
    base = keys.astype(np.uint64) * np.uint64(0x100000001B3) + np.uint64(
        seed * 7919 + stream * 104729
    )
    h1 = _mix64(base)
    h2 = _mix64(base ^ np.uint64(0xD6E8FEB86659FD93))
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


def _multiplier(v: int) -> int:
    """An odd multiplier near v·0.618 that is coprime to v: rank -> id is then a bijection."""
    a = max(1, int(v * 0.6180339887)) | 1
    while math.gcd(a, v) != 1:
        a += 2
    return a


def _zipf_ranks(rng: np.random.Generator, n: int, v: int, s: float) -> np.ndarray:
    """n ranks in [1, v] with P(r) ∝ r^-s, by inverting the exact CDF over the finite range."""
    cdf = np.cumsum(np.arange(1, v + 1, dtype=np.float64) ** -s)
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64) + 1


def generate(spec: SyntheticSpec, rows: int, seed: int = 0, cover_rows: int = 0) -> Synthetic:
    """``rows`` Zipf rows; before them, ``cover_rows`` rows that walk every id of every field in
    turn (so that training touches the whole table: the table-size benchmark needs that).
    """
    v = spec.ids_per_field
    if v < 1:
        raise ValueError(f"num_ids={spec.num_ids} gives no id per field for {spec.fields} fields")
    rng = np.random.default_rng([spec.seed, seed])
    ranks = np.empty((cover_rows + rows, spec.fields), dtype=np.int64)
    for f in range(spec.fields):
        if cover_rows:
            # Each field starts its walk at a different place so rows mix ranks across fields.
            start = int(rng.integers(v))
            ranks[:cover_rows, f] = (start + np.arange(cover_rows, dtype=np.int64)) % v + 1
        ranks[cover_rows:, f] = _zipf_ranks(rng, rows, v, spec.zipf)
    return _rows(spec, ranks, rng)


def _rows(spec: SyntheticSpec, ranks: np.ndarray, rng: np.random.Generator) -> Synthetic:
    """Ids, teacher probabilities and labels of rows of ``ranks`` [n, fields]."""
    v = spec.ids_per_field
    offsets = np.arange(spec.fields, dtype=np.int64) * v
    ids = (ranks * _multiplier(v)) % v + offsets
    if spec.spread:
        ids = _mix63(ids)

    # Teacher: keys are (field, rank); ranks beyond signal_ranks carry nothing.
    keys = np.arange(spec.fields, dtype=np.int64)[None, :] * (1 << 40) + ranks
    active = ranks <= spec.signal_ranks
    logit = np.full(ranks.shape[0], spec.bias)
    logit += (spec.weight_std * _hash_normal(keys, 0, spec.seed) * active).sum(axis=1)
    emb_sum = np.zeros((ranks.shape[0], spec.teacher_rank))
    emb_sq = np.zeros(ranks.shape[0])
    for j in range(spec.teacher_rank):
        vj = spec.factor_std * _hash_normal(keys, 1 + j, spec.seed) * active
        emb_sum[:, j] = vj.sum(axis=1)
        emb_sq += (vj * vj).sum(axis=1)
    logit += 0.5 * ((emb_sum * emb_sum).sum(axis=1) - emb_sq)
    p = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng.random(p.shape[0]) < p).astype(np.float32)
    return Synthetic(ids=ids, labels=labels, teacher_p=p.astype(np.float32))


def cover_chunk(spec: SyntheticSpec, start: int, end: int, seed: int = 0) -> Synthetic:
    """Rows ``[start, end)`` of a walk over every id of every field (row ``i`` holds the id of
    rank ``(s_f + i) mod V + 1`` in field ``f``): ``ids_per_field`` rows touch each id once,
    generated a chunk at a time so a table of 10^8 ids needs no 10^8-row array."""
    v = spec.ids_per_field
    if v < 1:
        raise ValueError(f"num_ids={spec.num_ids} gives no id per field for {spec.fields} fields")
    starts = np.random.default_rng([spec.seed, seed, 1]).integers(v, size=spec.fields)
    i = np.arange(start, end, dtype=np.int64)[:, None]
    ranks = (starts[None, :] + i) % v + 1
    return _rows(spec, ranks, np.random.default_rng([spec.seed, seed, 2, start]))


def write_parquet_chunks(path: str | Path, chunks: Iterable[Synthetic]) -> tuple[Path, int]:
    """Write ``chunks`` (one row group each) as one Parquet file of :func:`write_parquet`'s
    schema; returns the path and the number of rows."""
    import pyarrow.parquet as pq

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    rows = 0
    try:
        for chunk in chunks:
            table = _arrow(chunk)
            if writer is None:
                writer = pq.ParquetWriter(out, table.schema)
            writer.write_table(table)
            rows += len(chunk)
    finally:
        if writer is not None:
            writer.close()
    return out, rows


def _arrow(data: Synthetic) -> Any:
    import pyarrow as pa

    n, f = data.ids.shape
    offsets = np.arange(0, n * f + 1, f, dtype=np.int32 if n * f < 2**31 else np.int64)
    ids = data.ids.reshape(-1)
    cls = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    ids_col = cls.from_arrays(pa.array(offsets), pa.array(ids, type=pa.int64()))
    return pa.table({"label": pa.array(data.labels, type=pa.float32()), "ids": ids_col})


def write_parquet(path: str | Path, data: Synthetic, row_group: int = 65_536) -> Path:
    """Write rows as Parquet: ``label`` (float32) and ``ids`` (list<int64>), for angelps's
    ``ml.data.type=parquet`` reader."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, f = data.ids.shape
    offsets = np.arange(0, n * f + 1, f, dtype=np.int32 if n * f < 2**31 else np.int64)
    ids = data.ids.reshape(-1)
    list_type = pa.list_ if offsets.dtype == np.int32 else pa.large_list
    ids_col = (pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray).from_arrays(
        pa.array(offsets), pa.array(ids, type=pa.int64())
    )
    assert ids_col.type == list_type(pa.int64())
    table = pa.table({"label": pa.array(data.labels, type=pa.float32()), "ids": ids_col})
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out, row_group_size=row_group)
    return out
