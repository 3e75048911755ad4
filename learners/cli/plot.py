"""The ``plot`` verb of the ``angelps`` command line: the curves of one run, or several compared."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from angelconf.config import ConfigError
from angelconf.printable import printable
from angelps.file_store import files_for
from learners.cli.common import EXIT_BAD_INPUT, EXIT_OK, Subparsers, add_verb
from learners.job.paths import cannot_write, check_out_folder
from learners.runs.folders import RunRef

__all__ = ["check_image_out", "image_formats", "register", "run"]

#: The formats named first in an error (the ones the help mentions); the rest follow sorted.
_COMMON_FORMATS = ("png", "pdf", "svg")


def register(sub: Subparsers) -> None:
    """Add the ``plot`` sub-command."""
    p = add_verb(
        sub,
        "plot",
        help="draw a run's curves (the latest by default), or compare several runs",
        description="Draw the curves of a training run from its metrics.jsonl: one panel per "
        "kind of metric (losses, AUC, accuracy, regression errors, R², learning rate, "
        "throughput), training and validation on one epoch axis counted from 1. With several "
        "runs, one colour per run, named in the legend. A RUN is a run's name under --log-dir, "
        "its directory, a log directory (its latest run) or a metrics.jsonl file; none: the "
        "latest run under --log-dir. Each may be on object storage (s3://..., as "
        "angel.log.path). The image format follows the --out suffix (png, pdf, svg).",
        examples=[
            "angelps plot",
            "angelps plot lr_a9a-20261123-124500 lr_a9a-20261123-131502 --out compare.png",
            "angelps plot --log-dir /data/runs --metric valid_auc --out auc.svg",
            "angelps plot runs/lr_a9a/metrics.jsonl --last-run",
            "angelps plot --log-dir s3://my-bucket/runs",
        ],
    )
    p.add_argument("runs", metavar="RUN", nargs="*", help="runs to draw (default: the latest)")
    p.add_argument(
        "--log-dir",
        metavar="DIR",
        default="runs",
        help="where the runs are: angel.log.path, a directory or a URL (default: runs)",
    )
    p.add_argument(
        "--out",
        metavar="PATH",
        default=None,
        help="image to write, in an existing directory (default: curves.png in the run's "
        "folder; several runs: compare.png in --log-dir; a run on object storage: "
        "<run>-curves.png here)",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        help="validation metric to draw (repeatable; default: AUC, logloss, accuracy, RMSE, "
        "MAE, R², whichever the runs have)",
    )
    p.add_argument(
        "--last-run",
        action="store_true",
        help="of a metrics.jsonl holding several appended runs (older versions), the last only",
    )
    p.add_argument(
        "--title", default=None, help="figure title (default: the job, model and settings)"
    )
    p.set_defaults(func=run)


def image_formats() -> list[str]:
    """The file suffixes (without the dot) matplotlib can write: png, pdf, svg first, then the
    rest sorted. Imports matplotlib (and numpy): call it only when a figure is to be drawn."""
    from matplotlib.backend_bases import FigureCanvasBase

    have = set(FigureCanvasBase.get_supported_filetypes())
    return [f for f in _COMMON_FORMATS if f in have] + sorted(have - set(_COMMON_FORMATS))


def check_image_out(option: str, value: str) -> Path:
    """The image file ``value`` of ``option`` (``--out``, ``--plot``) on this machine's disk,
    checked before any work: ConfigError, one line naming the option and the value, for a URL,
    a directory, a suffix matplotlib cannot write (or none: the format follows the suffix), a
    parent directory that is a file, is missing (it is not created, as with ``export --out``
    and ``predict --out``) or takes no new file."""
    shown = f"{option} {value}"
    out = files_for(value).disk_path(value)
    if out is None:
        raise ConfigError(f"{shown}: a figure is written to the local disk only")
    if out.is_dir():
        raise ConfigError(f"{shown} is a directory: expected a file name")
    formats = image_formats()
    valid = ", ".join(f".{f}" for f in formats)
    suffix = out.suffix[1:].lower()
    if not suffix:
        raise ConfigError(f"{shown}: no suffix to tell the image format; valid: {valid}")
    if suffix not in formats:
        raise ConfigError(f"{shown}: matplotlib cannot write .{suffix}; valid: {valid}")
    check_out_folder(shown, out.parent)
    return out


def _default_out(refs: list[RunRef], log_dir: str) -> Path:
    """Where the figure goes without --out: into the run's own folder (never over a file of
    the current directory); several runs: compare.png in the log directory; a run on object
    storage: <run>-curves.png here."""
    if len(refs) == 1:
        metrics = refs[0].metrics
        if isinstance(metrics, Path):
            return metrics.parent / "curves.png"
        return Path(f"{refs[0].name}-curves.png")
    folder = files_for(log_dir).disk_path(log_dir)  # (a figure is written to the disk only)
    if folder is not None and folder.is_dir():
        return folder / "compare.png"
    return Path("compare.png")


def run(args: argparse.Namespace) -> int:
    """Write the figure; a bad metrics file, an unknown run or a store that cannot be read
    (no bucket, refused credentials) is bad input (exit code 2)."""
    from learners.runs.curves import read_metrics
    from learners.runs.folders import find_run
    from learners.runs.plot import plot_runs

    try:
        if args.out is not None:  # before any run is read: a bad path is told at once
            check_image_out("--out", args.out)
        runs, refs = [], []
        for arg in args.runs or [None]:
            ref = find_run(arg, args.log_dir)
            refs.append(ref)
            found = read_metrics(ref.metrics, ref.name)
            runs += found[-1:] if args.last_run else found
        names = [r.name for r in runs]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"{', '.join(sorted(dupes))}: the same run named more than once")
        where = str(runs[0].name) if len(runs) == 1 else ""
        target = args.out or _default_out(refs, args.log_dir)
        if args.out is None and (why := cannot_write(Path(target).parent)) is not None:
            raise ValueError(f"cannot write {target} ({why}); choose where with --out")
        out = plot_runs(runs, target, metrics=args.metric, title=args.title, where=where)
    except ValueError as e:
        print(printable(f"angelps: error: {e}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(printable(f"wrote {out}"), file=sys.stderr)
    return EXIT_OK
