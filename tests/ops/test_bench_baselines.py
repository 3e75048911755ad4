"""bench/baselines.py and the report of bench/train_throughput.py (no timings asserted)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import train_throughput as tt  # noqa: E402
from baselines import load_dummy, run_baseline  # noqa: E402

CENSUS = REPO / "data" / "census" / "census_148d_train.dummy"


@pytest.fixture(scope="module")
def census():
    return load_dummy(CENSUS, ratio=0.1)


def test_census_split_matches_angelps(census) -> None:
    # Row i validates iff i % 10 == 0: 2,280 of 22,792.
    assert census.valid_ids.shape == (2280, 13) and census.train_ids.shape == (20512, 13)
    assert census.num_ids == 148
    assert set(np.unique(census.train_y)) == {0.0, 1.0}


@pytest.mark.parametrize("system", ["torch", "torch_sparse"])
def test_one_process_baselines_learn_census_fm(census, system: str) -> None:
    cfg = {"rank": 8, "hidden": [], "lr": 0.1, "batch": 2048, "epochs": 3, "threads": 1, "seed": 0}
    out = run_baseline(system, census, cfg)
    aucs = [e["valid_auc"] for e in out["epochs"]]
    assert len(aucs) == 3
    assert all(e["samples"] == 10 * 2048 for e in out["epochs"])  # full batches only
    assert aucs[-1] > aucs[0] > 0.84  # the same trajectory as angelps: 0.85, 0.86, 0.87


def test_dense_and_sparse_updates_agree_on_deepfm(census) -> None:
    cfg = {"rank": 8, "hidden": [16], "lr": 0.1, "batch": 2048, "epochs": 2, "threads": 1}
    dense = run_baseline("torch", census, cfg)["epochs"][-1]["valid_auc"]
    sparse = run_baseline("torch_sparse", census, cfg)["epochs"][-1]["valid_auc"]
    # Different initial draws, same math (lazy momentum equals dense momentum here: every
    # census id appears in every batch of 2048).
    assert abs(dense - sparse) < 0.01


def _result(system: str, batch: int, sps: list[float], aucs: list[float]) -> dict:
    return {
        "case": {"suite": "census", "model": "FM", "batch": batch, "system": system},
        "epochs": [
            {"epoch": i, "train_s": 1000 / s, "samples": 1000, "valid_auc": a, "wall_s": i + 1.0}
            for i, (s, a) in enumerate(zip(sps, aucs, strict=True))
        ],
        "startup_s": 2.0,
        "load_at_start": 1.0,
    }


def test_summary_and_markdown() -> None:
    results = [
        _result("torch", 2048, [1000, 4000, 4000], [0.80, 0.85, 0.90]),
        _result("angelps-bsp-w1s1", 2048, [500, 2000, 3000], [0.80, 0.89, 0.895]),
        {
            "case": {"suite": "census", "model": "FM", "batch": 2048, "system": "ray_ps"},
            "error": "timed out after 5 s",
            "load_at_start": 1.0,
        },
    ]
    tt.summarise(results)
    # Steady state: epochs after the first, samples over seconds.
    assert results[0]["steady_samples_per_s"] == pytest.approx(4000)
    assert results[1]["steady_samples_per_s"] == pytest.approx(2000 / (1000 / 2000 + 1000 / 3000))
    assert results[0]["best_auc"] == 0.90 and results[1]["best_auc"] == 0.90
    # 0.99 * 0.90 = 0.891: torch gets there in epoch 3, angelps in epoch 3 too (0.895).
    assert results[0]["train_s_to_target"] == pytest.approx(1 + 0.25 + 0.25)
    assert results[1]["train_s_to_target"] == pytest.approx(2 + 0.5 + 1000 / 3000)
    report = {
        "machine": {
            "cpus": 2,
            "cpu": "x",
            "mem_mib": 24576,
            "gpu": False,
            "python": "3.11",
            "torch": "2",
            "ray": "2",
        },
        "started": "t",
        "load_before": [1.0],
        "load_after": [2.0],
        "results": results,
    }
    md = tt.markdown(report)
    assert "| torch | 4k (1.00) |" in md
    assert "| angelps-bsp-w1s1 | 2k (0.60) |" in md
    assert "- census FM B=2048 ray_ps: timed out after 5 s" in md
    assert not math.isnan(results[1]["final_auc"])


def test_repeats_report_the_median() -> None:
    runs = [
        _result("torch", 256, [1, 1000, 1000], [0.8, 0.8, 0.8]),
        _result("torch", 256, [1, 3000, 3000], [0.8, 0.8, 0.8]),
        _result("torch", 256, [1, 2500, 2500], [0.8, 0.8, 0.8]),
    ]
    for i, r in enumerate(runs):
        r["case"]["repeat"] = i
    tt.summarise(runs)
    assert [r["median_samples_per_s"] for r in runs] == [pytest.approx(2500)] * 3
    assert {r["repeats"] for r in runs} == {3}
