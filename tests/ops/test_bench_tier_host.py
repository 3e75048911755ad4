"""bench/tier_host.py on a few small steps (no timings asserted): every phase is measured, the
tier's hit rate is a rate, and the device tier's methods it times are put back."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import tier_host  # noqa: E402

from learners.worker.device_tier import TierBook  # noqa: E402


def test_a_few_steps_measure_every_phase_and_leave_the_tier_as_it_was() -> None:
    before = (TierBook.prefetch, TierBook.make_room, TierBook.place_ahead)
    out = tier_host.measure(steps=4, warm=1, batch=256, capacity=8_000, eviction="lru")
    assert (TierBook.prefetch, TierBook.make_room, TierBook.place_ahead) == before
    ms = out["ms"]
    for phase in ("ask", "room", "place", "shard", "update", "read", "step"):
        assert ms[phase] >= 0.0, phase
    assert ms["shard"] > 0.0 and ms["place"] > 0.0 and ms["step"] > ms["read"]
    assert ms["host_update_thread"] == ms["ask"] + ms["room"] + ms["place"]
    assert 0.0 < out["hit_rate"] < 1.0
    # the shard's swaps of the steps measured, replayed in parts (medians: about their sum)
    parts = out["shard_parts_ms"]
    assert set(parts) == {"check", "split", "first", "read", "later", "swap"}
    assert parts["read"] > 0.0 and parts["later"] > 0.0 and parts["swap"] > 0.0
    # 256 rows of 26 fields: at most 6,656 unique ids a step
    assert 0 < out["unique_ids_per_step"] <= 256 * 26
