"""Whether and where a training job saves its model by default (a key module: standard
library and ``angelconf.config`` only; the save path and retention keys are learners.job.loop_options's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from angelconf.config import Key
from learners.data.options import VALIDATE_PATH, VALIDATE_RATIO

__all__ = ["KEYS", "SAVE_MODEL", "keep_best"]

SAVE_MODEL = Key(
    "angel.save.model",
    "bool",
    True,
    "Save the trained model after every epoch: into angel.save.model.path when it is set, "
    "else into the run's folder (<angel.log.path>/<job>-<time>/model). false: no checkpoint, "
    "even where angel.save.model.path is set.",
)

KEYS = [SAVE_MODEL]


def keep_best(asked: bool | None, conf: Mapping[str, Any]) -> bool:
    """angel.save.model.keep.best (``asked``); unset: whether the job has validation data, so
    that the best epoch's model is kept whenever there is a best epoch."""
    if asked is not None:
        return bool(asked)
    return bool(VALIDATE_PATH.read(conf)) or float(VALIDATE_RATIO.read(conf)) > 0
