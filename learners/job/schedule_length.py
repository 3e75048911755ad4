"""How many times a job advances its step-size schedule, known before it starts.

The learner builds its schedule with ``total_steps`` = ``ml.epoch.num`` (per-epoch decay) or
``ml.epoch.num`` × updates per epoch (``ml.opt.decay.on.batch=true``), the updates per epoch
coming from the workers' training rows (:class:`learners.job.job_size.JobSize`). This module computes
the same numbers from the input itself, without torch, Ray or numpy (``angelps schedule``
stays a config-only verb): it counts the non-blank lines of a text input (Parquet: the row
counts in the files' footers) and splits them into workers' training parts as the reader does
(blocks of ``P = ceil(1/ml.data.validate.ratio)`` lines, round robin; line ``i`` validates iff
``i % P == 0``). Malformed lines are counted as rows (a job that skips them has fewer).
"""

from __future__ import annotations

import bz2
import gzip
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from angelconf.config import ConfigError
from learners.data.options import DataOptions, split_period
from learners.job.job_options import JobOptions
from learners.job.loop_options import TrainPlan

__all__ = ["SampleLength", "ScheduleLength", "sample_length", "schedule_length", "train_rows"]

_OPEN = {".gz": gzip.open, ".bz2": bz2.open}


@dataclass(frozen=True)
class ScheduleLength:
    """The schedule's unit (``epoch`` or ``update``), its length and how it was found."""

    unit: str
    total: int
    epochs: int
    updates_per_epoch: int | None
    #: one line saying where the length comes from
    why: str


def _files(path: str) -> list[str]:
    """The files of an input (as learners.data.reader.input_files)."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
        return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
    if not os.path.exists(path):
        raise ConfigError(f"angel.train.data.path={path}: no such file or directory")
    return [path]


def _open(file: str) -> IO[bytes]:
    suffix = os.path.splitext(file)[1].lower()
    if suffix in (".zst", ".lz4"):
        raise ConfigError(
            f"{file}: counting the lines of a {suffix} file needs its decompressor: give "
            "--updates-per-epoch N (the job's banner prints it)"
        )
    opener: Any = _OPEN.get(suffix, open)
    f: IO[bytes] = opener(file, "rb")
    return f


def _blank_flags(files: list[str], kind: str) -> Iterator[bool]:
    """For every line (row) of the input, in order: True when it is blank (not a row)."""
    for file in files:
        if kind == "parquet":
            import pyarrow.parquet as pq  # Parquet footers only; never for text inputs

            yield from (False for _ in range(pq.ParquetFile(file).metadata.num_rows))
            continue
        with _open(file) as f:
            for line in f:
                yield not line.strip()


def train_rows(opts: DataOptions, workers: int) -> list[int]:
    """Training rows of each of ``workers`` workers, as the reader splits the input."""
    if not opts.train_path:
        raise ConfigError(
            "angel.train.data.path is not set: expected the path of the training data"
        )
    period = split_period(opts)
    holds_out = opts.holds_out_validation
    rows = [0] * workers
    for i, blank in enumerate(_blank_flags(_files(opts.train_path), opts.kind)):
        if blank or (holds_out and i % period == 0):
            continue
        rows[(i // period) % workers] += 1
    return rows


def _updates(plan: TrainPlan, parts: list[int]) -> tuple[int, int]:
    """(rows per batch, updates per epoch) as :meth:`learners.job.job_size.JobSize.of_parts` sizes them."""
    smallest = min(parts)
    if smallest == 0:
        raise ConfigError(
            f"worker {parts.index(0)} has no training rows: the input has {sum(parts)} rows for "
            f"{len(parts)} workers (lower angel.workergroup.number)"
        )
    if plan.updates_per_epoch is not None:
        batch = max(1, math.ceil(smallest / (plan.updates_per_epoch * plan.accum)))
    else:
        batch = plan.minibatch_size
    return batch, max(1, math.ceil(smallest / batch) // plan.accum)


def schedule_length(
    conf: Mapping[str, Any],
    updates_per_epoch: int | None = None,
    options: JobOptions | None = None,
) -> ScheduleLength:
    """The unit and length of the job's schedule; ``updates_per_epoch`` given skips counting.
    ``options``: the job's, when its entry point built them (else built from ``conf``)."""
    options = options or JobOptions.from_config(conf)
    plan = options.loop
    if not plan.decay_on_batch:
        return ScheduleLength(
            "epoch",
            plan.epochs,
            plan.epochs,
            None,
            f"per epoch (ml.opt.decay.on.batch=false): ml.epoch.num={plan.epochs} epochs",
        )
    if updates_per_epoch is None:
        opts = options.data
        parts = train_rows(opts, plan.workers)
        batch, updates_per_epoch = _updates(plan, parts)
        how = (
            f"{sum(parts)} training rows of {opts.train_path} on {plan.workers} worker(s), "
            f"batches of {batch}"
        )
    else:
        how = "--updates-per-epoch"
    total = plan.epochs * updates_per_epoch
    return ScheduleLength(
        "update",
        total,
        plan.epochs,
        updates_per_epoch,
        f"per update (ml.opt.decay.on.batch=true): ml.epoch.num={plan.epochs} epochs x "
        f"{updates_per_epoch} updates ({how}) = {total} updates",
    )


@dataclass(frozen=True)
class SampleLength:
    """A schedule counted in samples or epochs (``ml.opt.decay.unit``): the training rows of an
    epoch, the global batch and the updates per epoch, as the job will have them."""

    rows: int
    global_batch: int
    updates_per_epoch: int
    epochs: int
    why: str

    def position(self, i: int, unit: str) -> float:
        """Where update ``i`` of the job (0-based) reads its schedule: the samples seen before
        it (``epoch × rows + min(update × global batch, rows)``) or that in epochs."""
        e, u = divmod(i, self.updates_per_epoch)
        seen = e * self.rows + min(u * self.global_batch, self.rows)
        return seen if unit == "samples" else seen / self.rows


def sample_length(conf: Mapping[str, Any], options: JobOptions | None = None) -> SampleLength:
    """The rows, global batch and updates of a job whose schedule counts samples or epochs,
    counted from its training input as :func:`schedule_length` counts them."""
    options = options or JobOptions.from_config(conf)
    plan, opts = options.loop, options.data
    parts = train_rows(opts, plan.workers)
    batch, updates = _updates(plan, parts)
    rows, g = sum(parts), batch * plan.workers * plan.accum
    unit = str(conf["ml.opt.decay.unit"])
    why = (
        f"in {unit} (ml.opt.decay.unit={unit}): {sum(parts)} training rows of {opts.train_path} "
        f"per epoch x ml.epoch.num={plan.epochs}; one value per update, {updates} updates of "
        f"global batch {g} per epoch"
    )
    return SampleLength(rows, g, updates, plan.epochs, why)
