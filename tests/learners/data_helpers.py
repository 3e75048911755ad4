"""Shared by the data tests: data file paths, options from dotted keys, small files, row lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from angelconf.config import Config, load_config
from learners import data as D
from learners.data.options import KEYS

REPO = Path(__file__).resolve().parents[2]
A9A = REPO / "data" / "a9a" / "a9a_123d_train.libsvm"
A9A_DUMMY = REPO / "data" / "a9a" / "a9a_123d_train.dummy"
CENSUS_DUMMY = REPO / "data" / "census" / "census_148d_train.dummy"
DNA = REPO / "data" / "dna" / "dna.scale"
ABALONE = REPO / "data" / "abalone" / "abalone_8d_train.libsvm"
ABALONE_DENSE = REPO / "data" / "abalone" / "abalone_8d_train.dense"


def a9a_head(dst: Path, n: int) -> Path:
    """The first ``n`` lines of a9a's training file at ``dst`` (written once)."""
    if not dst.exists():
        with open(A9A) as f:
            dst.write_text("".join(next(f) for _ in range(n)))
    return dst


def conf(**kv: Any) -> Config:
    """A config from dotted keys given as a dict-friendly mapping."""
    return load_config(None, kv, KEYS)


def C(**kv: Any) -> D.DataOptions:
    """The data options of a config from dotted keys."""
    return D.DataOptions.from_config(conf(**kv))


def write(tmp_path: Path, text: str, name: str = "f.txt") -> str:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(p)


def read_all(path: str, cfg: D.DataOptions, **kw: Any) -> D.Batch:
    return D.concat(list(D.read_file(path, cfg, **kw)))


def rows(b: D.Batch) -> list[tuple[float, list[int], list[float]]]:
    return [
        (
            float(b.labels[r]),
            b.ids[b.indptr[r] : b.indptr[r + 1]].tolist(),
            b.values[b.indptr[r] : b.indptr[r + 1]].tolist(),
        )
        for r in range(len(b))
    ]
