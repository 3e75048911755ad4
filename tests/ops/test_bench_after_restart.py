"""bench/after_restart.py on a few small steps (no timings asserted): the shard is killed and
restarted between the two measurements, the step that meets the restart recovers it, and the
client reaches both shards over its own connections after it."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import after_restart  # noqa: E402


def test_a_restart_between_the_two_measurements_leaves_both_connections(ray_local) -> None:
    out = after_restart.measure(keys=64, width=2, steps=10, transport="socket")
    assert out["paths_after"] == ["connection", "connection"]
    assert out["recovery_s"] > 0.0 and out["ms_before"] > 0.0 and out["ms_after"] > 0.0
