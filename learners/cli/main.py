"""The ``angelps`` entry point: the parser of every verb, and errors turned into exit codes.

Exit codes: 0 success, 2 bad configuration or input, 1 failure while running, 130 interrupted
(Ctrl-C, SIGINT), 143 terminated (SIGTERM). Both signals stop the same way: the verb unwinds
(Ray shut down, the last checkpoint left as it was) and one line says so.

Errors are one line on stderr; set ANGELPS_DEBUG=1 to see the traceback too. The line is
printable: control characters that came from an input file (escape sequences, NUL, carriage
returns, newlines) are shown escaped, as ``repr`` writes them, and an error raised inside a Ray
actor is reported as its last line (the original error), not as the actor's traceback. The
traceback of ANGELPS_DEBUG=1 is written without Ray's colour codes.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Sequence

from angelconf.config import ConfigError
from angelconf.printable import printable_lines, uncoloured
from angelps import __version__
from learners.cli import conf, predict, schedule, submit, train
from learners.cli import export as export_verb
from learners.cli import plot as plot_verb
from learners.cli.common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, key_options
from learners.data.problems import DataError, printable
from learners.job.terminate import Terminated, sigterm_unwinds
from learners.job.terminate import received as received_sigterm

__all__ = ["EXIT_TERMINATED", "build_parser", "main"]

EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process ended by it

# Errors that mean "your input is wrong" (exit 2) rather than "something failed" (exit 1).
_BAD_INPUT = (ConfigError, DataError, FileNotFoundError)

_EPILOG = """\
examples:
  angelps train --conf conf/lr_a9a.properties
  angelps train --conf conf/lr_a9a.properties --set ml.epoch.num=5 --summary-json out.json
  angelps train --conf conf/lr_a9a.properties --ml.epoch.num 5 --angel.save.model.path runs/lr/model
  angelps predict --conf conf/lr_a9a.properties --angel.load.model.path runs/lr/model \\
      --angel.predict.data.path data/a9a/a9a_123d_train.libsvm --angel.predict.out.path pred.csv
  angelps submit --conf job.properties --action.type train_predict
  angelps schedule --set ml.opt.decay.class.name=CosineAnnealingLR --set ml.opt.decay.t.max=100 --steps 5
  angelps conf --conf conf/lr_a9a.properties --set ml.learn.rate=0.1
  angelps conf --keys
"""


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every verb."""
    parser = argparse.ArgumentParser(
        prog="angelps",
        description="angelps: parameter-server training on Ray and PyTorch, configured by "
        "Angel-style .properties files.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"angelps {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in (train, predict, submit, export_verb, schedule, plot_verb, conf):
        verb.register(sub)
    return parser


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


def _message(exc: BaseException) -> str:
    """The one line that describes ``exc``: a Ray error's text is the remote traceback, whose
    last line is the original error."""
    text = str(exc)
    if type(exc).__module__.startswith("ray.") and "\n" in text.strip():
        text = text.strip().splitlines()[-1]
    return printable(text)


def _report(exc: Exception, debug: bool) -> int:
    """One line on stderr for ``exc``; the exit code it stands for."""
    root = _root_cause(exc)
    if debug:
        # Ray colours the remote traceback's header, and a quoted input may hold control
        # characters: neither reaches a terminal or a log file raw.
        text = uncoloured(traceback.format_exc()).rstrip("\n")
        print(printable_lines(text), file=sys.stderr)
    if isinstance(root, _BAD_INPUT) or isinstance(exc, _BAD_INPUT):
        err = root if isinstance(root, _BAD_INPUT) else exc
        print(f"angelps: error: {_message(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"angelps: failed: {type(root).__name__}: {_message(root)}", file=sys.stderr)
    if not debug:
        print("angelps: set ANGELPS_DEBUG=1 for the traceback", file=sys.stderr)
    return EXIT_FAILURE


def _plain_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
) -> str:
    """A Python warning as one line, ``angelps: warning: MESSAGE``, without Ray's colour codes
    and with the control characters of a value it quotes escaped. The source file and line of
    the code that warned (Python's own form, two lines) are for whoever debugs angelps: with
    ANGELPS_DEBUG=1."""
    if os.environ.get("ANGELPS_DEBUG", "") not in ("", "0"):
        text = _formatwarning(message, category, filename, lineno, line)
    else:
        text = f"angelps: warning: {str(message).removeprefix('angelps: ')}"
    return printable_lines(uncoloured(text.rstrip("\n"))) + "\n"


_formatwarning = warnings.formatwarning


def _verb_options(parser: argparse.ArgumentParser, verb: str) -> list[str]:
    """The option strings of ``verb``'s sub-command (for the suggestion of a mistyped one)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [o for a in sub.choices[verb]._actions for o in a.option_strings if o.startswith("--")]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "set"):
        parser.parse_args(argv)  # a verb without keys: argparse's own error (exit 2)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    debug = os.environ.get("ANGELPS_DEBUG", "") not in ("", "0")
    warnings.formatwarning = _plain_warning
    try:
        if extra:  # Angel's submit style: --KEY VALUE for any declared key, after --set
            options = _verb_options(parser, args.verb)
            found = key_options(extra, options, getattr(args, "conf", None), args.set)
            args.set = [*args.set, *found]
        with sigterm_unwinds():
            return int(args.func(args) or 0)
    except Terminated:
        print("angelps: terminated (SIGTERM); stopped cleanly", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        if received_sigterm():
            # Ray's threads interrupt the main thread when its GCS goes away, which a SIGTERM
            # to the whole process group does: still the SIGTERM's stop.
            print("angelps: terminated (SIGTERM); stopped cleanly", file=sys.stderr)
            return EXIT_TERMINATED
        print("angelps: interrupted; stopped cleanly", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one place that turns errors into exit codes
        return _report(exc, debug)


def run() -> None:
    """The console script: :func:`main`, then :func:`end`."""
    end(main())


def end(code: int) -> None:
    """End the process with ``code``, at once when it stopped its own Ray.

    A finished job's interpreter still spends 0.5-1 s in exit handlers (torch's, Ray's), after
    everything of the job is written, closed and shut down. Where this process started and
    stopped its own Ray, the output streams are flushed and the process ends at once; where it
    joined a cluster (Ray still connected), Ray's own exit handler disconnects it as usual.
    A private Ray ended at once on SIGTERM (learners.job.private_ray.abandoned) is not waited for."""
    ray = sys.modules.get("ray")
    stopped = getattr(sys.modules.get("learners.job.private_ray"), "abandoned", False)
    if ray is not None and (not ray.is_initialized() or stopped):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
