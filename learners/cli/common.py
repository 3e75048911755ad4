"""What every verb of the command line shares: exit codes, the sub-command shape, the job's
``--conf``/``--set`` options (and Angel's ``--KEY VALUE``) and loading them into a
:class:`~angelconf.config.Config`."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from angelconf.config import Config, ConfigError, KeyIndex, load_config
from learners.keys import all_keys
from learners.models.angel_json import apply_angel_json

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "add_config_arguments",
    "add_verb",
    "key_options",
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
    """The job of ``--conf``/``--set`` (and ``extra_sets`` after them), every key declared;
    with ``angel.ml.conf``, the keys of Angel's JSON where the job does not set them."""
    conf = load_config(args.conf, [*(args.set or []), *extra_sets], all_keys())
    return apply_angel_json(conf)


def _unknown_option(name: str, index: KeyIndex, options: Sequence[str]) -> ConfigError:
    """The error for ``--name`` that is neither an option of the verb nor a declared key."""
    names = [*options, *(f"--{k.name}" for k in index.all() if "<i>" not in k.name)]
    close = difflib.get_close_matches(f"--{name}", names, n=3, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(
        f"unknown option --{name}{hint}; a declared key is accepted as --KEY VALUE or "
        "--set KEY=VALUE (`angelps conf --keys` lists every key)"
    )


def key_options(extra: Sequence[str], options: Sequence[str] = ()) -> list[str]:
    """Angel's submit style ``--KEY VALUE`` (or ``--KEY=VALUE``) for every declared key, as
    ``KEY=VALUE`` items for ``--set``; ``options`` are the verb's own option strings (for the
    suggestion when a name is neither). Anything else is a ConfigError naming it."""
    index = KeyIndex(all_keys())
    sets: list[str] = []
    i = 0
    while i < len(extra):
        token = extra[i]
        if not token.startswith("--") or token == "--":
            raise ConfigError(
                f"unexpected argument {token!r}: options are --KEY VALUE or --set KEY=VALUE"
            )
        name, eq, value = token[2:].partition("=")
        if index.find(name) is None:
            raise _unknown_option(name, index, options)
        if not eq:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise ConfigError(f"--{name} needs a value: --{name} VALUE")
            value = extra[i + 1]
            i += 1
        sets.append(f"{name}={value}")
        i += 1
    return sets
