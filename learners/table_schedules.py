"""A schedule per table: ``ml.opt.decay.<table>.*`` and ``ml.learn.rate.<table>``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from decay import StepSizeScheduler

__all__ = ["table_schedules"]


def table_schedules(
    conf: Mapping[str, Any], tables: Sequence[str], total: int
) -> dict[str, StepSizeScheduler]:
    """The tables with a schedule of their own (none yet)."""
    return {}
