"""What a job does (``action.type``, Angel's submit) and on which paths: :class:`JobAction`.

A key module: standard library and ``angelconf.config`` only (the command line reads it before
torch and Ray load).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from angelconf.config import ConfigError, Key
from angelconf.options import keyed, read_keys
from learners.job.loop_options import LOAD_PATH

__all__ = ["ACTIONS", "KEYS", "LOCAL_MAX_ROWS", "PREDICT_OUT_FORMAT", "JobAction"]

_PREDICT_PATH = "angel.predict.data.path"  # declared in learners.data.options

ACTIONS = ("train", "predict", "evaluate", "train_predict", "inctrain")
ACTION_TYPE = Key(
    "action.type",
    "str",
    "train",
    "What the job does (Angel's submit): train; predict (angel.load.model.path on "
    "angel.predict.data.path into angel.predict.out.path); evaluate (the metrics of "
    "angel.load.model.path on the labelled angel.predict.data.path); train_predict (train, then "
    "predict with the trained model); inctrain (Angel's incremental training: train, starting "
    "from angel.load.model.path). Read by angelps submit; angelps train also predicts "
    "after training when it is train_predict (docs/angel-migration.md).",
    choices=ACTIONS,
)
PREDICT_OUT_PATH = Key(
    "angel.predict.out.path",
    "str",
    None,
    "Output of prediction: a .csv or .parquet file (by its suffix; another name is a "
    "directory that gets predictions.csv) with a pred column, one row per input row in "
    "input order; its directory must exist.",
)

LOCAL_MAX_ROWS = Key(
    "angel.predict.local.max.rows",
    "int",
    10000,
    "A model of GraphLearner.load(path) predicts in-memory inputs (arrays, tables, data "
    "frames) of at most this many rows in the calling process with torch alone, without "
    "starting Ray (the same predictions, to float rounding); larger inputs, files, evaluate "
    "and models without a standalone graph start Ray. 0: always Ray.",
    check=lambda v: None if v >= 0 else "an integer >= 0",
)

PREDICT_OUT_FORMAT = Key(
    "angel.predict.out.format",
    "str",
    "angelps",
    "Columns of a prediction file: angelps (sid with ml.data.sid=true, pred, label as the "
    "input wrote it) or angel (Angel's sid, pred, proba, label: the score, P(y=1) and the "
    "predicted label; docs/angel-migration.md).",
    choices=("angelps", "angel"),
)

KEYS = [ACTION_TYPE, PREDICT_OUT_PATH, LOCAL_MAX_ROWS, PREDICT_OUT_FORMAT]


def _optional(value: Any) -> Any:
    return value or None


@dataclass(frozen=True)
class JobAction:
    """What the job does and on which paths: ``action.type`` and the prediction keys."""

    action: str
    #: angel.load.model.path: the saved model that predicts or evaluates
    model_path: str | None = field(metadata=keyed(LOAD_PATH, _optional))
    #: angel.predict.data.path: the input of prediction and evaluation
    data_path: str | None
    #: angel.predict.out.path: where predictions go
    out_path: str | None = field(metadata=keyed(PREDICT_OUT_PATH, _optional))

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> JobAction:
        """The action of a job (a Config or a mapping; a missing key takes its default)."""
        action = str(ACTION_TYPE.read(conf))
        values = read_keys(cls, conf)
        if action == "inctrain":
            if not values["model_path"]:
                raise ConfigError(
                    "action.type=inctrain trains on from a saved model: set "
                    "angel.load.model.path to it"
                )
            action = "train"  # training starts from angel.load.model.path
        # angel.predict.data.path is the data module's key (read here by name: no import of it)
        return cls(action=action, data_path=conf.get(_PREDICT_PATH) or None, **values)
