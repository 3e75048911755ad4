"""learners/runs/output_file.py: an output file is replaced whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from learners.runs.output_file import replace_atomically


def test_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "pred.csv"
    out.write_text("old\n")
    replace_atomically(out, lambda tmp: Path(tmp).write_text("new\n"))
    assert out.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.csv"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    out.write_bytes(b"previous")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_bytes(b"par")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        replace_atomically(out, half_then_fail)
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_ctrl_c_during_the_write_keeps_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "pred.parquet"

    def interrupted(tmp: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_atomically(out, interrupted)
    assert list(tmp_path.iterdir()) == []
