"""The ``angelps schedule`` verb: print or plot the step sizes a configuration's schedule gives.

``--steps N`` is both the number of updates printed and the total number of updates the
schedule is told about (it fills ``ml.opt.decay.total.steps`` / ``.t.max`` when not set, as the
learner does with epochs × updates per epoch). The values are written as they are computed, a
block at a time, so memory stays flat whatever N; ``--plot`` draws at most
:data:`PLOT_MAX_STEPS` points.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import decay
from angelps.config import ConfigError
from decay import StepSizeScheduler
from decay.render import example
from learners.cli.common import EXIT_OK, Subparsers, add_config_arguments, load_job

PLOT_MAX_STEPS = 1_000_000
_BLOCK = 1 << 16  # values computed and written at a time

_EXAMPLES = """\
examples:
  angelps schedule --set ml.opt.decay.class.name=StepLR --set ml.opt.decay.step.size=3 --steps 10
  angelps schedule --conf conf/lr_a9a.properties --steps 30 --format json
  angelps schedule --set ml.opt.decay.class.name=OneCycleLR --steps 1000 --plot onecycle.png
  angelps schedule --set ml.opt.decay.class.name=SequentialLR \\
      --set ml.opt.decay.schedulers=LinearLR,CosineAnnealingLR --set ml.opt.decay.milestones=10 \\
      --set ml.opt.decay.0.start.factor=0.1 --set ml.opt.decay.0.total.iters=10 --steps 100

CSV output is the header `step,lr` and one line `k,lr_at(k)` per update k = 0..N-1 (full
precision). docs/decay.md lists every schedule and key.
"""


def register(subparsers: Subparsers) -> None:
    """Add the ``schedule`` sub-command."""
    p = subparsers.add_parser(
        "schedule",
        help="print or plot the step size of every update of a decay schedule",
        description="Build the step-size schedule a configuration describes (ml.learn.rate, "
        "ml.opt.decay.*) and print lr_at(k) for k = 0..N-1, or plot it.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(p, conf_help="a .properties job file (optional)")
    p.add_argument(
        "--steps",
        type=int,
        default=100,
        metavar="N",
        help="number of updates to print, and the schedule's total number of updates (default 100)",
    )
    p.add_argument("--format", choices=("csv", "json"), default="csv", help="output format (csv)")
    p.add_argument("--plot", metavar="OUT.png", help="also draw the curve into this PNG file")
    p.add_argument(
        "--catalogue",
        metavar="DIR",
        help="draw the example of every schedule of docs/decay.md into DIR/<Name>.png and exit",
    )
    p.set_defaults(func=run)


def build(args: argparse.Namespace) -> StepSizeScheduler:
    """The schedule of ``--conf``/``--set`` told about ``--steps`` updates."""
    conf = load_job(args)
    try:
        return decay.from_conf(conf, total_steps=args.steps)
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


def plot(sched: StepSizeScheduler, steps: int, out: str | Path, title: str | None = None) -> None:
    """Draw lr (and momentum, on a second axis) against the update index into a PNG."""
    import matplotlib  # only when drawing: the config-only verb stays fast

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs, moms = values(sched, steps)
    fig, ax = plt.subplots(figsize=(7.0, 3.6), dpi=100)
    ax.plot(range(steps), lrs, color="tab:blue", lw=1.6, label="lr")
    ax.set_xlabel("update k")
    ax.set_ylabel("lr_at(k)", color="tab:blue")
    ax.grid(alpha=0.3)
    if moms is not None:
        ax2 = ax.twinx()
        ax2.plot(range(steps), moms, color="tab:orange", lw=1.0, ls="--", label="momentum")
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


def _write_csv(sched: StepSizeScheduler, n: int) -> None:
    out = sys.stdout
    out.write("step,lr\n")
    for ks in _blocks(n):
        out.write("".join(f"{k},{sched.lr_at(k)!r}\n" for k in ks))


def _write_json(sched: StepSizeScheduler, n: int) -> None:
    """The JSON object ``json.dumps`` writes for the whole lists, written a block at a time."""
    out = sys.stdout
    out.write(f'{{"schedule": {json.dumps(sched.describe())}, "steps": {n}, "lr": [')
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
    if args.steps < 0:
        raise ConfigError(f"--steps {args.steps}: expected an integer >= 0")
    if args.plot and args.steps > PLOT_MAX_STEPS:
        raise ConfigError(
            f"--steps {args.steps} with --plot: at most {PLOT_MAX_STEPS} steps can be drawn "
            "(print them without --plot)"
        )
    sched = build(args)
    n = args.steps
    try:
        if args.format == "csv":
            _write_csv(sched, n)
        else:
            _write_json(sched, n)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`angelps schedule ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    if args.plot:
        plot(sched, n, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return EXIT_OK
