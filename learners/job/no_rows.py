"""The error of a training input that leaves no row to train on, saying why (all lines blank,
all rows gone to validation, all lines malformed and skipped)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from angelconf.config import ConfigError

__all__ = ["no_rows_error"]


def no_rows_error(summaries: Sequence[Mapping[str, Any]]) -> ConfigError:
    """The error for workers' ``data_summary()`` s that hold no training row."""
    valid = sum(int(s["valid"]["rows"]) for s in summaries)
    skipped = sum(int(s.get("skipped_lines", 0)) for s in summaries)
    first = next((s["skipped_first"] for s in summaries if s.get("skipped_first")), "")
    if valid:
        why = (
            f" left for training (its {valid} row(s) all went to validation: "
            "ml.data.validate.ratio)"
        )
    elif skipped:
        why = (
            f": all {skipped} of its lines were malformed and skipped "
            f"(ml.data.skip.bad.lines=true); the first: {first}"
        )
    else:
        why = " (its lines are all blank)"
    return ConfigError("angel.train.data.path: the training input has no rows" + why)
