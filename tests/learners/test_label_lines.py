"""A bad label is named by its file and line: the models check labels a batch at a time, where
the rows' source is not known, so a worker checks the rows it holds once its model is built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from learners.cli.main import main
from learners.data import DataOptions, line_of
from learners.data.labels import binary_labels01
from learners.worker.data_part import _first_failing

ROOT = Path(__file__).resolve().parents[2]
A9A = ROOT / "data/a9a/a9a_123d_train.libsvm"


def test_line_of_counts_the_lines_of_the_files_before(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in/part-0").write_text("1 1:1\n\n0 2:1\n")  # 3 lines, a blank one
    (tmp_path / "in/part-1").write_text("1 1:1\n0 3:1")  # no newline at the end
    opts = DataOptions(kind="libsvm")
    assert line_of(str(tmp_path / "in"), opts, 2) == f"{tmp_path / 'in/part-0'}:3"
    assert line_of(str(tmp_path / "in"), opts, 4) == f"{tmp_path / 'in/part-1'}:2"


def test_the_first_failing_row_is_where_a_check_of_the_values_starts_failing() -> None:
    y = np.array([1, -1, 1, 0, 1, 2], dtype=np.float32)  # -1 and 0 mixed: row 3
    assert _first_failing(y, binary_labels01) == 3
    assert _first_failing(np.array([2.0], np.float32), binary_labels01) == 0


@pytest.mark.parametrize(
    ("conf", "edit", "sets", "said"),
    [
        (
            "lr_a9a",
            (57, "2"),
            ["ml.data.validate.ratio=0.5"],
            ":57: binary labels must be -1/+1 or 0/1; found -1, 1, 2 (map other labels",
        ),
        (
            "softmax_dna",
            None,
            ["ml.num.class=2"],
            "data/dna/dna.scale:2: label 3 (2 after ml.data.label.trans.class=SubOneTrans) is "
            "not a class index in 0..1 (ml.num.class=2): labels 1..2 are expected with SubOneTrans",
        ),
    ],
)
def test_a_bad_label_stops_the_job_naming_its_file_and_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    conf: str,
    edit: tuple[int, str] | None,
    sets: list[str],
    said: str,
) -> None:
    sets = [*sets, "ml.epoch.num=1", f"angel.log.path={tmp_path / 'log'}"]
    sets.append(f"angel.save.model.path={tmp_path / 'model'}")
    if edit is not None:
        lines = A9A.read_text().splitlines()[:400]
        row, label = edit
        lines[row - 1] = label + lines[row - 1][2:]  # (a9a's labels are -1 and +1)
        (tmp_path / "data.libsvm").write_text("\n".join(lines) + "\n")
        sets.append(f"angel.train.data.path={tmp_path / 'data.libsvm'}")
    argv = ["train", "--conf", str(ROOT / f"conf/{conf}.properties")]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 2
    err = capsys.readouterr().err
    assert "angelps: error: " in err and said in err, err
    assert not (tmp_path / "model").exists()
