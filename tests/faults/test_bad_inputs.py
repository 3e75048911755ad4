"""Bad inputs: every one is exit 2 and one line naming the file (and line), before or without a
traceback; control characters from the input are escaped; SIGTERM stops like Ctrl-C.

Most cases run on the plain reader (no Ray); one runs end to end through `angelps train` on a
local Ray by default, the others are marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ray.exceptions import ActorDiedError, RayTaskError

import learners.data as D
from angelconf.config import ConfigError, load_config
from learners.cli.main import _report, main
from learners.job.loop_options import TrainPlan
from learners.job.preflight import check_resume
from learners.keys import all_keys
from learners.worker import group as worker_group
from tests.faults.procs import session

ROOT = Path(__file__).resolve().parents[2]
GOOD = "1 3:1 11:1\n-1 5:1 7:1\n"
TAIL = " (set ml.data.skip.bad.lines=true to skip malformed lines)"


def _read(path: Path, **kw: object) -> None:
    D.load_file(str(path), D.DataOptions(**{"index_range": 123, **kw}))  # type: ignore[arg-type]


def _error(path: Path, **kw: object) -> str:
    with pytest.raises(D.DataError) as e:
        _read(path, **kw)
    return str(e.value)


def test_an_empty_file_says_it_is_empty(tmp_path: Path) -> None:
    f = tmp_path / "empty.libsvm"
    f.write_bytes(b"")
    assert _error(f) == f"{f}: the input is empty: the file holds no lines (expected libsvm data)"
    d = tmp_path / "parts"
    d.mkdir()
    (d / "a").write_bytes(b"")
    (d / "b").write_bytes(b"")
    assert _error(d) == f"{d}: the input is empty: its 2 files hold no lines (expected libsvm data)"


def test_an_empty_directory(tmp_path: Path) -> None:
    assert _error(tmp_path) == f"{tmp_path}: the input directory has no data files"


def test_binary_garbage_is_escaped_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "garbage.libsvm"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x1b[2J\n")
    msg = _error(f)
    assert msg.startswith(f"{f}:1: the line holds control characters or non-ASCII bytes")
    assert msg.isprintable() and "\x1b" not in msg and "got '\\x89PNG'" in msg


def test_escape_sequences_of_a_line_are_shown_escaped(tmp_path: Path) -> None:
    f = tmp_path / "esc.libsvm"
    f.write_bytes(GOOD.encode() + b"1 3:1 \x1b]0;owned\x07\x00\n")
    msg = _error(f)
    assert msg == (
        f"{f}:3: the line holds control characters or non-ASCII bytes (binary data?); expected "
        "'<label> <id>:<value> ...' (libsvm), got '1 3:1 \\x1b]0;owned\\x07\\x00'" + TAIL
    )


def test_a_broken_compressed_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "part.libsvm.gz"
    f.write_bytes(b"not gzip at all")
    assert _error(f).startswith(f"{f}: cannot read the file (zlib inflate failed")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("abc 3:1", "the label is 'abc', not a number (a sample id first? set ml.data.sid=true); expected"),
        ("1 3: 5:1", "feature '3:' has no value; expected"),
        ("1 -3:1", "feature id -3 is negative (libsvm ids start at 1); expected"),
        ("1 124:1", "feature id 124 is outside ml.feature.index.range=123 (valid ids in a libsvm "
                    "file: 1..123)"),
        ("1 99999999999999999999:1", "a feature id has more than 18 digits (ids must fit a 64-bit "
                                     "integer)"),
        ("1 3:nan", "the value of feature 3 is 'nan', not a finite number; expected"),
        ("1 3:-inf", "the value of feature 3 is '-inf', not a finite number; expected"),
        ("inf 3:1", "the label is 'inf', not a finite number; expected"),
        ("1 3:1 3:1", "feature id 3 appears more than once (a line holds each id at most once)"),
    ],
)  # fmt: skip
def test_each_bad_libsvm_line_is_named(tmp_path: Path, line: str, reason: str) -> None:
    f = tmp_path / "bad.libsvm"
    f.write_text(GOOD + line + "\n")
    msg = _error(f)
    assert msg.startswith(f"{f}:3: {reason}") and msg.endswith(TAIL)


def test_a_deepfm_row_with_the_wrong_field_count(tmp_path: Path) -> None:
    f = tmp_path / "census.dummy"
    f.write_text("1 0 5 9\n0 1 6\n")
    msg = _error(f, kind="dummy", field_num=3)
    assert msg == f"{f}:2: expected exactly ml.fm.field.num=3 features, got 2" + TAIL


def test_parquet_with_a_wrong_schema_or_string_labels(tmp_path: Path) -> None:
    f = tmp_path / "schema.parquet"
    pq.write_table(pa.table({"x": [1.0], "y": [[1]]}), f)
    assert _error(f, kind="parquet") == (
        f"{f}: Parquet column(s) ids, label not found; the file has x, y "
        "(set ml.data.parquet.label.col / ml.data.parquet.ids.col)"
    )
    f = tmp_path / "strings.parquet"
    pq.write_table(pa.table({"label": ["yes", "no"], "ids": [[1], [2]]}), f)
    assert _error(f, kind="parquet") == (
        f"{f}: Parquet label column label has type string, expected a number"
    )
    f = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"label": [1.0, 0.0], "ids": [[1, 4], [2, 7, 2]]}), f)
    assert _error(f, kind="parquet") == (
        f"{f}: row 1: feature id 2 appears more than once in the row" + TAIL
    )


def test_repeated_ids_are_skipped_with_the_others_when_asked(tmp_path: Path) -> None:
    f = tmp_path / "dup.dummy"
    f.write_text("1 4 2 4\n0 1 2\n1 9 3 9 3\n")
    stats = D.ReadStats()
    batch = D.load_file(str(f), D.DataOptions(kind="dummy", skip_bad_lines=True), stats=stats)
    assert len(batch) == 1 and batch.ids.tolist() == [1, 2]
    assert stats.bad_examples == [
        f"{f}:1: feature id 4 appears more than once (a line holds each id at most once)",
        f"{f}:3: feature id 3 appears more than once (a line holds each id at most once)",
    ]


def test_a_worker_error_reaches_the_driver_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's DataError comes back from Ray wrapped; worker_group.get raises it as itself."""
    cause = D.DataError("f:3: bad")
    wrapped = RayTaskError("data_summary", "Traceback ...\nDataError: f:3: bad", cause)

    def failing_get(refs: object) -> None:
        raise wrapped

    monkeypatch.setattr(worker_group.ray, "get", failing_get)
    with pytest.raises(D.DataError) as e:
        worker_group.get([])
    assert e.value is cause and e.value.__cause__ is wrapped


def test_cli_escapes_control_characters_of_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "job.properties"
    f.write_text("ml.epoch.num = \x1b[31mmany\x1b[0m\n")
    assert main(["conf", "--conf", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert "\\x1b[31mmany\\x1b[0m" in err


def test_schedule_refuses_to_plot_too_many_steps(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["schedule", "--steps", "100000000000", "--plot", "x.png"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "angelps: error: --steps 100000000000 with --plot: at most 1000000 steps can be drawn "
        "(print them without --plot)\n"
    )


def test_schedule_json_is_written_in_blocks_as_one_document(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["schedule", "--set", "ml.opt.decay.class.name=OneCycleLR", "--format", "json"]
    assert main([*argv, "--steps", "70000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["steps"] == 70000 and len(doc["lr"]) == len(doc["momentum"]) == 70000
    assert doc["lr"][0] == pytest.approx(0.02, rel=1e-9) and doc["momentum"][0] == 0.95


def test_sigterm_stops_cleanly_with_143() -> None:
    """A huge schedule streams (memory flat) until SIGTERM ends it: 143, one line, no dump."""
    cmd = [sys.executable, "-m", "angelps", "schedule", "--steps", "100000000000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"update,lr\n"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert err == b"angelps: terminated (SIGTERM); stopped cleanly\n"


def test_resume_with_no_epochs_left_says_so() -> None:
    conf = load_config(None, ["ml.epoch.num=10", "angel.save.model.path=runs/x"], all_keys())
    plan = TrainPlan.from_config(conf)
    with pytest.raises(ConfigError) as e:
        check_resume({"learner": {"next_epoch": 40}}, plan)
    assert str(e.value) == (
        "--resume: the checkpoint in runs/x has trained 40 epoch(s) and ml.epoch.num=10, so there "
        "is nothing left to train; ml.epoch.num is the total number of epochs: set it above 40 "
        "to train more"
    )
    check_resume({"learner": {"next_epoch": 9}}, plan)
    # Another model's checkpoint is named as such first (it said "nothing left to train", or,
    # with epochs to go, that a table's rows differ).
    softmax = {"learner": {"next_epoch": 40, "model": "SoftmaxRegression"}}
    with pytest.raises(ConfigError) as e:
        check_resume(softmax, plan, conf)
    assert str(e.value) == (
        "--resume: the checkpoint in runs/x holds a SoftmaxRegression model, but "
        "ml.model.class.name=LogisticRegression (default): resume with the job that wrote it, or "
        "train this one afresh (without --resume) into another angel.save.model.path"
    )
    check_resume({"learner": {"next_epoch": 9, "model": "LogisticRegression"}}, plan, conf)


def _train(data: Path, *extra: str, conf: str = "conf/lr_a9a.properties") -> tuple[int, str]:
    cmd = [sys.executable, "-m", "angelps", "train", "--conf", conf]
    cmd += ["--set", f"angel.train.data.path={data}", "--set", "ml.epoch.num=1"]
    cmd += ["--set", "angel.save.model.path=", "--set", f"angel.log.path={data.parent / 'log'}"]
    cmd += list(extra)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return out.returncode, out.stderr


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("angelps: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_train_on_a_bad_line_exits_2_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.libsvm"
    f.write_text(GOOD * 20 + "abc 3:1\n")
    code, err = _train(f)
    assert code == 2, err
    assert _one_error_line(err) == (
        f"angelps: error: {f}:41: the label is 'abc', not a number (a sample id first? set "
        "ml.data.sid=true); expected '<label> "
        "<id>:<value> ...' (libsvm), got 'abc 3:1'" + TAIL
    )


@pytest.mark.slow
def test_train_on_an_empty_file_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "empty.libsvm"
    f.write_bytes(b"")
    code, err = _train(f)
    assert code == 2, err
    assert _one_error_line(err) == (
        f"angelps: error: {f}: the input is empty: the file holds no lines (expected libsvm data)"
    )


@pytest.mark.slow
def test_train_deepfm_on_a_short_row_with_two_workers_exits_2(tmp_path: Path) -> None:
    src = (ROOT / "data/census/census_148d_train.dummy").read_text().splitlines()[:200]
    src[150] = " ".join(src[150].split()[:-1])
    f = tmp_path / "census.dummy"
    f.write_text("\n".join(src) + "\n")
    code, err = _train(
        f, "--set", "angel.workergroup.number=2", conf="conf/deepfm_census.properties"
    )
    assert code == 2, err
    assert _one_error_line(err) == (
        f"angelps: error: {f}:151: expected exactly ml.fm.field.num=13 features, got 12" + TAIL
    )


@pytest.mark.slow
def test_sigterm_during_training_stops_cleanly_with_143(tmp_path: Path) -> None:
    """Ray takes SIGTERM over in ray.init; the driver takes it back: 143, one line, no dump."""
    model, log = tmp_path / "model", tmp_path / "log"
    cmd = [sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties",
           "--set", "ml.epoch.num=200", "--set", f"angel.save.model.path={model}",
           "--set", f"angel.log.path={log}"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (model / "manifest.json").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert "angelps: terminated (SIGTERM); stopped cleanly" in err
    assert "Traceback" not in err and "SIGTERM received" not in err


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [
        (signal.SIGTERM, 143, "angelps: terminated (SIGTERM); stopped cleanly"),
        (signal.SIGINT, 130, "angelps: interrupted; stopped cleanly"),
    ],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_stop_while_the_private_ray_starts_ends_cleanly_leaving_nothing(
    tmp_path: Path, sig: signal.Signals, code: int, line: str
) -> None:
    """SIGTERM or Ctrl-C in the middle of ``ray.init``: the exit code and one line, and no
    process of the job left (Ray's own SIGTERM handler exited 15 at once, and both left a
    half-started Ray's agents running)."""
    cmd = [sys.executable, "-m", "angelps", "train", "--conf", "conf/lr_a9a.properties",
           "--set", "ml.epoch.num=1", "--set", f"angel.log.path={tmp_path / 'log'}",
           "--set", f"angel.save.model.path={tmp_path / 'model'}"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not session(proc.pid, "gcs_server"):  # Ray's first process: ray.init is under way
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "Ray did not start within 120 s"
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        for _ in range(100):  # what Ray started ends in seconds
            if not session(proc.pid):
                break
            time.sleep(0.1)
        left = session(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for left_over in session(proc.pid):  # whatever a failed run left behind
            try:
                os.kill(left_over, signal.SIGKILL)
            except OSError:
                pass
    assert (proc.returncode, err) == (code, line + "\n")
    assert "angelps train" not in out  # stopped before the job's banner
    assert left == []


def _default_sigint() -> None:
    # A child of a shell's background job starts with SIGINT ignored; Ctrl-C must reach it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_actor_that_died_in_its_constructor_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ray keeps only the text of a constructor's error: its last line is the error itself."""
    tb = 'Traceback (most recent call last):\n  File "w.py", line 9, in __init__\nRuntimeError: no GPU'
    died = ActorDiedError(RayTaskError("TrainWorker.__init__", tb, RuntimeError("no GPU")))
    assert _report(died, debug=False) == 1
    assert capsys.readouterr().err == (
        "angelps: failed: ActorDiedError: RuntimeError: no GPU\n"
        "angelps: set ANGELPS_DEBUG=1 for the traceback\n"
    )


def test_schedule_into_a_closed_pipe_stops_quietly() -> None:
    """`angelps schedule --steps 100000000000 | head -1`: exit 0, nothing on stderr."""
    cmd = [sys.executable, "-m", "angelps", "schedule", "--steps", "100000000000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"update,lr\n"
        proc.stdout.close()
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (0, b"")
