"""A worker's predictions of a batch of rows, in chunks under ``torch.inference_mode``
(:meth:`learners.worker.train_worker.TrainWorker.predict_batch`: validation, ``predict`` and ``evaluate``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from learners.data import Batch, binary_labels01, line_of
from learners.models.sparse_input import SparseInput
from learners.models.zoo import BaseModel
from learners.worker.data_part import check_rows_labels
from learners.worker.step_stats import num_rows

__all__ = ["Predicts", "predict_rows"]

#: Rows per prediction chunk, in mini-batches (prediction keeps no activations for backward).
_PREDICT_BATCHES = 32

#: A batch's model input and labels (``labels=False``: none): ``TrainWorker._input``.
InputOf = Callable[..., tuple[SparseInput, "Tensor | None", Any, Any]]


def predict_rows(
    model: BaseModel,
    data: Batch,
    chunk: int,
    input_of: InputOf,
    amp: bool,
    rounds: tuple[Callable[[int], int], Callable[[], None]] | None = None,
) -> dict[str, Any]:
    """Predict every row of ``data`` in chunks of ``chunk`` rows: predictions, class
    probabilities (multiclass), labels (binary ones as 0/1; None when unlabelled), the loss's
    sum over the rows, the row count and the rows' input positions.

    ``rounds`` (tables held by several workers, whose reads are collectives): (the most
    chunks of any worker, given this one's; one read without rows), so that every worker
    reads as often as the others."""
    model.eval()
    task = model.task
    n = num_rows(data)
    preds: list[np.ndarray] = []
    scores_out: list[np.ndarray] = []
    loss_sum = 0.0
    raw = getattr(data, "labels", None)
    # Unlabelled rows (ml.data.has.label=false, in-memory inputs) carry NaN labels.
    has_labels = raw is not None and n > 0 and not bool(np.isnan(raw).all())
    with torch.inference_mode():
        if rounds is not None:
            mine = -(-n // chunk)
            for _ in range(rounds[0](mine) - mine):
                rounds[1]()
        for lo in range(0, n, chunk):
            b = data.take(np.arange(lo, min(n, lo + chunk)))
            x, y, _req, _ = input_of(b, labels=has_labels)
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                scores = model(x).float()
            preds.append(model.predict(scores).cpu().numpy())
            if task == "multiclass":
                # multiclass metrics need the class probabilities
                scores_out.append(torch.softmax(scores, dim=1).cpu().numpy())
            if has_labels:
                assert y is not None
                loss_sum += float(model.loss(scores, y)) * num_rows(b)
    model.train()
    labels = np.asarray(data.labels, dtype=np.float32) if has_labels else None
    if labels is not None and task == "binary":
        labels = np.asarray(binary_labels01(labels), dtype=np.float32)
    return {
        "pred": np.concatenate(preds) if preds else np.zeros(0, dtype=np.float32),
        "prob": np.concatenate(scores_out) if scores_out else None,
        "labels": labels,
        # as the input wrote them (a -1/+1 file stays -1/+1): what prediction files show
        "labels_read": np.asarray(data.labels, dtype=np.float32) if has_labels else None,
        "loss_sum": loss_sum,
        "rows": n,
        "row_index": np.asarray(data.row_index)
        if getattr(data, "row_index", None) is not None
        else None,
    }


class Predicts:
    """The evaluation part of :class:`learners.worker.train_worker.TrainWorker`: validation
    and prediction of a batch or a file, through the worker's own input path."""

    model: BaseModel | None
    part: Any
    plan: Any
    amp: bool
    held: Any

    #: the worker's input of a batch (rows read), and its prediction rounds (held tables)
    _input: InputOf
    #: the model's check of labels (ValueError for one it cannot take): TrainWorker's
    _check_labels: Callable[[np.ndarray], None]
    _rounds: Callable[[], tuple[Callable[[int], int], Callable[[], None]] | None]

    def validate(self, chunk: int = 4096) -> dict[str, Any]:
        """Predictions, labels and the mean loss on this worker's validation rows."""
        return self.predict_batch(self.part.valid, chunk)

    def predict_batch(self, data: Batch, chunk: int = 4096) -> dict[str, Any]:
        """Predict every row of ``data`` in chunks (:func:`predict_rows`); device tiers read
        without pinning (learners/worker/device_tier.py)."""
        assert self.model is not None
        self.held.train(False)
        return predict_rows(self.model, data, chunk, self._input, self.amp, self._rounds())

    def predict_input(self, data: Batch, what: str) -> dict[str, Any]:
        """Predict rows given in memory (``what``: their kind, ``DataFrame``), a label the model
        cannot take first raised as a DataError naming its row (``DataFrame row 3: ...``)."""
        check_rows_labels(data, self._check_labels, lambda i: f"{what} row {i}")
        return self.predict_batch(data)

    def predict_file(self, path: str) -> dict[str, Any]:
        """Read a file (this worker's part) and predict it, a label the model cannot take
        first raised as a DataError naming its file and line, as training does
        (:meth:`learners.worker.data_part.DataPart.check_labels`)."""
        data = self.part.load_file(path)
        opts = self.part.opts
        check_rows_labels(data, self._check_labels, lambda i: line_of(path, opts, i))
        return self.predict_batch(data, self.plan.minibatch_size * _PREDICT_BATCHES)
