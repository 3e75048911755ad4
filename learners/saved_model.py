"""A learner on disk: checkpoints written during training, resumed, or loaded for prediction.

A saved model is a PS checkpoint (``angelps.checkpoint``: the tables with their optimizer
state, renamed into place whole) whose manifest carries a ``learner`` section in its ``extra``:
the epoch, scheduler state, history, early-stopping state, the model's shape and table specs,
the job's explicitly set keys, and the worker-side state (dense layers, their optimizer state
and every worker's RNG stream, base64 inside the manifest). Invariant: because the worker-side
state travels inside the manifest, the PS checkpoint's atomic rename covers both halves, so a
reader never sees a new PS half with an old worker half.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from angelps import PSClient, checkpoint
from angelps.config import ConfigError
from learners.worker_group import WorkerGroup

__all__ = ["load_dense", "read_extra", "restore", "save"]


def save(path: str, ps: PSClient, workers: WorkerGroup, section: Mapping[str, Any]) -> None:
    """Checkpoint the PS tables and the workers' state, with ``section`` as the learner's part
    of the manifest (JSON-safe)."""
    info = dict(section)
    # The worker-side layers travel inside the manifest (an .npz, base64), so the PS
    # checkpoint's atomic rename covers them too: no window with mismatched halves.
    blob = workers.execute_single(0, "dense_state")
    info["dense_npz_b64"] = base64.b64encode(blob).decode("ascii")
    rngs = workers.execute("rng_state")
    info["worker_rng_b64"] = [base64.b64encode(r).decode("ascii") for r in rngs]
    ps.save(path, {"learner": info})


def restore(path: str, ps: PSClient, workers: WorkerGroup) -> dict[str, Any]:
    """Load a checkpoint into the PS and the workers (to resume it, or to start from its
    weights and optimizer state: ``angel.load.model.path``); the learner section of its
    manifest."""
    read_extra(Path(path))  # a clear error before the shards are touched
    info: dict[str, Any] = ps.load(path)["learner"]
    load_dense(info, workers)
    # Clocks restart at 0 after a load: hand the workers fresh clients.
    workers.attach_ps(ps)
    return info


def load_dense(info: Mapping[str, Any], workers: WorkerGroup) -> None:
    """The worker-side layers of a learner section into every worker (and, when the number of
    workers is the one that saved it, every worker's own RNG stream)."""
    blob = base64.b64decode(info["dense_npz_b64"])
    workers.execute("load_dense_state", blob)
    rngs = info.get("worker_rng_b64") or []
    if len(rngs) == len(workers):
        # Every worker continues its own dropout stream (resuming with the same W).
        workers.execute_each("set_rng_state", [(base64.b64decode(r),) for r in rngs])


def read_extra(path: Path) -> dict[str, Any]:
    """The ``extra`` of a saved model's manifest; ConfigError when ``path`` holds none."""
    try:
        manifest = checkpoint.read_manifest(str(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not a saved angelps model: {e}") from None
    extra = dict(manifest.get("extra", {}))
    if "learner" not in extra:
        raise ConfigError(f"{path} is a PS checkpoint without a model (no learner section)")
    return extra
