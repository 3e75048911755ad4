"""The Java ``.properties`` syntax: comments, separators, continuations and escapes.

:func:`parse_properties` turns a file's text into ``(key, value, line)`` entries and nothing
more: no types, no key names, no defaults (that is :mod:`angelconf.config`). It follows
``java.util.Properties.load``: ``#`` and ``!`` start comments, ``=``, ``:`` or whitespace
separate a key from its value, a line ending in an odd number of ``\\`` continues on the next,
and ``\\t``, ``\\n``, ``\\uXXXX``... are unescaped. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ConfigError", "Entry", "parse_properties"]


class ConfigError(ValueError):
    """A configuration problem: unknown key, bad value, unreadable file, missing required key."""


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


@dataclass(frozen=True)
class Entry:
    """One key/value pair read from a properties file, with the line where its key starts."""

    key: str
    value: str
    line: int


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Join ``\\``-continued physical lines; skip blank lines and comments (``#`` or ``!``)."""
    physical = text.splitlines()
    i = 0
    while i < len(physical):
        start = i + 1
        line = physical[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        # A line continues when it ends in an odd number of backslashes.
        while _ends_with_continuation(line) and i < len(physical):
            line = line[:-1] + physical[i].lstrip(" \t\f")
            i += 1
        if _ends_with_continuation(line):
            line = line[:-1]
        yield start, line


def _ends_with_continuation(line: str) -> bool:
    n = len(line) - len(line.rstrip("\\"))
    return n % 2 == 1


def _unescape(raw: str, where: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= len(raw):
            break
        c = raw[i]
        if c == "u":
            hexdigits = raw[i + 1 : i + 5]
            if len(hexdigits) != 4 or not all(h in "0123456789abcdefABCDEF" for h in hexdigits):
                raise ConfigError(f"{where}: malformed \\uXXXX escape {raw[i - 1 : i + 5]!r}")
            out.append(chr(int(hexdigits, 16)))
            i += 5
            continue
        out.append(_ESCAPES.get(c, c))
        i += 1
    return "".join(out)


def parse_properties(text: str, source: str = "<string>") -> list[Entry]:
    """Parse Java ``.properties`` text into entries, in file order (later ones win on merge).

    Rules as ``java.util.Properties.load``: ``#``/``!`` comments, ``=``, ``:`` or whitespace
    separators, ``\\`` line continuations, ``\\uXXXX`` and ``\\t \\n \\r \\f`` escapes, any other
    escaped character stands for itself.
    """
    entries: list[Entry] = []
    for lineno, line in _logical_lines(text):
        where = f"{source}:{lineno}"
        # The key ends at the first unescaped '=', ':' or whitespace.
        i = 0
        while i < len(line):
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c in "=: \t\f":
                break
            i += 1
        key_raw = line[:i]
        rest = line[i:].lstrip(" \t\f")
        # Whitespace, then at most one '=' or ':', then whitespace, is one separator.
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        entries.append(Entry(_unescape(key_raw, where), _unescape(rest, where), lineno))
    return entries
