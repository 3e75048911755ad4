"""The start-up of a job on the console: one line per phase, printed as the phase ends.

    starting a private local Ray ... 3.1 s
    loading data on 2 workers, launching 1 shard ... 1.2 s
    building the model on 2 workers ... 0.3 s

Start-up takes seconds (Ray's processes, the actors' imports, reading the data) and used to
print nothing until the banner; these lines say where the time goes. :class:`Phases` is a
standard-library-only helper (imported before Ray).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["Phases", "plural"]


def plural(n: int, what: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


class Phases:
    """Times the start-up phases of one job; prints ``<label> ... <seconds> s`` after each
    (nothing when ``quiet``). ``seconds`` keeps every phase's time, in order."""

    def __init__(self, quiet: bool = False, out: TextIO | None = None) -> None:
        self.quiet = quiet
        self.out = out
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """Time the block; its line is printed only when the block succeeds (an error is
        reported once, by whoever catches it)."""
        t0 = time.perf_counter()
        yield
        self.done(label, time.perf_counter() - t0)

    def done(self, label: str, seconds: float) -> None:
        """Record (and print) a phase measured elsewhere."""
        self.seconds[label] = seconds
        if not self.quiet:
            print(f"{label} ... {seconds:.1f} s", file=self.out or sys.stdout, flush=True)
