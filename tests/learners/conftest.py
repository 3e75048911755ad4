"""Shared helpers: an in-process parameter server over angelps' own table init and optimizers.

``LocalPS`` answers ``pull_many``/``push_many`` like a PSClient handle of one worker, without Ray,
so the worker's training step can be tested in one process (accumulation, clipping, freezing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from angelps.optim import apply, slot_widths
from angelps.rates import Step, rate_of
from angelps.table import TableSpec, init_rows


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value

    def map(self, f: Any) -> _Done:
        return _Done(f(self.value))


class LocalPS:
    """Dense in-memory tables; one optimizer update per push (one worker, BSP trivially)."""

    def __init__(self, specs: list[TableSpec]) -> None:
        self.specs = {s.name: s for s in specs}
        self.w: dict[str, np.ndarray] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self.pushes: list[dict[str, Any]] = []
        self.clocks = 0
        for s in specs:
            rows = s.rows
            self.w[s.name] = init_rows(s, np.arange(rows, dtype=np.int64))
            self.state[s.name] = {
                k: np.zeros((rows, width), dtype=np.dtype(s.dtype))
                for k, width in slot_widths(s.optimizer, s.cols).items()
            }

    def pull_many(self, req: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: self.w[name][np.asarray(ids)].copy() for name, ids in req.items()}

    def pull_many_async(self, req: Mapping[str, np.ndarray]) -> _Done:
        return _Done(self.pull_many(req))

    @property
    def step_count(self) -> int:
        """This worker's clock: its pushes and clock() calls."""
        return len(self.pushes) + self.clocks

    @property
    def bytes_moved(self) -> int:
        return 0  # nothing crosses a wire

    def clock(self) -> None:
        """End a step without gradients (a skipped update)."""
        self.clocks += 1

    def push_many(self, grads: Mapping[str, tuple[np.ndarray, np.ndarray]], lr: Step) -> None:
        self.pushes.append(
            {"lr": lr, "grads": {k: (np.array(i), np.array(g)) for k, (i, g) in grads.items()}}
        )
        for name, (ids, g) in grads.items():
            spec = self.specs[name]
            ids = np.asarray(ids)
            w = self.w[name][ids]
            st = {k: v[ids] for k, v in self.state[name].items()}
            apply(spec.optimizer, w, st, np.asarray(g, dtype=w.dtype), *rate_of(lr, name))
            self.w[name][ids] = w
            for k, v in st.items():
                self.state[name][k][ids] = v


def _push_pull_async(
    self: LocalPS, updates: Any, lr: float, requests: Any, ahead: int = 0
) -> _Done:
    """Fused step: apply the push, then return the rows the next step needs (in one process
    a prefetch ``ahead`` gets the freshest rows)."""
    self.push_many(updates, lr)
    return _Done(self.pull_many(requests))


LocalPS.push_pull_async = _push_pull_async  # type: ignore[attr-defined]


@pytest.fixture
def local_ps_class() -> type[LocalPS]:
    return LocalPS
