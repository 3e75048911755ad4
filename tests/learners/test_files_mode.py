"""learners/runs/output_file.py: an output file honours the umask (0644 under 022), still written whole."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from learners.runs.output_file import current_umask, replace_atomically


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_a_written_file_has_the_mode_the_umask_gives(tmp_path: Path, umask: int, mode: int):
    old = os.umask(umask)
    try:
        assert current_umask() == umask
        out = tmp_path / "pred.csv"
        out.write_text("old\n")
        replace_atomically(out, lambda tmp: Path(tmp).write_text("new\n"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == mode and out.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.csv"]
