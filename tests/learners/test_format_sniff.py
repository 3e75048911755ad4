"""A format mismatch names the format the data is in; skipping every line is refused with the
count (learners/data/diagnose.py, learners/job/loop_options.py)."""

from __future__ import annotations

import pytest

from angelconf.config import ConfigError, load_config
from learners.data import DataOptions
from learners.data.problems import DataError, ReadStats
from learners.data.reader import load_file
from learners.job.job_size import JobSize
from learners.job.loop_options import TrainPlan
from learners.keys import all_keys


def _opts(**sets: object) -> DataOptions:
    return DataOptions.from_config(load_config(None, sets, all_keys()))


@pytest.mark.parametrize(
    ("kind", "text", "other"),
    [
        ("dummy", "1 3:1 9:1\n", "libsvm"),
        ("libsvm", "1 3 9\n", "dummy"),
        ("dummy", "1 0.5 2.25\n", "dense"),
    ],
)
def test_a_line_in_another_format_names_it(tmp_path, kind, text, other) -> None:
    f = tmp_path / "d.txt"
    f.write_text(text)
    with pytest.raises(DataError) as e:
        load_file(str(f), _opts(**{"ml.data.type": kind}))
    message = str(e.value)
    assert message.endswith(f"; the line is {other}: set ml.data.type={other}?"), message
    assert "skip.bad.lines" not in message  # skipping would skip every line


def test_a_malformed_line_still_suggests_skipping(tmp_path) -> None:
    f = tmp_path / "d.txt"
    f.write_text("1 3:1\n1 3:x\n")
    with pytest.raises(DataError, match=r"\(set ml.data.skip.bad.lines=true to skip malformed"):
        load_file(str(f), _opts())


def test_skipping_every_line_is_refused_with_the_count(tmp_path) -> None:
    f = tmp_path / "d.txt"
    f.write_text("1 3:1 9:1\n0 4:1\n")
    stats = ReadStats()
    opts = _opts(**{"ml.data.type": "dummy", "ml.data.skip.bad.lines": True})
    assert len(load_file(str(f), opts, stats=stats)) == 0 and stats.bad_lines == 2
    part = {"rows": 0, "nnz": 0, "max_id": -1, "min_nnz": 0, "max_nnz": 0}
    summary = {
        "train": part,
        "valid": part,
        "skipped_lines": stats.bad_lines,
        "skipped_first": stats.bad_examples[0],
    }
    plan = TrainPlan.from_config(load_config(None, {}, all_keys()))
    with pytest.raises(ConfigError) as e:
        JobSize.of_parts(plan, [summary], -1, -1)
    assert str(e.value) == (
        "angel.train.data.path: the training input has no rows: all 2 of its lines were "
        f"malformed and skipped (ml.data.skip.bad.lines=true); the first: {f}:1: feature "
        "'3:1' is not an id (dummy lines hold ids without values); expected '<label> <id> "
        "...' (dummy), got '1 3:1 9:1'; the line is libsvm: set ml.data.type=libsvm?"
    )
