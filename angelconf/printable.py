"""Text from a user (a file name, a key, a value, a data line, an address) made safe to print.

Every message that quotes something a user or an input file supplied goes through
:func:`printable` (one line: the error and warning lines) or :func:`printable_lines` (a block of
lines, newlines kept: the banner, the done line): a control character (an escape sequence,
``\\r``, ``\\n``, NUL) is shown escaped as ``repr`` writes it, so a message stays one line and
cannot move the cursor, recolour or clear the terminal, or hide the text before it. Text of a
library that colours its own (Ray's tracebacks) loses its colours first (:func:`uncoloured`):
nothing writes colour codes into a file. Standard
library only, so that every layer (``angelps`` included) uses the same one.
"""

from __future__ import annotations

import re

__all__ = ["printable", "printable_lines", "uncoloured"]

#: An ANSI colour (SGR) sequence, as Ray's tracebacks and log lines carry them.
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def printable(text: str) -> str:
    """``text`` with every control character escaped as ``repr`` writes it (``\\x1b``,
    ``\\x00``, ``\\r``, ``\\n``): a message quoting an input stays one line and cannot drive the
    terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def printable_lines(text: str) -> str:
    """``text``, a block of lines, with the control characters of each line escaped (its
    ``\\n`` line ends kept)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def uncoloured(text: str) -> str:
    """``text`` without its ANSI colour sequences (``\\x1b[36m`` ... ``\\x1b[39m``), as
    Ray writes them around the ``ray::Actor.method()`` line of a remote traceback."""
    return _SGR.sub("", text)
