"""Predictions of a loaded model in the calling process, with torch alone (no Ray, no PS).

``GraphLearner.load(path)`` builds a :class:`LocalModel` (learners/runs/standalone.py: the tables
and layers of the checkpoint in one torch module) and predicts in-memory inputs of at most
``angel.predict.local.max.rows`` rows with it; files, larger inputs and ``evaluate`` start
Ray as before. The inputs are read and checked as the Ray path reads them
(learners/job/predict_inputs.py), so bad rows give the same one-line errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from angelconf.config import Config, ConfigError
from angelps.file_store import files_for
from learners.data import DataOptions, binary_labels01
from learners.job import saved_model
from learners.job.action import LOCAL_MAX_ROWS
from learners.job.predict_inputs import InMemory, check_ids, is_path, to_batch
from learners.models.registry import model_entry
from learners.runs.export import export_size
from learners.runs.standalone import Standalone, load_standalone, padded

__all__ = ["LOCAL_MAX_BYTES", "LocalModel"]

#: Keys that place or equip the worker: a job setting one predicts on its actors.
_PLACED = (
    "angel.worker.resources",
    "angel.placement.strategy",
    "angel.worker.gpus",
    "angel.worker.device",
)
#: A model larger than this (its tables in memory) predicts through its actors only.
LOCAL_MAX_BYTES = 256 * 2**20


def _rows(data: Any) -> int | None:
    """Rows of an in-memory input (None for a path or something else)."""
    if is_path(data):
        return None
    if isinstance(data, np.ndarray):
        return 1 if data.ndim == 1 else int(data.shape[0])
    if isinstance(data, pa.Table):
        return int(data.num_rows)
    if type(data).__module__.startswith("pandas"):
        return len(data)
    return None


class LocalModel:
    """A saved model predicting in this process (module docstring)."""

    def __init__(self, module: Standalone, conf: Config, info: dict[str, Any], max_rows: int):
        self.module = module
        self.conf = conf
        self.data = DataOptions.from_config(conf)  # the saved model's job: read once
        self.max_rows = max_rows
        self.num_features = int(info["num_features"])
        self.task = model_entry(str(info["model"])).task

    @classmethod
    def maybe(cls, conf: Config, path: str) -> LocalModel | None:
        """The model at ``path`` in-process, or None when it predicts through Ray only
        (the key is 0, a model class without a standalone graph)."""
        max_rows = int(LOCAL_MAX_ROWS.read(conf))
        # (a model in-process is read from the disk: one on object storage predicts through Ray)
        if max_rows <= 0 or files_for(path).disk_path(path) is None:
            return None
        if export_size(path) > LOCAL_MAX_BYTES:
            return None
        if any(conf.is_set(k) for k in _PLACED):
            return None  # a job that places its worker runs on it
        try:
            info = saved_model.read_extra(path)["learner"]
            module = load_standalone(path, conf)
            return cls(module, saved_model.inference_conf(conf, info, path), info, max_rows)
        except ConfigError:
            # no standalone graph, or a job that does not fit the model: the actors' load
            # says which, as it always has
            return None

    def takes(self, data: Any) -> bool:
        """Whether ``data`` is an in-memory input small enough to predict here."""
        rows = _rows(data)
        return rows is not None and rows <= self.max_rows

    def predict(self, data: InMemory, labels: Any = None) -> dict[str, np.ndarray]:
        """As ``GraphLearner.predict``: ``pred`` (and ``label`` when the rows have labels)."""
        batch = to_batch(data, self.data, labels)
        check_ids(batch, self.num_features, data)
        ids, values = padded(batch.indptr, batch.ids, batch.values)
        try:
            with torch.inference_mode():
                pred = self.module(ids, values).numpy().astype(np.float32, copy=False)
        except (ValueError, RuntimeError) as e:  # a field model's row of the wrong length
            raise ConfigError(f"{type(data).__name__}: {str(e).strip().splitlines()[-1]}") from None
        out = {"pred": pred, "row_index": np.asarray(batch.row_index, dtype=np.int64)}
        if len(batch) and not np.isnan(batch.labels).all():
            if self.task == "binary":
                binary_labels01(batch.labels)  # the Ray path's check of binary labels
            out["label"] = np.asarray(batch.labels, dtype=np.float32)  # as given
        return out
