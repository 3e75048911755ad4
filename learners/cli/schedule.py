"""The ``angelps schedule`` verb: print or plot the step sizes a configuration's schedule gives.

With ``--conf job.properties`` it shows the sequence the job will use: one value per epoch
(``ml.opt.decay.on.batch=false``, ``ml.epoch.num`` values) or per update (``ml.epoch.num`` ×
updates per epoch, counted from the training input by :mod:`learners.schedule_length`, or
``--updates-per-epoch``), numbered from 1 as the console counts (``epoch,lr`` or ``update,lr``),
the schedule told that total as the learner tells it. ``--steps N`` overrides the length.

Without ``--conf``: ``--steps N`` (100) values ``update,lr`` for updates 1..N (update n at
``lr_at(n - 1)``, numbered as a job's sequence is), N being the total the schedule is told about (it fills ``ml.opt.decay.total.steps`` / ``.t.max`` when not set). The
values are written as they are computed, a block at a time, so memory stays flat whatever N;
``--plot`` draws at most :data:`PLOT_MAX_STEPS` points.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import decay
from angelconf.config import ConfigError
from decay import StepSizeScheduler
from decay.render import example
from learners.cli.common import EXIT_OK, Subparsers, add_config_arguments, load_job

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
    p.add_argument("--plot", metavar="OUT.png", help="also draw the curve into this PNG file")
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
    #: "epoch" or "update" (a job's sequence, numbered from 1), or "step" (from 0)
    unit: str
    why: str | None = None
    #: updates per epoch of a per-update job (the plot marks the epochs' ends)
    per_epoch: int | None = None

    @property
    def first(self) -> int:
        return 0 if self.unit == "step" else 1


def build(args: argparse.Namespace) -> Preview:
    """The schedule of ``--conf``/``--set``: the job's sequence with --conf, else ``--steps``."""
    conf = load_job(args)
    why, per_epoch = None, None
    if args.conf is None:
        # numbered from 1 and labelled as a job's sequence is: update n trains at lr_at(n - 1)
        unit, steps = "update", 100 if args.steps is None else args.steps
    elif args.steps is not None:
        unit = "update" if conf["ml.opt.decay.on.batch"] else "epoch"
        steps = args.steps
    else:
        from learners.schedule_length import schedule_length

        if args.updates_per_epoch is not None and args.updates_per_epoch < 1:
            raise ConfigError(f"--updates-per-epoch {args.updates_per_epoch}: expected >= 1")
        length = schedule_length(conf, args.updates_per_epoch)
        unit, steps, why = length.unit, length.total, length.why
        per_epoch = length.updates_per_epoch
    try:
        sched = decay.from_conf(conf, total_steps=max(steps, 1))
        return Preview(sched, steps, unit, why, per_epoch if args.conf and why else None)
    except ConfigError:
        raise
    except ValueError as e:  # a bad schedule parameter is bad input, like a bad key
        raise ConfigError(str(e)) from None


def values(sched: StepSizeScheduler, steps: int) -> tuple[list[float], list[float] | None]:
    """lr_at(k) (and momentum_at(k) when the schedule drives momentum) for k < steps."""
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
) -> None:
    """Draw lr (and momentum, on a second axis) against the update index into a PNG; a job's
    sequence (``unit`` epoch or update) is numbered from 1 and its axis says which."""
    import matplotlib  # only when drawing: the config-only verb stays fast

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs, moms = values(sched, steps)
    xs = range(steps) if unit == "step" else range(1, steps + 1)
    fig, ax = plt.subplots(figsize=(7.0, 3.6), dpi=100)
    ax.plot(
        xs, lrs, color="tab:blue", lw=1.6, label="lr", marker="o" if steps <= 60 else None, ms=3
    )
    ax.set_xlabel({"step": "update k", "epoch": "epoch", "update": "update"}[unit])
    ax.set_ylabel("lr_at(k)" if unit == "step" else f"lr of the {unit}", color="tab:blue")
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
    fig.savefig(out)
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
    out, sched = sys.stdout, p.sched
    out.write(f"{p.unit},lr\n")
    for ks in _blocks(p.steps):
        out.write("".join(f"{k + p.first},{sched.lr_at(k)!r}\n" for k in ks))


def _write_json(p: Preview) -> None:
    """The JSON object ``json.dumps`` writes for the whole lists, written a block at a time."""
    out, sched, n = sys.stdout, p.sched, p.steps
    head = f'{{"schedule": {json.dumps(sched.describe())}, "unit": "{p.unit}", '
    out.write(f'{head}"first": {p.first}, "steps": {n}, "lr": [')
    for ks in _blocks(n):
        sep = ", " if ks.start else ""
        out.write(sep + ", ".join(json.dumps(sched.lr_at(k)) for k in ks))
    out.write("]")
    if n and sched.momentum_at(0) is not None:
        out.write(', "momentum": [')
        for ks in _blocks(n):
            sep = ", " if ks.start else ""
            out.write(sep + ", ".join(json.dumps(float(sched.momentum_at(k) or 0.0)) for k in ks))
        out.write("]")
    out.write("}\n")


def run(args: argparse.Namespace) -> int:
    """Print (and optionally plot) the schedule; returns the exit code."""
    if args.catalogue:
        for path in catalogue(args.catalogue):
            print(path)
        return EXIT_OK
    if args.steps is not None and args.steps < 0:
        raise ConfigError(f"--steps {args.steps}: expected an integer >= 0")
    p = build(args)
    if args.plot and p.steps > PLOT_MAX_STEPS:
        raise ConfigError(
            f"--steps {p.steps} with --plot: at most {PLOT_MAX_STEPS} steps can be drawn "
            "(print them without --plot)"
        )
    if p.why:
        print(f"# {p.why}", file=sys.stderr)
    try:
        if args.format == "csv":
            _write_csv(p)
        else:
            _write_json(p)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`angelps schedule ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    if args.plot:
        title = f"{p.sched.describe()}; {p.why}" if p.why else None
        plot(p.sched, p.steps, args.plot, title, p.unit, p.per_epoch)
        print(f"wrote {args.plot}", file=sys.stderr)
    return EXIT_OK
