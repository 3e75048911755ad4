"""The ``angelps schedule`` verb: print or plot the step sizes a configuration's schedule gives.

With ``--conf job.properties`` it shows the sequence the job will use: one value per epoch
(``ml.opt.decay.on.batch=false``, ``ml.epoch.num`` values) or per update (``ml.epoch.num`` ×
updates per epoch, counted from the training input by :mod:`learners.job.schedule_length`, or
``--updates-per-epoch``), numbered from 1 as the console counts (``epoch,lr`` or ``update,lr``),
the schedule told that total as the learner tells it. ``--steps N`` overrides the length.

Without ``--conf``: ``--steps N`` (100) values ``update,lr`` for updates 1..N (update n at
``lr_at(n - 1)``, numbered as a job's sequence is), N being the total the schedule is told about (it fills ``ml.opt.decay.total.steps`` / ``.t.max`` when not set). The
values are written as they are computed, a block at a time, so memory stays flat whatever N;
``--plot`` draws at most :data:`PLOT_MAX_STEPS` points.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import decay
from angelconf.config import ConfigError
from angelconf.printable import printable
from decay import StepSizeScheduler
from decay.render import example
from learners.cli.common import EXIT_OK, Subparsers, add_config_arguments, load_job
from learners.cli.plot import check_image_out
from learners.job.job_options import JobOptions
from learners.job.lr_scaling import batch_scale
from learners.job.table_schedules import job_schedule, table_keys, table_schedules
from learners.models.config import ModelConfig
from learners.runs.output_file import replace_atomically

PLOT_MAX_STEPS = 1_000_000
_BLOCK = 1 << 16  # values computed and written at a time

_EXAMPLES = """\
examples:
  angelps schedule --conf conf/lr_a9a.properties
  angelps schedule --conf conf/lr_a9a.properties --ml.opt.decay.on.batch true --plot lr.png
  angelps schedule --set ml.opt.decay.class.name=StepLR --set ml.opt.decay.step.size=3 --steps 10
  angelps schedule --conf conf/lr_a9a.properties --steps 30 --format json
  angelps schedule --set ml.opt.decay.class.name=OneCycleLR --steps 1000 --plot onecycle.png
  angelps schedule --set ml.opt.decay.class.name=SequentialLR \\
      --set ml.opt.decay.schedulers=LinearLR,CosineAnnealingLR --set ml.opt.decay.milestones=10 \\
      --set ml.opt.decay.0.start.factor=0.1 --set ml.opt.decay.0.total.iters=10 --steps 100

With --conf: the job's sequence, `epoch,lr` (epochs 1..ml.epoch.num) or `update,lr` (updates
1..epochs x updates per epoch when ml.opt.decay.on.batch=true), and on stderr where the length
comes from. Without: the header `update,lr` and one line `n,lr_at(n-1)` per update n = 1..N (full
precision): every sequence is numbered from 1 and its header names the unit. docs/decay.md lists every schedule and key.
"""


def register(subparsers: Subparsers) -> None:
    """Add the ``schedule`` sub-command."""
    p = subparsers.add_parser(
        "schedule",
        help="print or plot the step size of every update of a decay schedule",
        description="Build the step-size schedule a configuration describes (ml.learn.rate, "
        "ml.opt.decay.*) and print the step size of updates 1..N (or of a job's epochs), "
        "or plot it.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(p, conf_help="a .properties job file (optional)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="number of values to print, and the schedule's total (default: the job's length "
        "with --conf, else 100)",
    )
    p.add_argument(
        "--updates-per-epoch",
        type=int,
        default=None,
        metavar="U",
        help="per-update jobs: the updates per epoch, instead of counting the training input",
    )
    p.add_argument("--format", choices=("csv", "json"), default="csv", help="output format (csv)")
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also draw the curve into this image (png, pdf, svg by the suffix; its directory "
        "must exist)",
    )
    p.add_argument(
        "--catalogue",
        metavar="DIR",
        help="draw the example of every schedule of docs/decay.md into DIR/<Name>.png and exit",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Preview:
    """The schedule to show: its values' count, their unit and first index, and why."""

    sched: StepSizeScheduler
    steps: int
    #: "epoch" or "update" (a job's sequence, numbered from 1), "step" (from 0), or "samples" /
    #: "epochs" (ml.opt.decay.unit: each value at the samples or epochs seen before it)
    unit: str
    why: str | None = None
    #: updates per epoch of a per-update job (the plot marks the epochs' ends)
    per_epoch: int | None = None
    #: the tables' own schedules (ml.opt.decay.<table>.*, ml.learn.rate.<table>)
    tables: dict[str, StepSizeScheduler] = field(default_factory=dict)
    #: where value i reads the schedules (a job counted in samples or epochs); None: at i
    at: Callable[[int], float] | None = None
    #: ml.learn.rate.scaling's factor
    scale: float = 1.0

    @property
    def first(self) -> int:
        return 0 if self.unit in ("step", "samples", "epochs") else 1

    def x(self, i: int) -> float:
        """The first column of value ``i``."""
        return i + self.first if self.at is None else self.at(i)

    def lr(self, sched: StepSizeScheduler, i: int) -> float:
        """The step size ``sched`` gives value ``i``."""
        lr = sched.lr_at(i) if self.at is None else sched.value_at(self.at(i))[0]
        return lr * self.scale

    def momentum(self, sched: StepSizeScheduler, i: int) -> float | None:
        return sched.momentum_at(i) if self.at is None else sched.value_at(self.at(i))[1]

    def columns(self) -> list[tuple[str, StepSizeScheduler]]:
        """(column name, schedule): ``lr``, then ``lr/<table>`` for each table's own."""
        return [("lr", self.sched), *((f"lr/{t}", s) for t, s in self.tables.items())]


def build(args: argparse.Namespace) -> Preview:
    """The schedule of ``--conf``/``--set``: the job's sequence with --conf, else ``--steps``."""
    conf = load_job(args)
    options = JobOptions.from_config(conf)
    why, per_epoch = None, None
    counted = str(conf["ml.opt.decay.unit"])
    if counted != "updates":
        return _build_in(conf, options, args, counted)
    if args.conf is None:
        # numbered from 1 and labelled as a job's sequence is: update n trains at lr_at(n - 1)
        unit, steps = "update", 100 if args.steps is None else args.steps
    elif args.steps is not None:
        unit = "update" if conf["ml.opt.decay.on.batch"] else "epoch"
        steps = args.steps
    else:
        from learners.job.schedule_length import schedule_length

        if args.updates_per_epoch is not None and args.updates_per_epoch < 1:
            raise ConfigError(f"--updates-per-epoch {args.updates_per_epoch}: expected >= 1")
        length = schedule_length(conf, args.updates_per_epoch, options)
        unit, steps, why = length.unit, length.total, length.why
        per_epoch = length.updates_per_epoch
    sched, tables = _schedules(conf, max(steps, 1), _model_tables(conf) if args.conf else None)
    return Preview(
        sched,
        steps,
        unit,
        why,
        per_epoch if args.conf and why else None,
        tables,
        scale=_scale(conf, options, None),
    )


def _model_tables(conf: Any) -> list[str] | None:
    """The names of the job's model's PS tables, where a per-table key asks (None: none
    does, or the model cannot tell them yet: the workers' build reports it)."""
    if not table_keys(conf):
        return None
    from learners.models.tables import model_tables  # (numpy: only for per-table keys)

    try:
        fields = int(conf["ml.fm.field.num"]) or 1
        n = max(1, int(conf["ml.feature.index.range"]))
        return [t.name for t in model_tables(ModelConfig.from_config(conf, n, fields))]
    except (ConfigError, ValueError):
        return None


def _schedules(
    conf: Any, total: int, tables: list[str] | None = None
) -> tuple[StepSizeScheduler, dict[str, StepSizeScheduler]]:
    """The job's schedule and the tables' own: of the job's model's ``tables`` where known
    (an unknown table is refused as train refuses it), else every table a key names."""

    try:
        sched = job_schedule(conf, total)  # (an Angel JSON's unused decay keys: a note)
        if tables is not None:
            return sched, table_schedules(conf, tables, total, dense_layers=None)
        return sched, table_schedules(conf, list(table_keys(conf)), total)
    except ConfigError:
        raise
    except ValueError as e:  # a bad schedule parameter is bad input, like a bad key
        raise ConfigError(str(e)) from None


def _scale(conf: Any, options: JobOptions, global_batch: int | None) -> float:
    """ml.learn.rate.scaling's factor (the global batch of ml.minibatch.size when not counted)."""

    if global_batch is None:
        plan = options.loop
        global_batch = plan.minibatch_size * plan.workers * plan.accum
    return batch_scale(
        str(conf["ml.learn.rate.scaling"]), global_batch, int(conf["ml.learn.rate.reference.batch"])
    )


def _build_in(conf: Any, options: JobOptions, args: argparse.Namespace, unit: str) -> Preview:
    """A schedule counted in samples or epochs: with --conf one value per update of the job,
    at the samples (epochs) seen before it; else --steps values at 0, 1, 2, ... of the unit."""
    if args.conf is None or args.steps is not None:
        steps = 100 if args.steps is None else args.steps
        sched, tables = _schedules(conf, max(steps, 1))
        why = f"in {unit} (ml.opt.decay.unit={unit}): the schedule at 0..{steps - 1} {unit}"
        return Preview(sched, steps, unit, why, None, tables, scale=_scale(conf, options, None))
    from learners.job.schedule_length import sample_length

    n = sample_length(conf, options)
    total = n.epochs * n.rows if unit == "samples" else n.epochs
    sched, tables = _schedules(conf, max(total, 1))
    steps = n.epochs * n.updates_per_epoch

    def at(i: int) -> float:
        return n.position(i, unit)

    scale = _scale(conf, options, n.global_batch)
    return Preview(sched, steps, unit, n.why, None, tables, at, scale)


def values(
    sched: StepSizeScheduler, steps: int, p: Preview | None = None
) -> tuple[list[float], list[float] | None]:
    """lr_at(k) (and momentum_at(k) when the schedule drives momentum) for k < steps; with
    ``p``, the values the preview shows (at its positions, scaled)."""
    if p is not None:
        lrs = [p.lr(sched, i) for i in range(steps)]
        moms = [p.momentum(sched, i) for i in range(steps)]
    else:
        lrs = [sched.lr_at(k) for k in range(steps)]
        moms = [sched.momentum_at(k) for k in range(steps)] if steps else []
    if not moms or moms[0] is None:
        return lrs, None
    return lrs, [float(m) for m in moms if m is not None]


def plot(
    sched: StepSizeScheduler,
    steps: int,
    out: str | Path,
    title: str | None = None,
    unit: str = "step",
    per_epoch: int | None = None,
    preview: Preview | None = None,
) -> None:
    """Draw lr (and momentum, on a second axis) against the update index into a PNG; a job's
    sequence (``unit`` epoch or update) is numbered from 1 and its axis says which. With
    ``preview``: its values, against the samples or epochs of a schedule counted in them, and
    each table's own schedule as a curve of its own."""
    import matplotlib  # only when drawing: the config-only verb stays fast

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs, moms = values(sched, steps, preview)
    xs: Any = range(steps) if unit == "step" else range(1, steps + 1)
    if preview is not None:
        xs = [preview.x(i) for i in range(steps)]
    fig, ax = plt.subplots(figsize=(7.0, 3.6), dpi=100)
    ax.plot(
        xs, lrs, color="tab:blue", lw=1.6, label="lr", marker="o" if steps <= 60 else None, ms=3
    )
    colors = itertools.cycle(("tab:green", "tab:red", "tab:purple", "0.4"))
    for name, s in preview.columns()[1:] if preview else []:
        color = next(colors)
        ax.plot(xs, values(s, steps, preview)[0], color=color, lw=1.2, label=name)
    if preview is not None and preview.tables:
        ax.legend(fontsize=7, loc="upper right")
    ax.set_xlabel(
        {
            "step": "update k",
            "epoch": "epoch",
            "update": "update",
            "samples": "samples seen",
            "epochs": "epochs seen",
        }[unit]
    )
    ax.set_ylabel(
        "lr_at(k)" if unit in ("step", "samples", "epochs") else f"lr of the {unit}",
        color="tab:blue",
    )
    if per_epoch and steps // per_epoch <= 50:  # where each epoch ends
        for e in range(1, steps // per_epoch):
            ax.axvline(e * per_epoch + 0.5, color="0.6", lw=0.6, ls=":")
    ax.grid(alpha=0.3)
    if moms is not None:
        ax2 = ax.twinx()
        ax2.plot(xs, moms, color="tab:orange", lw=1.0, ls="--", label="momentum")
        ax2.set_ylabel("momentum_at(k)", color="tab:orange")
    text = title or sched.describe()
    ax.set_title("\n".join(textwrap.wrap(text, 80)), fontsize=8)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    target = Path(out)
    fmt = target.suffix[1:].lower() or None
    try:  # replaced whole: a symbolic link there is replaced, never written through
        replace_atomically(target, lambda tmp: fig.savefig(tmp, format=fmt))
    finally:
        plt.close(fig)


def catalogue(out_dir: str | Path) -> list[Path]:
    """Plot the docs/decay.md example of every schedule into ``out_dir/<Name>.png``."""
    paths = []
    for name in decay.names():
        sched, steps = example(name)
        if isinstance(sched, decay.ReduceLROnPlateau):
            _feed_plateau_example(sched, steps)
        path = Path(out_dir) / f"{name}.png"
        plot(sched, steps, path)
        paths.append(path)
    return paths


def _feed_plateau_example(sched: decay.ReduceLROnPlateau, steps: int) -> None:
    # A validation loss that improves, then stalls: shows the reductions of the example.
    for k in range(steps):
        sched.next()
        sched.step(1.0 / (1 + min(k, 8)))


def _blocks(n: int) -> Iterator[range]:
    for start in range(0, n, _BLOCK):
        yield range(start, min(n, start + _BLOCK))


def _write_csv(p: Preview) -> None:
    out, cols = sys.stdout, p.columns()
    out.write(f"{p.unit},{','.join(name for name, _ in cols)}\n")
    for ks in _blocks(p.steps):
        out.write(
            "".join(
                f"{p.x(k)!r},{','.join(repr(p.lr(s, k)) for _, s in cols)}\n"
                if p.at is not None
                else f"{k + p.first},{','.join(repr(p.lr(s, k)) for _, s in cols)}\n"
                for k in ks
            )
        )


def _write_json(p: Preview) -> None:
    """The JSON object ``json.dumps`` writes for the whole lists, written a block at a time."""
    out, sched, n = sys.stdout, p.sched, p.steps
    head = f'{{"schedule": {json.dumps(sched.describe())}, "unit": "{p.unit}", '
    out.write(f'{head}"first": {p.first}, "steps": {n}')
    if p.at is not None:
        _json_list(out, "at", n, lambda k: p.x(k))
    _json_values(out, p, sched)
    if p.tables:
        out.write(', "tables": {')
        for j, (name, s) in enumerate(p.tables.items()):
            out.write(f'{", " if j else ""}{json.dumps(name)}: {{"schedule": ')
            out.write(json.dumps(s.describe()))
            _json_values(out, p, s)
            out.write("}")
        out.write("}")
    out.write("}\n")


def _json_values(out: Any, p: Preview, sched: StepSizeScheduler) -> None:
    """``, "lr": [...]`` (and ``"momentum"`` when the schedule drives it), a block at a time."""
    _json_list(out, "lr", p.steps, lambda k: p.lr(sched, k))
    if p.steps and p.momentum(sched, 0) is not None:
        _json_list(out, "momentum", p.steps, lambda k: float(p.momentum(sched, k) or 0.0))


def _json_list(out: Any, name: str, n: int, value: Callable[[int], float]) -> None:
    out.write(f', "{name}": [')
    for ks in _blocks(n):
        sep = ", " if ks.start else ""
        out.write(sep + ", ".join(json.dumps(value(k)) for k in ks))
    out.write("]")


def run(args: argparse.Namespace) -> int:
    """Print (and optionally plot) the schedule; returns the exit code."""
    if args.catalogue:
        for path in catalogue(args.catalogue):
            print(printable(str(path)))
        return EXIT_OK
    if args.plot is not None:  # before anything is computed or printed
        check_image_out("--plot", args.plot)
    if args.steps is not None and args.steps < 0:
        raise ConfigError(f"--steps {args.steps}: expected an integer >= 0")
    p = build(args)
    if args.plot and p.steps > PLOT_MAX_STEPS:
        raise ConfigError(
            f"--steps {p.steps} with --plot: at most {PLOT_MAX_STEPS} steps can be drawn "
            "(print them without --plot)"
        )
    if p.why:
        print(printable(f"# {p.why}"), file=sys.stderr)
    try:
        if args.format == "csv":
            _write_csv(p)
        else:
            _write_json(p)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`angelps schedule ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except ValueError as e:  # (a growing schedule's overflow, met as it is printed: bad input)
        sys.stdout.flush()
        raise ConfigError(str(e)) from None
    if args.plot:
        title = f"{p.sched.describe()}; {p.why}" if p.why else None
        plot(p.sched, p.steps, args.plot, title, p.unit, p.per_epoch, p)
        print(printable(f"wrote {args.plot}"), file=sys.stderr)
    return EXIT_OK
