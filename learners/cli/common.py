"""What every verb of the command line shares: exit codes, the sub-command shape, the job's
``--conf``/``--set`` options and loading them into a :class:`~angelps.config.Config`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from angelps.config import Config, load_config
from learners.keys import all_keys

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "add_config_arguments",
    "add_verb",
    "load_job",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

Subparsers = argparse._SubParsersAction


def add_verb(
    sub: Subparsers, name: str, *, help: str, description: str, examples: Sequence[str]
) -> argparse.ArgumentParser:
    """One sub-command with its one-line help, a description and an ``examples:`` epilog."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog="examples:\n" + "".join(f"  {e}\n" for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_config_arguments(
    parser: argparse.ArgumentParser, *, conf_required: bool = False, conf_help: str = ""
) -> None:
    """The ``--conf FILE`` and repeated ``--set KEY=VALUE`` options every job verb shares."""
    parser.add_argument(
        "--conf",
        metavar="FILE",
        required=conf_required,
        help=conf_help or "a .properties job file",
    )
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one key (repeatable; wins over the file)",
    )


def load_job(args: argparse.Namespace, extra_sets: Sequence[str] = ()) -> Config:
    """The job of ``--conf``/``--set`` (and ``extra_sets`` after them), every key declared."""
    return load_config(args.conf, [*(args.set or []), *extra_sets], all_keys())
