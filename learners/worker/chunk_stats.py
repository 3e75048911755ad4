"""What one ``run_steps`` chunk of a worker reports to the driver: :class:`StepStats`.

Torch-free on purpose: the driver unpickles it (Ray returns it from the worker) and must not
load torch (tests/test_layering.py). It carries no schedule state: the driver keeps its rate plan
in step from ``updates`` (learners/job/rate_plan.py). The driver reads it by attribute
(:meth:`learners.job.train_loop.TrainingLoop.run_epoch`, :func:`learners.runs.progress.merge_chunks`,
:func:`learners.runs.run_log.step_record`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StepStats"]


@dataclass
class StepStats:
    """What one ``run_steps`` chunk did (summed over its updates)."""

    updates: int = 0
    skipped: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    pull_s: float = 0.0
    compute_s: float = 0.0
    push_s: float = 0.0
    wait_s: float = 0.0
    elapsed_s: float = 0.0
    last_lr: float = 0.0
    #: the last update's momentum and tables' own rates (learners.job.rate_plan.UpdateRates.record)
    last_rates: dict[str, float] = field(default_factory=dict)
    #: rows looked up in / served by the worker cache, and step-call bytes moved
    cache_on: bool = False
    cache_lookups: int = 0
    cache_hits: int = 0
    bytes_moved: int = 0
    #: a device tier's rows read, found on the device, fetched and written back
    #: (learners/worker/device_tier.py)
    tier_on: bool = False
    tier_lookups: int = 0
    tier_hits: int = 0
    tier_misses: int = 0
    tier_writebacks: int = 0
    #: seconds the training thread waited for the device tiers' work in other threads and
    #: processes (TierCounts.wait_s)
    tier_wait_s: float = 0.0
    #: of it, waiting for the shards' answers itself; the update thread's own waits for them
    tier_wait_shards_s: float = 0.0
    tier_ahead_wait_s: float = 0.0
    #: the training thread's wait for the update thread to have run the update before
    tier_wait_update_s: float = 0.0
