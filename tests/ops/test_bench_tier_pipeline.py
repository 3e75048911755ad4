"""bench/tier_pipeline.py on a few small steps (no timings asserted): both modes run, the batch
after the next one is asked for only with two swaps in flight, the two make the same choices
(hit rates equal), and the module's switch is put back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import tier_pipeline  # noqa: E402

from learners.worker import held_tables  # noqa: E402


def test_a_few_steps_of_each_mode_make_the_same_choices() -> None:
    out = tier_pipeline.measure(
        steps=5, warm=1, batch=256, capacity=8_000, step_ms=2.0, host_ms=0.5, rounds=1
    )
    assert held_tables.TWO_AHEAD is True
    runs = {r["swaps_in_flight"]: r for r in out["runs"]}
    assert set(runs) == {1, 2}
    assert runs[1]["asked_two"] == 0 and runs[2]["asked_two"] == 10  # (2 epochs of 5)
    # (two in flight: the room knows the batch after the next one, whose rows go last)
    assert runs[2]["hit_rate"] >= runs[1]["hit_rate"] and 0.0 < runs[1]["hit_rate"] < 1.0
    for r in runs.values():
        assert r["step_ms_median"] >= 2.0  # (the step is never shorter than its wait)
        assert r["tier_wait_ms"] >= r["tier_wait_shards_ms"] >= 0.0
        assert r["shard_swap_ms"] > 0.0 and r["tier_wait_update_ms"] >= 0.0


def test_host_work_longer_than_the_step_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["tier_pipeline.py", "--step-ms", "2", "--host-ms", "3"])
    with pytest.raises(SystemExit):
        tier_pipeline.main()
    assert "--host-ms 3.0 is longer than --step-ms 2.0" in capsys.readouterr().err
