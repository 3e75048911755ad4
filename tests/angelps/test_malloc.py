"""angelps/malloc.py: a process that frees megabytes a step keeps them (no page faults a step)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A step that allocates three 8 MB blocks, touches them and frees them all, as a shard's call
# does with its temporaries: with glibc's adaptive defaults the heap's top (24 MB free, over
# its trim threshold of twice the last block) goes back to the system each step, and the next
# step faults every page in again.
_STEPS = """
import resource, sys
import numpy as np
sys.path.insert(0, {root!r})
from angelps.malloc import keep_freed_memory
if {tuned}:
    assert keep_freed_memory()
def steps(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        blocks = [np.empty(1 << 20) for _ in range(3)]
        for b in blocks:
            b.fill(1.0)
        del blocks, b
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
steps(2)
print(steps(20))
"""


def _faults(tuned: bool) -> int:
    code = _STEPS.format(root=str(ROOT), tuned=tuned)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_are_kept_and_reused_without_faulting_again():
    assert _faults(False) > 20 * 1000  # (1,500 pages a step with the defaults, here)
    assert _faults(True) < 500


def test_it_is_a_no_op_elsewhere(monkeypatch):
    from angelps import malloc

    monkeypatch.setattr(malloc.sys, "platform", "darwin")
    assert malloc.keep_freed_memory() is False


def test_available_memory_is_what_the_kernel_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MemAvailable`` where /proc/meminfo has it, else the free pages."""
    import builtins
    import io
    import os

    from angelps import malloc

    real_open = builtins.open

    def meminfo(text: str | None) -> Callable[..., Any]:
        def fake(path: str, *a: Any, **kw: Any) -> Any:
            if path == "/proc/meminfo":
                if text is None:
                    raise FileNotFoundError(path)
                return io.StringIO(text)
            return real_open(path, *a, **kw)

        return fake

    monkeypatch.setattr(
        builtins, "open", meminfo("MemTotal: 900 kB\nMemFree: 100 kB\nMemAvailable: 512 kB\n")
    )
    assert malloc.available_bytes() == 512 * 1024
    monkeypatch.setattr(builtins, "open", meminfo(None))
    page = os.sysconf("SC_PAGE_SIZE")
    assert malloc.available_bytes() % page == 0
    assert 0 < malloc.available_bytes() <= os.sysconf("SC_PHYS_PAGES") * page
