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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
from tqdm import tqdm

from angelps import OptimizerSpec, PSOptions, TableSpec
from angelps.config import Config, ConfigError
from decay import StepSizeScheduler
from learners.plan import JobSize, TrainPlan

__all__ = ["RunLog", "banner", "epoch_line", "jsonable", "step_record"]


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


def step_record(
    epoch: int, step: int, updates: int, outs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The metrics.jsonl record of one ``run_steps`` chunk (timings of worker 0)."""
    o0 = outs[0]
    samples = sum(o["samples"] for o in outs)
    return {
        "kind": "step",
        "epoch": epoch,
        "step": step,
        "updates": updates,
        "lr": o0["last_lr"],
        "loss": sum(o["loss_sum"] for o in outs) / max(samples, 1),
        "samples_per_s": samples / max(max(o["elapsed_s"] for o in outs), 1e-9),
        "pull_s": o0["pull_s"],
        "compute_s": o0["compute_s"],
        "push_s": o0["push_s"],
        # waiting for the rows of a fused push_pull already in flight
        "wait_s": o0["wait_s"],
        "elapsed_s": o0["elapsed_s"],
        "skipped": o0["skipped"],
        **feed_record(updates, outs),
    }


def feed_record(updates: int, outs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The data plane's share of a step record: bytes of step calls per update (all workers,
    requests and replies), and the worker cache's hit rate when it is on."""
    rec: dict[str, Any] = {
        "bytes_per_step": sum(o.get("bytes_moved", 0) for o in outs) / max(updates, 1)
    }
    if any(o.get("cache_on") for o in outs):
        lookups = sum(o.get("cache_lookups", 0) for o in outs)
        hits = sum(o.get("cache_hits", 0) for o in outs)
        rec["cache_hit_rate"] = hits / lookups if lookups else None
    return rec


def banner(
    conf: Config,
    plan: TrainPlan,
    ps: PSOptions,
    size: JobSize,
    tables: Sequence[TableSpec],
    model: str,
    dense_params: int,
    sched: StepSizeScheduler | None,
) -> str:
    """The screen at the start of training: data, tables, dense layers, batch and schedule."""
    w = plan.workers
    b, k = size.batch_size, plan.accum
    lines = [
        f"angelps train: {model}  ({conf.source('ml.model.class.name')})",
        f"  data     {conf['angel.train.data.path']}: {sum(size.train_rows)} train rows, "
        f"{sum(size.valid_rows)} validation rows, {size.num_features} features"
        + (f", {size.num_fields} fields" if size.num_fields else "")
        + (f", {size.skipped_lines} bad lines skipped" if size.skipped_lines else ""),
        f"  tables   on {ps.num_shards} shard(s), sparse keys "
        f"{ps.partitioner}-partitioned, staleness {ps.staleness}:",
    ]
    for t in tables:
        kind = "sparse" if t.sparse else "dense"
        lines.append(
            f"    {t.name:<20} {kind:<6} {t.rows} x {t.cols}  {t.optimizer.name}"
            f"  init {t.init}{'' if t.init == 'zeros' else f'({t.init_std:g})'}"
        )
    if dense_params and plan.dense_placement == "ps":
        lines.append(f"  dense    {dense_params} parameters in dense.* tables on the PS")
    elif dense_params:
        opt = OptimizerSpec.from_conf(conf, "ml.fclayer.optimizer").name
        lines.append(
            f"  dense    {dense_params} parameters on the workers ({opt}"
            + (", all-reduced over gloo)" if w > 1 else ")")
        )
    if plan.amp and plan.device != "cuda":
        lines.append(
            "  amp      ml.amp=true ignored: mixed precision needs angel.worker.device=cuda"
        )
    elif plan.amp:
        lines.append("  amp      fp16 autocast with a dynamic loss scale (starts at 65536)")
    lines += [
        f"  workers  {w}; effective batch = {b} x {w} workers x {k} accum = {b * w * k}",
        f"  updates  {size.updates_per_epoch} per epoch x {plan.epochs} epochs "
        f"= {size.updates_per_epoch * plan.epochs}",
    ]
    if sched is not None:
        per = "update" if plan.decay_on_batch else "epoch"
        first = ", ".join(f"{sched.lr_at(i):.4g}" for i in range(4))
        lines.append(f"  decay    {sched.describe()} per {per}: {first}, ...")
    return "\n".join(lines)


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
