"""The writer threads of checkpoints and backups (angelps/background.py): below training's
priority (their own nice value on Linux), the caller's untouched."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from angelps.background import LOWEST, NICE, lower_priority, run_writing, writer_pool


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice: Linux")
def test_writers_run_below_training_s_priority() -> None:
    mine = _nice()
    assert writer_pool().submit(_nice).result() == min(LOWEST, mine + NICE)
    assert asyncio.run(run_writing(_nice)) == min(LOWEST, mine + NICE)
    assert _nice() == mine  # the caller's thread as it was
    names = asyncio.run(run_writing(lambda: threading.current_thread().name))
    assert names.startswith("angelps-writer")


def _in_thread_at(nice: int) -> list[int]:
    """A thread at ``nice`` (as Ray starts its workers at 15) lowering its priority: its
    nice value before and after."""
    seen: list[int] = []

    def run() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        seen.append(_nice())
        lower_priority()
        seen.append(_nice())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice: Linux")
def test_writers_stay_below_a_process_already_niced() -> None:
    """Ray's workers run at nice 15: their writers go lower (19), never above them."""
    assert _in_thread_at(15) == [15, 19]
    assert _in_thread_at(3) == [3, 13]
