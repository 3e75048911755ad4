"""bench/swap_keys.py on a small shard (no timings asserted): both ways of looking a swap's
keys up run, with keys held and with new ones, and the probe-only way is put back after."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import swap_keys  # noqa: E402

from angelps.server import shard_swap  # noqa: E402


def test_the_swaps_run_with_and_without_the_hint() -> None:
    hint = shard_swap._hint
    for new in (False, True):
        for with_hint in (False, True):
            assert swap_keys.measure(5000, 300, 5, new, with_hint) > 0.0
    assert shard_swap._hint is hint
