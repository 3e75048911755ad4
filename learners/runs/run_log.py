"""What a training run reports: console lines, the progress bar, metrics.jsonl, TensorBoard.

Each run writes to its own directory (:mod:`learners.runs.folders`). Every record is one JSON object per
line of ``<run>/metrics.jsonl``, with a ``kind``: ``start`` (the job, its model and settings),
``step`` (one per ``angel.log.every.steps`` updates), ``epoch`` (after validation; ``step`` is
the global update at its end) and ``summary`` (the end of the run, also ``<run>/summary.json``;
its ``run_dir`` is the run's URL when ``angel.log.path`` is on object storage).
Non-finite floats are written as ``null`` (JSON has no NaN). Each epoch has one ``epoch``
record and each global update at most one ``step`` record, even when a worker's death restarts
the job from its last checkpoint and an epoch (or the end of one, and its save) runs again: the
records of what was logged before the restart are not written again (a restart from a
checkpoint reproduces them: docs/checkpoints.md). TensorBoard, when asked for, gets
``train/*`` and ``valid/*`` scalars on the global update (:func:`tb_scalars`), seconds per
phase as ``time/*``, and the job's keys once as text.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from angelconf.config import Config, ConfigError
from angelconf.printable import printable, printable_lines
from angelps import OptimizerSpec, PSOptions, TableSpec
from decay import StepSizeScheduler
from learners.job.job_size import JobSize
from learners.job.loop_options import TrainPlan
from learners.job.rate_plan import RatePlan
from learners.runs.folders import METRICS, SUMMARY, run_url, upload_run
from learners.runs.log_store import run_logs_for
from learners.runs.progress import JobBar, PlainProgress, in_notebook
from learners.worker.chunk_stats import StepStats

__all__ = [
    "RunLog",
    "banner",
    "done_line",
    "epoch_line",
    "jsonable",
    "start_record",
    "step_record",
    "tb_scalars",
]

# Step fields that are not curves of training: positions and counts.
_NOT_SCALARS = ("kind", "epoch", "step", "updates", "skipped", "elapsed_s")
_TIMES = ("pull_s", "compute_s", "push_s", "wait_s")


def tb_scalars(obj: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The TensorBoard (tag, value) pairs of one record: a step line gives ``train/loss``,
    ``train/lr``, ``train/samples_per_s`` and ``time/*``; an epoch line ``train/epoch_loss``
    and ``valid/<metric>`` (not the row counts); other kinds nothing."""
    kind = obj.get("kind")
    out: list[tuple[str, float]] = []
    for name, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            continue
        if not math.isfinite(float(value)):
            continue
        if kind == "step" and name not in _NOT_SCALARS:
            out.append((f"time/{name}" if name in _TIMES else f"train/{name}", float(value)))
        elif kind == "epoch" and name == "train_loss":
            out.append(("train/epoch_loss", float(value)))
        elif kind == "epoch" and name.startswith("valid_"):
            if not name.endswith(("_rows", "_count")):
                out.append((f"valid/{name.removeprefix('valid_')}", float(value)))
    return out


def _terminal() -> bool:
    """Whether the console is a terminal (the progress bar is drawn on one only)."""
    return sys.stdout.isatty()


class RunLog:
    """The console (plain lines, and the whole-job bar on a terminal), the run's metrics.jsonl
    and its TensorBoard events."""

    def __init__(
        self,
        path: Path | None,
        quiet: bool = False,
        tensorboard: bool = False,
        *,
        tty: bool | None = None,
        progress_s: float = 0.0,
        upload_to: str | None = None,
    ) -> None:
        """``progress_s``: seconds between plain progress lines off a terminal (0: none)."""
        #: a Jupyter kernel: tqdm's notebook widget (its output is no terminal)
        self.notebook = tty is None and in_notebook() and not quiet
        self.tty = ((_terminal() if tty is None else tty) and not quiet) or self.notebook
        self.progress_s = progress_s
        self.quiet = quiet
        self.path = path
        self.file: IO[str] | None = None
        self.tb: Any = None
        self.progress: JobBar | PlainProgress | None = None
        #: a log path on object storage: the run (written locally) is copied there
        self.upload_to = run_logs_for(upload_to).upload_to if upload_to else None
        #: something was written since the last copy (each copy sends every file whole)
        self._unsent = False
        #: the epochs with an epoch record, and the last global update with a step record
        self._epochs: set[int] = set()
        self._last_step = -1
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
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
            self.file = open(path / METRICS, "a", buffering=1)

    def say(self, text: str) -> None:
        """Lines on stdout (above the bar, when there is one); the control characters of a
        path or a value in them escaped."""
        if self.quiet:
            return
        text = printable_lines(text)
        if self.progress is not None:
            self.progress.write(text)
        else:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        """A warning on stderr (above the bar, when there is one), even when quiet; control
        characters (from a path or a value) escaped."""
        text = printable(text)
        if self.progress is not None:
            self.progress.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def bar(
        self, total: int, done: int, epochs: int, updates_per_epoch: int
    ) -> JobBar | PlainProgress | None:
        """The whole-job progress: the bar on a terminal, else a plain line every
        ``progress_s`` seconds (none when quiet or 0); :meth:`close_bar` closes it."""
        if self.progress is None and self.tty:
            self.progress = JobBar(
                total, done, epochs, updates_per_epoch, file=None, notebook=self.notebook
            )
        elif self.progress is None and not self.quiet and self.progress_s > 0:
            self.progress = PlainProgress(total, done, epochs, updates_per_epoch, self.progress_s)
        return self.progress

    def close_bar(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    def config_text(self, conf: Config) -> None:
        """The job's keys (those set, and where), once, as TensorBoard text."""
        if self.tb is None:
            return
        rows = [
            f"| {k} | {v} | {conf.source(k)} |"
            for k, v in sorted(conf.to_properties().items())
            if conf.is_set(k)
        ]
        self.tb.add_text("config", "\n".join(["| key | value | from |", "|---|---|---|", *rows]), 0)

    def record(self, obj: Mapping[str, Any]) -> None:
        """One record into metrics.jsonl (and TensorBoard); an epoch or step record that was
        written already (the job restarted from a checkpoint and ran it again) is not."""
        if self._written(obj):
            return
        self._unsent = True
        if self.file is not None:
            self.file.write(json.dumps(jsonable(_as_written(obj))) + "\n")
        if self.tb is not None and obj.get("kind") in ("step", "epoch") and "step" in obj:
            at = int(obj["step"])
            for tag, value in tb_scalars(obj):
                self.tb.add_scalar(tag, value, at)
        if obj.get("kind") == "epoch":
            self.upload()

    def _written(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is an epoch or step record written before (and note it if not)."""
        kind, epoch, step = obj.get("kind"), obj.get("epoch"), obj.get("step")
        if kind == "epoch" and isinstance(epoch, (int, np.integer)):
            if int(epoch) in self._epochs:
                return True
            self._epochs.add(int(epoch))
        elif kind == "step" and isinstance(step, (int, np.integer)):
            if int(step) <= self._last_step:
                return True
            self._last_step = int(step)
        return False

    def upload(self) -> bool:
        """Copy the run to ``upload_to`` (object storage); False when that failed. A failure is
        a warning naming the local copy, never the end of the job (the next upload copies
        everything again)."""
        if self.upload_to is None or self.path is None or not self._unsent:
            return True
        if self.tb is not None:
            self.tb.flush()
        try:
            upload_run(self.path, self.upload_to)
            self._unsent = False
        except OSError as e:
            self.warn(
                f"angelps: warning: cannot copy the run to {self.upload_to}: {e}; "
                f"it is kept in {self.path}"
            )
            return False
        return True

    def write_summary(self, summary: MutableMapping[str, Any]) -> None:
        """The summary as a line of metrics.jsonl and as ``summary.json`` in the run directory.

        A run on object storage is copied there at once, and ``summary["run_dir"]`` set, in
        place, to its URL: the done line and the job's result then name where the run is, not
        the staging folder; the local copy if the copy failed (the warning says so)."""
        if self.upload_to is not None and self.path is not None:
            summary["run_dir"] = run_url(self.upload_to, self.path.name)
        self.record({"kind": "summary", **summary})
        if self.path is not None:
            (self.path / SUMMARY).write_text(json.dumps(jsonable(summary), indent=2) + "\n")
        if not self.upload():
            summary["run_dir"] = str(self.path)

    def close(self) -> None:
        self.close_bar()
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None
            self._unsent = True  # TensorBoard's last events
        self.upload()  # what is new since the summary's copy, if anything
        self.upload_to = None  # once: close may be called again


def _as_written(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record as metrics.jsonl holds it: ``epoch`` of step and epoch lines counted from 1,
    as the console and the plots count (the start line says so: ``epoch_base`` 1)."""
    if obj.get("kind") in ("step", "epoch") and isinstance(obj.get("epoch"), int):
        return {**obj, "epoch": obj["epoch"] + 1}
    return obj


def start_record(
    run: str, conf: Config, plan: TrainPlan, size: JobSize, model: str, first_epoch: int
) -> dict[str, Any]:
    """The first line of a run's metrics.jsonl: the job, its model and the settings that the
    plot's title and legend show."""
    return {
        "kind": "start",
        "epoch_base": 1,  # the epoch of every step and epoch line counts from 1
        "run": run,
        "job": str(conf["angel.job.name"]),
        "model": model,
        "first_epoch": first_epoch + 1,  # counted from 1, as every epoch of the file
        "epochs": plan.epochs,
        "updates_per_epoch": size.updates_per_epoch,
        "global_batch": size.batch_size * plan.workers * plan.accum,
        "workers": plan.workers,
        "lr": conf["ml.learn.rate"],
        "decay": conf["ml.opt.decay.class.name"],
        "decay_on_batch": plan.decay_on_batch,
        "decay_unit": conf["ml.opt.decay.unit"],
    }


def step_record(epoch: int, step: int, updates: int, outs: Sequence[StepStats]) -> dict[str, Any]:
    """The metrics.jsonl record of one ``run_steps`` chunk (timings of worker 0)."""
    o0 = outs[0]
    samples = sum(o.samples for o in outs)
    return {
        "kind": "step",
        "epoch": epoch,
        "step": step,
        "updates": updates,
        "lr": o0.last_lr,
        # momentum, lr/<table>, momentum/<table>, schedule_at (learners/job/rate_plan.py)
        **o0.last_rates,
        "loss": sum(o.loss_sum for o in outs) / max(samples, 1),
        "samples_per_s": samples / max(max(o.elapsed_s for o in outs), 1e-9),
        "pull_s": o0.pull_s,
        "compute_s": o0.compute_s,
        "push_s": o0.push_s,
        # waiting for the rows of a fused push_pull already in flight
        "wait_s": o0.wait_s,
        "elapsed_s": o0.elapsed_s,
        "skipped": o0.skipped,
        **feed_record(updates, outs),
    }


def feed_record(updates: int, outs: Sequence[StepStats]) -> dict[str, Any]:
    """The data plane's share of a step record: bytes of step calls per update (all workers,
    requests and replies), and the worker cache's hit rate when it is on."""
    rec: dict[str, Any] = {"bytes_per_step": sum(o.bytes_moved for o in outs) / max(updates, 1)}
    if any(o.cache_on for o in outs):
        lookups = sum(o.cache_lookups for o in outs)
        hits = sum(o.cache_hits for o in outs)
        rec["cache_hit_rate"] = hits / lookups if lookups else None
    if any(o.tier_on for o in outs):
        lookups = sum(o.tier_lookups for o in outs)
        rec["tier_hit_rate"] = sum(o.tier_hits for o in outs) / lookups if lookups else None
        rec["tier_misses_per_step"] = sum(o.tier_misses for o in outs) / max(updates, 1)
        rec["tier_writebacks_per_step"] = sum(o.tier_writebacks for o in outs) / max(updates, 1)
        # (worker 0's, as the phases above: of its elapsed_s, the part its tiers kept it waiting)
        rec["tier_wait_s"] = outs[0].tier_wait_s
        rec["tier_wait_shards_s"] = outs[0].tier_wait_shards_s
        rec["tier_ahead_wait_s"] = outs[0].tier_ahead_wait_s
        rec["tier_wait_update_s"] = outs[0].tier_wait_update_s
    return rec


def banner(
    conf: Config,
    plan: TrainPlan,
    ps: PSOptions,
    size: JobSize,
    tables: Sequence[TableSpec],
    model: str,
    dense_params: int,
    sched: RatePlan | StepSizeScheduler | None,
    where: Mapping[str, str] | None = None,
) -> str:
    """The screen at the start of training: data, tables, dense layers, batch and schedule.
    ``where``: table name → where it lives and why (angel.sparse.placement)."""
    w = plan.workers
    b, k = size.batch_size, plan.accum
    lines = [
        f"angelps train: {model}  ({conf.source('ml.model.class.name')})",
        f"  data     {conf['angel.train.data.path']}: {sum(size.train_rows)} train rows, "
        f"{sum(size.valid_rows)} validation rows, {size.num_features} features"
        + (f", {size.num_fields} fields" if size.num_fields else "")
        + (f", {size.skipped_lines} bad lines skipped" if size.skipped_lines else "")
        + (f" (first: {size.skipped_first})" if size.skipped_first else ""),
        f"  tables   on {ps.num_shards} shard(s), sparse keys "
        f"{ps.partitioner}-partitioned, staleness {ps.staleness}:",
    ]
    for t in tables:
        kind = "sparse" if t.sparse else "dense"
        lines.append(
            f"    {t.name:<20} {kind:<6} {t.rows} x {t.cols}  {t.optimizer.name}"
            f"  init {t.init}{'' if t.init == 'zeros' else f'({t.init_std:g})'}"
        )
        if where and t.name in where:
            lines.append(f"      {where[t.name]}")
    if dense_params and plan.dense_placement == "ps":
        lines.append(f"  dense    {dense_params} parameters in dense.* tables on the PS")
    elif dense_params:
        opt = OptimizerSpec.from_conf(conf, "ml.fclayer.optimizer").name
        lines.append(
            f"  dense    {dense_params} parameters on the workers ({opt}"
            + (f", all-reduced over {plan.collective})" if w > 1 else ")")
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
    if isinstance(sched, RatePlan):  # the job's schedule, then each table's own
        lines += [f"  decay    {x}" for x in sched.describe()]
    elif sched is not None:
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


def done_line(summary: Mapping[str, Any]) -> str:
    """The last console line of a run: epochs, time, the final validation metrics, the best
    epoch and where its checkpoint is, the checkpoint, the run directory."""
    s = summary
    parts = [f"{s['epochs']} epochs", f"{s['elapsed_s']:.1f} s"]
    for k in ("valid_auc", "valid_logloss", "valid_accuracy", "valid_rmse", "valid_r2"):
        v = s.get(k)
        if v is not None:
            parts.append(f"{k} {v:.4f}")
    line = "done: " + ", ".join(parts)
    if s.get("best_epoch") is not None:
        line += f"; best epoch {s['best_epoch']} ({s['best_metric']} {s['best_value']:.4f})"
        if s.get("best_checkpoint"):
            line += f" at {s['best_checkpoint']}"
    if s.get("checkpoint"):
        epoch = s.get("checkpoint_epoch")
        line += f"; checkpoint {s['checkpoint']}" + (f" (epoch {epoch})" if epoch else "")
    elif s.get("epochs"):
        line += "; no model saved"
    if s.get("run_dir"):
        line += f"; run {s['run_dir']}"
    return line


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
