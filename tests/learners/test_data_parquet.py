"""Parquet input: the converter, reading, worker parts and bad rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from angelconf.config import load_config
from learners import data as D
from learners.data.convert import main
from learners.data.options import KEYS

REPO = Path(__file__).resolve().parents[2]
CENSUS = REPO / "data" / "census" / "census_148d_train.libsvm"
AGARICUS = REPO / "data" / "agaricus" / "agaricus_127d_train.libsvm"


def C(**kv: Any) -> D.DataOptions:
    return D.DataOptions.from_config(load_config(None, kv, KEYS))


def read_all(path: str, cfg: D.DataOptions, **kw: Any) -> D.Batch:
    return D.concat(list(D.read_file(path, cfg, **kw)))


def same(a: D.Batch, b: D.Batch) -> bool:
    return all(
        np.array_equal(getattr(a, f), getattr(b, f))
        for f in ("labels", "indptr", "ids", "values", "row_index")
    )


@pytest.fixture(scope="module")
def census_parquet(tmp_path_factory: pytest.TempPathFactory) -> str:
    dst = str(tmp_path_factory.mktemp("pq") / "census.parquet")
    stats = D.to_parquet(str(CENSUS), dst, C(), row_group_rows=5000)
    assert stats.rows == 22792 and stats.bad_lines == 0
    return dst


def test_converter_round_trip(census_parquet: str) -> None:
    text = D.load_file(str(CENSUS), C())
    pqt = D.load_file(census_parquet, C(**{"ml.data.type": "parquet"}))
    assert same(text, pqt)
    meta = pq.ParquetFile(census_parquet)
    assert meta.schema_arrow.names == ["label", "ids", "values"]
    assert meta.metadata.num_row_groups == 5


def test_label_transform_applies_when_reading_parquet(tmp_path: Path) -> None:
    dst = str(tmp_path / "agaricus.parquet")
    D.to_parquet(str(AGARICUS), dst, C(**{"ml.data.label.trans.class": "PosNegTrans"}))
    raw = pq.read_table(dst).column("label").to_numpy()
    assert set(np.unique(raw).tolist()) == {0.0, 1.0}  # written before the transform
    b = D.load_file(
        dst, C(**{"ml.data.type": "parquet", "ml.data.label.trans.class": "PosNegTrans"})
    )
    assert set(np.unique(b.labels).tolist()) == {-1.0, 1.0}
    assert np.array_equal(b.labels > 0, raw > 0)


def test_parquet_chunks_and_worker_parts(census_parquet: str) -> None:
    cfg = C(**{"ml.data.type": "parquet"})
    whole = D.load_file(census_parquet, cfg)
    assert same(read_all(census_parquet, cfg, chunk_rows=777), whole)
    parts = [read_all(census_parquet, cfg, worker_id=w, num_workers=3) for w in range(3)]
    idx = np.concatenate([p.row_index for p in parts])
    assert np.array_equal(np.sort(idx), np.arange(22792))
    assert same(D.concat(parts).take(np.argsort(idx)), whole)
    _, valid = D.load_train_valid(
        C(**{"ml.data.type": "parquet", "angel.train.data.path": census_parquet})
    )
    assert len(valid) == 1140 and (valid.row_index % 20 == 0).all()  # ceil(22792 / 20)


def write_table(tmp_path: Path, cols: dict[str, Any], name: str = "t.parquet") -> str:
    p = str(tmp_path / name)
    pq.write_table(pa.table(cols), p)
    return p


def test_parquet_custom_columns_and_implicit_values(tmp_path: Path) -> None:
    p = write_table(
        tmp_path,
        {"y": pa.array([1, 0], pa.int32()), "feat": pa.array([[3, 1], [7]], pa.list_(pa.int32()))},
    )
    cfg = C(
        **{
            "ml.data.type": "parquet",
            "ml.data.parquet.label.col": "y",
            "ml.data.parquet.ids.col": "feat",
        }
    )
    b = read_all(p, cfg)
    assert b.labels.tolist() == [1.0, 0.0] and b.ids.tolist() == [3, 1, 7]
    assert b.values.tolist() == [1.0, 1.0, 1.0] and b.indptr.tolist() == [0, 2, 3]


PARQUET_BAD = [
    ({"label": [1.0, None], "ids": [[1], [2]], "values": [[1.0], [1.0]]}, {}, "row 1: label column label is null or not finite"),
    ({"label": [1.0, 0.0], "ids": [[1], [2, 3]], "values": [[1.0], [1.0]]}, {}, "row 1: values column values has a different length than ids column ids"),
    ({"label": [1.0, 0.0], "ids": [[1], [-2]], "values": [[1.0], [1.0]]}, {}, "row 1: a feature id is negative (Parquet ids are 0-based)"),
    ({"label": [1.0, 0.0], "ids": [[1], None], "values": [[1.0], []]}, {}, "row 1: ids column ids is null"),
    ({"label": [1.0, 0.0], "ids": [[1], [2]], "values": [[1.0], [float("inf")]]}, {}, "row 1: values column values holds a null or non-finite value"),
    ({"label": [1.0, 0.0], "ids": [[1], [20]], "values": [[1.0], [1.0]]}, {"ml.feature.index.range": 10}, "row 1: a feature id is outside ml.feature.index.range=10 (valid: 0..9)"),
    ({"label": [1.0, 0.0], "ids": [[1, 2], [2]], "values": [[1.0, 1.0], [1.0]]}, {"ml.fm.field.num": 2}, "row 1: expected exactly ml.fm.field.num=2 features"),
]  # fmt: skip


@pytest.mark.parametrize(("cols", "extra", "message"), PARQUET_BAD)
def test_parquet_bad_rows(
    tmp_path: Path, cols: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    p = write_table(tmp_path, cols)
    with pytest.raises(D.DataError) as e:
        read_all(p, C(**{"ml.data.type": "parquet", **extra}))
    assert (
        str(e.value) == f"{p}: {message} (set ml.data.skip.bad.lines=true to skip malformed lines)"
    )
    stats = D.ReadStats()
    b = read_all(
        p, C(**{"ml.data.type": "parquet", "ml.data.skip.bad.lines": True, **extra}), stats=stats
    )
    assert stats.bad_lines == 1 and stats.bad_examples == [f"{p}: {message}"]
    assert len(b) == 1 and b.row_index.tolist() == [0] and b.ids.tolist() == cols["ids"][0]


def test_parquet_schema_errors(tmp_path: Path) -> None:
    p = write_table(tmp_path, {"lab": [1.0], "ids": [[1]]})
    with pytest.raises(
        D.DataError, match=r"Parquet column\(s\) label not found; the file has lab, ids"
    ):
        read_all(p, C(**{"ml.data.type": "parquet"}))
    p = write_table(tmp_path, {"label": [1.0], "ids": [["a"]]}, "s.parquet")
    with pytest.raises(
        D.DataError, match=r"ids column ids has type list<element: string>, expected list<int64>"
    ):
        read_all(p, C(**{"ml.data.type": "parquet"}))
    p = write_table(tmp_path, {"label": ["x"], "ids": [[1]]}, "l.parquet")
    with pytest.raises(D.DataError, match="label column label has type string, expected a number"):
        read_all(p, C(**{"ml.data.type": "parquet"}))
    bad = tmp_path / "not.parquet"
    bad.write_text("1 1:1\n")
    with pytest.raises(D.DataError, match="not a readable Parquet file"):
        read_all(str(bad), C(**{"ml.data.type": "parquet"}))
    with pytest.raises(ValueError, match="already Parquet"):
        D.to_parquet(str(bad), str(tmp_path / "x.parquet"), C(**{"ml.data.type": "parquet"}))


def test_converter_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.dummy"
    src.write_text("1 0 3\nbad line\n0 2\n")
    dst = tmp_path / "out.parquet"
    assert main([str(src), str(dst), "--set", "ml.data.type=dummy"]) == 2
    assert (
        f"error: {src}:2: the label is 'bad', not a number (a sample id first? set ml.data.sid=true); expected '<label> <id> ...' (dummy)"
        in capsys.readouterr().out
    )
    args = [
        str(src),
        str(dst),
        "--set",
        "ml.data.type=dummy",
        "--set",
        "ml.data.skip.bad.lines=true",
    ]
    assert main(args) == 0
    assert "2 rows from 3 lines, 1 malformed skipped" in capsys.readouterr().out
    assert pq.read_table(dst).column("ids").to_pylist() == [[0, 3], [2]]
