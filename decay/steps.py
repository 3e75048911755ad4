"""How many optimizer updates an epoch makes: the unit a schedule counts.

A schedule advances once per optimizer update: after all micro-batches of a gradient
accumulation, never per micro-batch, and not for an update that was skipped (AMP found inf/NaN).
"""

from __future__ import annotations

__all__ = ["updates_per_epoch"]


def _int_at_least(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            f"updates_per_epoch: {name}={value!r} is not valid: expected an integer >= {low}"
        )
    return value


def updates_per_epoch(
    num_samples: int,
    batch_size: int,
    workers: int,
    accum_steps: int,
    drop_last: bool = False,
) -> int:
    """Optimizer updates per epoch for data-parallel workers in lock step.

    Each of ``workers`` workers reads its part of ``num_samples`` (the largest part,
    ``⌈num_samples/workers⌉``, sets the pace) in micro-batches of ``batch_size`` and makes one
    update per ``accum_steps`` micro-batches, so one update consumes
    ``batch_size × workers × accum_steps`` samples. With ``drop_last`` a trailing partial
    micro-batch and a trailing partial accumulation are dropped (floor); without it they still
    make an update (ceil), as the training loop flushes the last accumulation of an epoch.

    >>> updates_per_epoch(1000, batch_size=32, workers=2, accum_steps=4)
    4
    """
    _int_at_least("num_samples", num_samples, 0)
    _int_at_least("batch_size", batch_size, 1)
    _int_at_least("workers", workers, 1)
    _int_at_least("accum_steps", accum_steps, 1)
    if drop_last:
        per_worker = num_samples // workers
        return (per_worker // batch_size) // accum_steps
    per_worker = -(-num_samples // workers)
    micro = -(-per_worker // batch_size)
    return -(-micro // accum_steps)
