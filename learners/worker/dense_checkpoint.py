"""A worker's side of its checkpoints: the dense layers, their optimizer state, the loss
scale and the RNG stream (:class:`DenseCheckpoint`, a part of
:class:`learners.worker.train_worker.TrainWorker`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from learners.worker.dense import load_dense, save_dense

__all__ = ["DenseCheckpoint"]


class DenseCheckpoint:
    """The worker-side state a checkpoint holds; the worker sets the attributes it reads."""

    model: Any
    opt: Any
    loss_scale: float
    good_steps: int

    def dense_state(self) -> bytes:
        """Dense layers, dense optimizer state and RNG state as one ``.npz`` (no pickle)."""
        assert self.model is not None
        return save_dense(self.model, self.opt, self.loss_scale, self.good_steps)

    def rng_state(self) -> bytes:
        """This worker's torch RNG state (dropout): each worker has its own stream."""
        return bytes(torch.get_rng_state().numpy().tobytes())

    def set_rng_state(self, state: bytes) -> None:
        torch.set_rng_state(torch.from_numpy(np.frombuffer(state, dtype=np.uint8).copy()))

    def load_dense_state(self, blob: bytes) -> None:
        """Restore what :meth:`dense_state` wrote."""
        assert self.model is not None
        self.loss_scale, self.good_steps = load_dense(blob, self.model, self.opt, self.loss_scale)
