"""Shared helpers: torch as the oracle for the torch-equivalent schedules."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch

import decay


def torch_lrs(
    make: Callable[[torch.optim.Optimizer], object],
    n: int,
    lr: float,
    optimizer: str = "sgd",
    momentum: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """torch's lr (and momentum) after k = 0..n-1 calls of scheduler.step()."""
    p = torch.nn.Parameter(torch.zeros(1))
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD([p], lr=lr, momentum=0.9)
    else:
        opt = torch.optim.Adam([p], lr=lr)
    lrs = np.empty(n)
    moms = np.empty(n) if momentum else None
    group = opt.param_groups[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = make(opt)
        for k in range(n):
            if k:
                sched.step()  # type: ignore[attr-defined]
            lrs[k] = group["lr"]
            if moms is not None:
                moms[k] = group["momentum"] if "momentum" in group else group["betas"][0]
    return lrs, moms


def ours(s: decay.StepSizeScheduler, n: int) -> np.ndarray:
    return np.array([s.lr_at(k) for k in range(n)])


def assert_close(got: np.ndarray, want: np.ndarray, scale: float, rtol: float = 1e-9) -> None:
    """|got - want| <= rtol·|want| + 1e-12·scale (the absolute term only matters where the
    schedule crosses 0, where a relative error is meaningless)."""
    got = np.asarray(got, dtype=float)
    want = np.asarray(want, dtype=float)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    err = np.abs(got - want)
    bound = rtol * np.abs(want) + 1e-12 * max(scale, 1e-300)
    bad = np.nonzero(err > bound)[0]
    assert bad.size == 0, (
        f"{bad.size} mismatches, first at k={bad[0]}: ours {got[bad[0]]!r} torch {want[bad[0]]!r}"
    )
