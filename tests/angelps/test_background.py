"""The writer threads of checkpoints and backups (angelps/background.py): below training's
priority (their own nice value on Linux), the caller's untouched."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from angelps.background import NICE, run_writing, writer_pool


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice: Linux")
def test_writers_run_below_training_s_priority() -> None:
    mine = _nice()
    assert writer_pool().submit(_nice).result() == max(NICE, mine)
    assert asyncio.run(run_writing(_nice)) == max(NICE, mine)
    assert _nice() == mine  # the caller's thread as it was
    names = asyncio.run(run_writing(lambda: threading.current_thread().name))
    assert names.startswith("angelps-writer")
