"""Clocks for BSP, SSP and ASP (``angel.staleness``, declared in :mod:`angelps.options`), as a
pure class the shard consults.

A worker's clock ``c`` is the number of pushes it has made (one push = one step; a step with
nothing to push still calls ``PSClient.clock()``). Every push is tagged with the clock it
belongs to; a pull is tagged with the worker's current clock.

* **BSP** (``staleness == 0``): the shard buffers the pushes of clock ``c`` from all ``W``
  workers, sums them, and applies ONE optimizer update on the sum when the last one arrives.
  A pull at clock ``c`` returns only after the updates of clocks ``0 .. c-1`` are applied, i.e.
  after every worker has pushed for clock ``c-1``.
* **SSP** (``staleness = s > 0``): each push is applied as it arrives. A pull at clock ``c``
  waits until every worker has pushed clocks ``0 .. c-s-1``: it never misses an update older
  than ``c - s``.
* **ASP** (``staleness < 0``): pushes are applied as they arrive and pulls never wait.

In every mode a worker reads its own writes: a pull at clock ``c`` waits for that worker's own
pushes ``0 .. c-1``, and a worker's pushes are applied in clock order even if Ray delivers them
out of order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ClockTable", "mode_name"]


def mode_name(staleness: int) -> str:
    """BSP, SSP or ASP."""
    return "BSP" if staleness == 0 else ("SSP" if staleness > 0 else "ASP")


@dataclass
class ClockTable:
    """Per-shard clock bookkeeping for ``num_workers`` workers."""

    num_workers: int
    staleness: int = 0
    pushed: list[int] = field(default_factory=list)
    applied: int = 0  # BSP: aggregated updates applied (= clocks complete on this shard)

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"number of workers must be >= 1, got {self.num_workers}")
        if not self.pushed:
            self.pushed = [0] * self.num_workers
        elif len(self.pushed) != self.num_workers:
            raise ValueError("pushed clocks must have one entry per worker")

    @property
    def bsp(self) -> bool:
        return self.staleness == 0

    def can_prefetch(self, pull_clock: int) -> bool:
        """A prefetch read for ``pull_clock`` may be served: SSP's bound at that clock over
        every worker's pushes (ASP: always). BSP has no prefetch (angel.worker.prefetch.depth
        is 1)."""
        if self.staleness < 0:
            return True
        if self.staleness == 0:
            raise ValueError(
                "a prefetch (a pull for a later clock) needs angel.staleness != 0: under BSP "
                "set angel.worker.prefetch.depth=1"
            )
        return bool(min(self.pushed) >= pull_clock - self.staleness)

    def check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.num_workers:
            raise ValueError(
                f"worker id {worker} is out of range: this job has {self.num_workers} worker(s) "
                f"(ids 0 .. {self.num_workers - 1})"
            )

    def can_push(self, worker: int, clock: int) -> bool:
        """A worker's push for ``clock`` may be applied (its earlier pushes are)."""
        return self.pushed[worker] == clock

    def stale_push(self, worker: int, clock: int) -> bool:
        """A push for a clock this worker has already pushed (a retry after a restart)."""
        return clock < self.pushed[worker]

    def can_pull(self, worker: int, clock: int) -> bool:
        """A pull by ``worker`` at ``clock`` may be served now."""
        if self.pushed[worker] < clock:
            return False  # read your own writes
        if self.staleness < 0:
            return True
        if self.staleness == 0:
            return self.applied >= clock
        return min(self.pushed) >= clock - self.staleness

    def record_push(self, worker: int) -> None:
        self.pushed[worker] += 1

    def complete_clock(self) -> bool:
        """BSP: True when every worker has pushed clock ``applied`` (apply, then call
        :meth:`mark_applied`)."""
        return min(self.pushed) > self.applied

    def mark_applied(self) -> None:
        self.applied += 1

    def describe(self) -> str:
        return f"{mode_name(self.staleness)}: pushed clocks per worker {self.pushed}, " + (
            f"updates applied {self.applied}" if self.bsp else f"staleness {self.staleness}"
        )

    def to_dict(self) -> dict[str, object]:
        return {"pushed": list(self.pushed), "applied": self.applied}
