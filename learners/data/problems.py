"""Malformed input: the error, the read counts, and the one rule that chooses between them.

A parser never raises for a bad line or row itself: it returns ``(where, reason)`` messages in
input order, and :func:`reject` either raises :class:`DataError` for the first one or, under
``ml.data.skip.bad.lines=true``, counts them all in :class:`ReadStats`. Text quoted from an input
goes through :func:`printable` (:mod:`angelconf.printable`) first. A schema problem (a
Parquet column of the wrong type, an unreadable file) is not a bad row and always raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from angelconf.printable import printable

__all__ = ["FORMAT_HINT", "DataError", "ReadStats", "printable", "reject"]


class DataError(ValueError):
    """Malformed input: names the file, the line (or Parquet row), what was expected and what was found."""


@dataclass
class ReadStats:
    """Counts of one or more reads; pass one to :func:`learners.data.read_file` to collect them.

    ``lines`` counts the lines of this worker's part (blank ones included); ``rows`` the rows
    returned; ``bad_lines`` the malformed lines skipped under ``ml.data.skip.bad.lines=true``,
    with the first few messages in ``bad_examples``.
    """

    lines: int = 0
    rows: int = 0
    blank_lines: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    max_examples: int = 5

    def add_bad(self, messages: Sequence[str]) -> None:
        self.bad_lines += len(messages)
        room = self.max_examples - len(self.bad_examples)
        if room > 0:
            self.bad_examples.extend(messages[:room])

    def summary(self) -> str:
        """One line for a job summary."""
        s = f"{self.rows} rows from {self.lines} lines"
        if self.blank_lines:
            s += f", {self.blank_lines} blank"
        if self.bad_lines:
            s += f", {self.bad_lines} malformed skipped (first: {self.bad_examples[0]})"
        return s


#: How a bad line's message names the format the line is in (learners.data.text).
FORMAT_HINT = "set ml.data.type="


def reject(messages: Sequence[str], *, skip: bool, stats: ReadStats) -> None:
    """Raise for the first bad line (``messages`` in input order), or count them all when
    skipping. A line in another format names it, and skipping lines is not suggested then:
    it would skip them all."""
    if not messages:
        return
    if not skip:
        if FORMAT_HINT in messages[0]:
            raise DataError(messages[0])
        raise DataError(messages[0] + " (set ml.data.skip.bad.lines=true to skip malformed lines)")
    stats.add_bad(messages)
