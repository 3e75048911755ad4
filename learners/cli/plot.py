"""The ``plot`` verb of the ``angelps`` command line: training curves from metrics.jsonl."""

from __future__ import annotations

import argparse
import sys

from learners.cli.common import EXIT_BAD_INPUT, EXIT_OK, Subparsers, add_verb

__all__ = ["register", "run"]


def register(sub: Subparsers) -> None:
    """Add the ``plot`` sub-command."""
    p = add_verb(
        sub,
        "plot",
        help="draw loss, validation metric and learning-rate curves from metrics.jsonl",
        description="Draw the curves of a training job from the metrics.jsonl that it writes "
        "under angel.log.path: training loss per step and per epoch, the validation metrics per "
        "epoch, the learning rate, and samples/s. The image format follows the --out suffix "
        "(png, pdf, svg).",
        examples=[
            "angelps plot runs/lr_a9a/metrics.jsonl --out curves.png",
            "angelps plot runs/lr_a9a/metrics.jsonl --out auc.svg --metric valid_auc --last-run",
        ],
    )
    p.add_argument("metrics", metavar="METRICS.jsonl", help="a job's metrics file")
    p.add_argument("--out", metavar="PATH", default="curves.png", help="image to write")
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        help="validation metric to draw (repeatable; default: every valid_* in the file)",
    )
    p.add_argument(
        "--last-run",
        action="store_true",
        help="draw only the last run when the file holds several (the learner appends)",
    )
    p.add_argument("--title", default=None, help="figure title (default: the metrics path)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the figure; a bad metrics file is bad input (exit code 2)."""
    from learners.plot import plot_metrics  # matplotlib: only when drawing

    try:
        out = plot_metrics(
            args.metrics,
            args.out,
            metrics=args.metric,
            last_run_only=args.last_run,
            title=args.title,
        )
    except ValueError as e:
        print(f"angelps: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {out}", file=sys.stderr)
    return EXIT_OK
