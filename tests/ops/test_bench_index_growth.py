"""bench/index_growth.py on a small shard (no timings asserted): both growths run and grow the
tables several times, and the index's own growth is put back after."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import index_growth  # noqa: E402

from angelps.storage.open_index import OpenIndex  # noqa: E402


def test_both_growths_fill_the_tables() -> None:
    grow = OpenIndex._grow
    for growth in ("probe", "runs"):
        res = index_growth.fill(20_000, 1_000, growth, seed=0)
        assert res["growth"] == growth and res["swaps"] >= 20
        assert len(res["growths"]) >= 6  # two tables, three growths or more each
        assert res["growths"][-1]["keys"] > 10_000
    assert OpenIndex._grow is grow
