"""The ``conf`` verb: the effective configuration with the source of every value, every declared
key, or docs/config.md. It reads only key declarations (no torch, no Ray)."""

from __future__ import annotations

import argparse
import sys

from angelconf.config import ConfigError, format_value
from angelconf.render import render_markdown
from decay.keys import PREFIX
from decay.registry import schedule_class
from learners.cli.common import EXIT_OK, Subparsers, add_config_arguments, add_verb, load_job
from learners.data.problems import printable
from learners.job.sparse_keys import unused_placement_keys
from learners.keys import all_keys, key_groups
from learners.models.config import unused_model_keys

__all__ = ["register", "run"]


def register(sub: Subparsers) -> None:
    """Add the ``conf`` sub-command."""
    p = add_verb(
        sub,
        "conf",
        help="print the effective configuration, or every declared key",
        description="Print the effective configuration with the source of every value "
        "(default, file:line, command line), or list every declared key.",
        examples=[
            "angelps conf --conf conf/lr_a9a.properties --set ml.learn.rate=0.1",
            "angelps conf --keys",
            "angelps conf --markdown > docs/config.md",
        ],
    )
    add_config_arguments(p)
    p.add_argument("--keys", action="store_true", help="list every key with type, default and doc")
    p.add_argument("--markdown", action="store_true", help="print docs/config.md")
    p.add_argument("--all", action="store_true", help="also show keys left at their default")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print what was asked; a bad key or value raises ConfigError (exit code 2)."""
    if args.markdown:
        sys.stdout.write(render_markdown(key_groups()))
        return EXIT_OK
    if args.keys:
        for k in sorted(all_keys(), key=lambda k: k.name):
            default = "(unset)" if k.default is None else format_value(k.default)
            print(f"{k.name}  [{k.type}, default {default}]  {k.doc}")
        return EXIT_OK
    conf = load_job(args)
    # Every schedule the job names is one train knows (train and schedule refuse it at once).
    for name in sorted(k for k in conf if k.startswith(PREFIX) and k.endswith("class.name")):
        if conf[name] is not None:
            try:
                schedule_class(str(conf[name]), name)
            except ValueError as e:
                said = f"{name}={conf[name]}"  # (where it was set, after it)
                text = str(e).replace(said, f"{said} ({conf.source(name)})", 1)
                raise ConfigError(text) from None
    # (as train says them, before the job starts; the optimizers' keys need numpy: train's)
    for unused in [*unused_model_keys(conf), *unused_placement_keys(conf)]:
        print(printable(f"angelps: warning: {unused}"), file=sys.stderr)
    width = max(len(k) for k in conf)
    for name in sorted(conf):
        if not args.all and not conf.is_set(name):
            continue
        value = conf[name]
        # A value (or a file name in its source) may hold control characters: escaped, so a
        # job file cannot drive the terminal or split a line.
        shown = "(unset)" if value is None else printable(format_value(value))
        print(f"{name:<{width}} = {shown:<24} # {printable(conf.source(name))}")
    if not args.all:
        print("# keys left at their default are hidden; --all shows them", file=sys.stderr)
    return EXIT_OK
