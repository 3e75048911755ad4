"""What every verb of the command line shares: exit codes, the sub-command shape, the job's
``--conf``/``--set`` options (and Angel's ``--KEY VALUE``) and loading them into a
:class:`~angelconf.config.Config`."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from angelconf.config import Config, ConfigError, KeyIndex, load_config
from angelconf.printable import printable
from angelconf.properties import parse_properties
from learners.angel_keys import angel_notes, resolve
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

#: How alike (difflib's ratio) an unknown option must be to a known one to be suggested.
_CLOSE = 0.8

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
    """The job of ``--conf``/``--set`` (and ``extra_sets`` after them), every key declared,
    Angel's own keys applied (one note line on stderr for each, learners.angel_keys), and with
    ``angel.ml.conf`` the keys of Angel's JSON where the job does not set them."""
    conf = load_config(args.conf, [*(args.set or []), *extra_sets], all_keys())
    for note in angel_notes(conf):
        print(printable(f"angelps: {note}"), file=sys.stderr)
    return apply_angel_json(resolve(conf))


def _unknown_option(name: str, index: KeyIndex, options: Sequence[str]) -> str:
    """``--name`` with a did-you-mean when a verb option or declared key is really close."""
    names = [*options, *(f"--{k.name}" for k in index.all() if "<i>" not in k.name)]
    close = difflib.get_close_matches(f"--{name}", names, n=1, cutoff=_CLOSE)
    return f"--{name}" + (f" (did you mean {close[0]}?)" if close else "")


def _other_unknowns(index: KeyIndex, conf_file: str | None, sets: Sequence[str]) -> list[str]:
    """The undeclared keys of the job file and of ``--set``, for the same one message as the
    unknown options (a file that cannot be read is the loader's to report)."""
    found = []
    try:
        text = Path(conf_file).read_text(encoding="utf-8") if conf_file else ""
        parsed = parse_properties(text, str(conf_file))
        entries = [(f"{conf_file}:{e.line}", e.key) for e in parsed]
    except (OSError, ValueError):
        entries = []
    entries += [("--set", item.partition("=")[0].strip()) for item in sets]
    for where, name in entries:
        if name and index.find(name) is None:
            close = index.suggest(name)[:1]
            found.append(f"{where}: {name}" + (f" (did you mean {close[0]}?)" if close else ""))
    return found


def _unknown_options(found: Sequence[str], others: Sequence[str] = ()) -> ConfigError:
    """One error naming every option of the command line that is neither a verb option nor
    a declared key (and ``others``: the undeclared keys of the file and of --set)."""
    if others:
        what = f"{len(found) + len(others)} unknown keys: {'; '.join([*others, *found])}"
    elif len(found) == 1:
        what = f"unknown option {found[0]}"
    else:
        what = f"{len(found)} unknown options: {'; '.join(found)}"
    return ConfigError(
        f"{what}; a declared key is accepted as --KEY VALUE, -DKEY=VALUE or --set KEY=VALUE "
        "(`angelps conf --keys` lists every key)"
    )


def _split(token: str) -> tuple[str, str, str] | None:
    """(name, "=" or "", value) of ``--KEY[=VALUE]`` or Angel's ``-DKEY[=VALUE]``; None for
    anything else."""
    if token.startswith("-D") and len(token) > 2:
        return token[2:].partition("=")
    if token.startswith("--") and token != "--":
        return token[2:].partition("=")
    return None


def key_options(
    extra: Sequence[str],
    options: Sequence[str] = (),
    conf_file: str | None = None,
    sets: Sequence[str] = (),
) -> list[str]:
    """Angel's submit style ``--KEY VALUE``, ``--KEY=VALUE`` or ``-DKEY=VALUE`` (also
    ``-DKEY VALUE``) for every declared key, as ``KEY=VALUE`` items for ``--set``; ``options``
    are the verb's own option strings (for the suggestion when a name is neither). Every name
    that is neither is reported in one ConfigError, with the undeclared keys of the job file
    ``conf_file`` and of ``sets`` (--set), so that one run names every unknown key."""
    index = KeyIndex(all_keys())
    out: list[str] = []
    unknown: list[str] = []
    i = 0
    while i < len(extra):
        token = extra[i]
        parts = _split(token)
        if parts is None:
            raise ConfigError(
                f"unexpected argument {token!r}: options are --KEY VALUE, -DKEY=VALUE or "
                "--set KEY=VALUE"
            )
        name, eq, value = parts
        if not eq:
            if i + 1 >= len(extra) or _split(extra[i + 1]) is not None:
                if index.find(name) is None:
                    unknown.append(_unknown_option(name, index, options))
                    i += 1
                    continue
                raise ConfigError(f"--{name} needs a value: --{name} VALUE")
            value = extra[i + 1]
            i += 1
        if index.find(name) is None:
            unknown.append(_unknown_option(name, index, options))
        else:
            out.append(f"{name}={value}")
        i += 1
    if unknown:
        raise _unknown_options(unknown, _other_unknowns(index, conf_file, sets))
    return out
