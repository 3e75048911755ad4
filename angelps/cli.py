"""The `angelps` command line: train | predict | evaluate | schedule | conf | plot.

Exit codes: 0 success, 2 bad configuration or input, 1 failure while running, 130 interrupted.
Errors are one clear line on stderr; set ANGELPS_DEBUG=1 to see the traceback too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from angelps.config import add_config_arguments

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

# Each verb module exposes register(subparsers); the verbs live in learners, where the
# training code is, so that angelps itself never depends on learners.
_VERB_MODULES = ("learners.cli_train", "learners.cli_schedule", "learners.cli_plot")

_EPILOG = """\
examples:
  angelps train --conf conf/lr_a9a.properties
  angelps train --conf conf/lr_a9a.properties --set ml.epoch.num=5 --summary-json out.json
  angelps schedule --set ml.opt.decay.class.name=CosineAnnealingLR --set ml.opt.decay.t.max=100 --steps 5
  angelps conf --conf conf/lr_a9a.properties --set ml.learn.rate=0.1
  angelps conf --keys
"""


def _register_conf(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "conf",
        help="print the effective configuration, or every declared key",
        description="Print the effective configuration with the source of every value "
        "(default, file:line, command line), or list every declared key.",
        epilog="examples:\n"
        "  angelps conf --conf conf/lr_a9a.properties --set ml.learn.rate=0.1\n"
        "  angelps conf --keys\n"
        "  angelps conf --markdown > docs/config.md\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(p)
    p.add_argument("--keys", action="store_true", help="list every key with type, default and doc")
    p.add_argument("--markdown", action="store_true", help="print docs/config.md")
    p.add_argument("--all", action="store_true", help="also show keys left at their default")
    p.set_defaults(func=_run_conf)


def _run_conf(args: argparse.Namespace) -> int:
    from angelps.config import _format, load_config, render_markdown
    from learners.keys import all_keys, key_groups

    if args.markdown:
        sys.stdout.write(render_markdown(key_groups()))
        return EXIT_OK
    if args.keys:
        for k in sorted(all_keys(), key=lambda k: k.name):
            default = "(unset)" if k.default is None else _format(k.default)
            print(f"{k.name}  [{k.type}, default {default}]  {k.doc}")
        return EXIT_OK
    conf = load_config(args.conf, args.set, all_keys())
    width = max(len(k) for k in conf)
    for name in sorted(conf):
        if not args.all and not conf.is_set(name):
            continue
        value = conf[name]
        shown = "(unset)" if value is None else _format(value)
        print(f"{name:<{width}} = {shown:<24} # {conf.source(name)}")
    if not args.all:
        print("# keys left at their default are hidden; --all shows them", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every verb."""
    parser = argparse.ArgumentParser(
        prog="angelps",
        description="angelps: parameter-server training on Ray and PyTorch, configured by "
        "Angel-style .properties files.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from angelps import __version__

    parser.add_argument("--version", action="version", version=f"angelps {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in _VERB_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a verb module that exists but fails to import is a bug
                raise
            continue
        module.register(sub)
    _register_conf(sub)
    return parser


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from angelps.config import ConfigError

    types: list[type[BaseException]] = [ConfigError, FileNotFoundError]
    try:
        from learners.data import DataError

        types.append(DataError)
    except ImportError:  # the data module may define no DataError
        pass
    return tuple(types)


def _root_cause(exc: BaseException) -> BaseException:
    """Errors raised inside Ray actors arrive wrapped; report what really went wrong."""
    seen = 0
    while seen < 8:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException) and cause is not exc:
            exc = cause
            seen += 1
            continue
        break
    return exc


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    debug = os.environ.get("ANGELPS_DEBUG", "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("angelps: interrupted; stopped cleanly", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one place that turns errors into exit codes
        root = _root_cause(exc)
        if debug:
            traceback.print_exc()
        bad = isinstance(root, _bad_input_types()) or isinstance(exc, _bad_input_types())
        err = root if isinstance(root, _bad_input_types()) else exc
        if bad:
            print(f"angelps: error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"angelps: failed: {type(root).__name__}: {root}", file=sys.stderr)
        if not debug:
            print("angelps: set ANGELPS_DEBUG=1 for the traceback", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
