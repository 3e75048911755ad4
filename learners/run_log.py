"""What a training run reports: console lines, a progress bar, metrics.jsonl and TensorBoard.

Every record is one JSON object per line of ``<angel.log.path>/metrics.jsonl``, with a ``kind``:
``step`` (one per ``angel.log.every.steps`` updates), ``epoch`` (after validation) and
``summary`` (the end of the run). Non-finite floats are written as ``null`` (JSON has no NaN).
TensorBoard, when asked for, gets the numeric fields of step and epoch records as scalars.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
from tqdm import tqdm

from angelps.config import ConfigError

__all__ = ["RunLog", "epoch_line", "jsonable"]


class RunLog:
    """Progress on a terminal (tqdm), plain lines otherwise, and the metrics.jsonl file."""

    def __init__(self, path: Path | None, quiet: bool = False, tensorboard: bool = False) -> None:
        self.tty = sys.stdout.isatty() and not quiet
        self.quiet = quiet
        self.file: IO[str] | None = None
        self.tb: Any = None
        if tensorboard:
            try:
                # An optional dependency (the tensorboard extra): imported only when asked for.
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError(
                    "angel.log.tensorboard=true needs the tensorboard package: "
                    "pip install 'angelps[tensorboard]'"
                ) from None
            self.tb = SummaryWriter(log_dir=str(path if path is not None else "runs"))
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
            self.file = open(path / "metrics.jsonl", "a", buffering=1)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def bar(self, epoch: int, epochs: int, updates: int) -> tqdm | None:
        """A progress bar of an epoch's updates, on a terminal only."""
        if not self.tty:
            return None
        return tqdm(total=updates, desc=f"epoch {epoch + 1}/{epochs}", unit="upd", leave=False)

    def record(self, obj: Mapping[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(jsonable(obj)) + "\n")
        if self.tb is not None and obj.get("kind") in ("step", "epoch"):
            # Step scalars on the update axis, epoch scalars on the epoch axis, as the plot verb.
            kind = str(obj["kind"])
            at = int(obj.get("step", 0) if kind == "step" else obj.get("epoch", 0))
            for name, value in obj.items():
                if name in ("kind", "step", "epoch") or isinstance(value, bool):
                    continue
                if isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(
                    value
                ):
                    self.tb.add_scalar(f"{kind}/{name}", float(value), at)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def epoch_line(row: Mapping[str, Any], epochs: int) -> str:
    """The console line of an epoch record."""
    parts = [
        f"epoch {row['epoch'] + 1}/{epochs}",
        f"lr {row['lr']:.4g}",
        f"train_loss {row['train_loss']:.4f}",
    ]
    for k in ("valid_logloss", "valid_auc", "valid_accuracy", "valid_rmse", "valid_r2"):
        if row.get(k) is not None:
            parts.append(f"{k} {row[k]:.4f}")
    parts.append(f"{row['train_samples_per_s']:.0f} samples/s")
    return "  ".join(parts)


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python numbers and non-finite floats as None."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
