"""SIGTERM stops the driver as Ctrl-C does: :class:`Terminated` raised in the main thread.

The command line installs the handler for the time a verb runs (:func:`sigterm_unwinds`), so a
``kill`` unwinds the verb (Ray shut down, the last checkpoint kept) and exits 143 with one
line. ``ray.init`` puts its own SIGTERM handling in place (a Python ``sys.exit(15)`` behind a C++
handler that prints a stack dump), so the driver takes SIGTERM back once Ray is up
(:func:`retake_sigterm`, called where the workers start). Standard library only: the
config-only verbs import this without Ray.

Invariant: the handler is only ever installed from the main thread, and only while
:func:`sigterm_unwinds` is active (outside it, e.g. the Python API, SIGTERM is left as it is).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = [
    "Terminated",
    "received",
    "retake_sigterm",
    "sigterm_unwinds",
    "stops_held",
    "unwinding",
]

_active = False
#: Whether a SIGTERM has unwound this process (learners.job.actors stops Ray at once then).
_received = False


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that the running verb unwinds as after Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = True
    raise Terminated()


def received() -> bool:
    """Whether a SIGTERM has reached this process while :func:`sigterm_unwinds` was active."""
    return _received


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While active, SIGTERM raises :class:`Terminated` (main thread only)."""
    global _active, _received
    if not _main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _active, _received = True, False
    try:
        yield
    finally:
        _active = False
        signal.signal(signal.SIGTERM, previous)


def retake_sigterm() -> None:
    """Put the handler back after ``ray.init`` replaced it (no-op outside :func:`sigterm_unwinds`)."""
    if _active and _main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def unwinding() -> bool:
    """Whether SIGTERM unwinds this thread now (inside :func:`sigterm_unwinds`, main thread)."""
    return _active and _main_thread()


@contextmanager
def stops_held() -> Iterator[None]:
    """Inside :func:`sigterm_unwinds`: a SIGTERM or Ctrl-C (SIGINT) during the block is held,
    and raised (:class:`Terminated`, ``KeyboardInterrupt``) when the block ends (not when it
    raises: its own error goes first).

    For a step that must not be cut in half: a private Ray's start, whose processes a
    half-done ``ray.init`` would leave running (its agents outlive it). Once it is up, the
    job stops it as after any other stop. SIGINT is held only where Python's own handler
    is in place (someone else's is left alone)."""
    if not unwinding():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    own_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGTERM, hold)
    if own_int:
        signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, _on_sigterm)
        if own_int:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.SIGTERM in held:
        global _received
        _received = True
        raise Terminated()
    if held:
        raise KeyboardInterrupt()
