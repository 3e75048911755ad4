"""Output paths that cannot be written are refused through the real command line before Ray
starts: exit 2 and one line naming the key or option, the value and the reason
(learners/job/preflight.py, learners/job/paths.py ``cannot_write``).

Each case failed after Ray had started or after the whole training (a save or log path under
/proc or /sys, a log path that is a regular file, --summary-json or a prediction output under
/proc, a shard backup folder under /proc), with a bare OS error that named no key, exit 1 for
some. /proc refuses a new entry to root too, and a regular file cannot hold a folder for
anyone, so these cases hold whoever runs the tests (``os.access`` says yes to root there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import python_path

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")
DATA = str(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm")
TAIL = "; choose a folder you can write to"
PROC = "cannot write there (/proc: it takes no new folders (No such file or directory))" + TAIL


def _angelps(cwd: Path, *args: str) -> tuple[int, str]:
    """``python -m angelps ARGS`` in ``cwd``: its exit code and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=python_path(ROOT), ANGELPS_DEBUG="")
    proc = subprocess.run(
        [sys.executable, "-m", "angelps", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stderr


def _train(work: Path, *sets: str, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    """A small LR job of ``work`` (its model and runs kept there) with ``sets`` last."""
    args = ["train", "--conf", CONF, *extra]
    for s in (
        f"angel.train.data.path={DATA}",
        "ml.epoch.num=1",
        f"angel.save.model.path={work / 'model'}",
        f"angel.log.path={work / 'logs'}",
        *sets,
    ):
        args += ["--set", s]
    return _angelps(work, *args)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The command's directory, with a regular file ``afile`` and a file of the user."""
    (tmp_path / "afile").write_text("keep me\n")
    return tmp_path


def _refused_up_front(work: Path, rc: int, err: str, line: str) -> None:
    """Exit 2, ``line`` alone on stderr, Ray never started, nothing written or left behind."""
    assert rc == 2, err
    assert err == f"angelps: error: {line}\n", err
    assert "Ray" not in err and "Traceback" not in err
    assert sorted(p.name for p in work.iterdir()) == ["afile"]  # no model, logs or probe
    assert (work / "afile").read_text() == "keep me\n"


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("angel.save.model.path", "/proc/angelps-model", f": {PROC}"),
        ("angel.log.path", "/proc/angelps-runs", f": {PROC}"),
        ("angel.log.path", "afile", " is a file: expected the folder of the job's runs"),
        (
            "angel.log.path",
            "afile/runs",
            f": cannot write there (afile is a file, not a folder){TAIL}",
        ),
        ("angel.ps.backup.path", "/proc/angelps-backups", f": {PROC}"),
        ("angel.ps.backup.path", "afile", " is a file: expected the folder of the shard backups"),
    ],
    ids=["save-proc", "log-proc", "log-file", "log-under-file", "backup-proc", "backup-file"],
)
def test_a_train_output_folder_that_cannot_be_written_is_refused_before_ray(
    work: Path, key: str, value: str, said: str
) -> None:
    rc, err = _train(work, f"{key}={value}")
    _refused_up_front(work, rc, err, f"{key}={value} (command line){said}")


def test_a_save_path_under_sys_is_refused_before_ray(work: Path) -> None:
    """/sys refuses a new folder to root too (EPERM, or EROFS where it is mounted read-only);
    the reason is the system's own."""
    if not os.path.isdir("/sys"):
        pytest.skip("no /sys here")
    rc, err = _train(work, "angel.save.model.path=/sys/angelps-model")
    assert rc == 2, err
    head = "angelps: error: angel.save.model.path=/sys/angelps-model (command line): "
    assert err.startswith(f"{head}cannot write there (/sys: "), err
    assert err.endswith(f"){TAIL}\n") and err.count("\n") == 1, err
    assert "Ray" not in err


def test_a_summary_json_under_proc_is_refused_before_training(work: Path) -> None:
    """It failed only after the whole training, naming only the OS error."""
    rc, err = _train(work, extra=("--summary-json", "/proc/angelps-x/summary.json"))
    _refused_up_front(work, rc, err, f"--summary-json /proc/angelps-x/summary.json: {PROC}")


def test_a_summary_json_under_a_file_is_refused_before_training(work: Path) -> None:
    rc, err = _train(work, extra=("--summary-json", "afile/summary.json"))
    _refused_up_front(
        work, rc, err, "--summary-json afile/summary.json: afile is a file, not a directory"
    )


def _predict(work: Path, *args: str) -> tuple[int, str]:
    """``angelps predict`` of the a9a file with a model folder (its content is read only after
    the paths are checked)."""
    (work / "m").mkdir(exist_ok=True)
    return _angelps(work, "predict", "--model", str(work / "m"), "--input", DATA, *args)


@pytest.mark.parametrize(
    "args",
    [
        ("--out", "/proc/angelps-pred.csv"),
        ("--set", "angel.predict.out.path=/proc/angelps-pred.csv"),
    ],
    ids=["--out", "key"],
)
def test_a_prediction_output_under_proc_is_refused_before_predicting(
    work: Path, args: tuple[str, ...]
) -> None:
    """It failed after the predictions were made (about 9 s), naming a temporary file. The
    option typed is named: ``--out``, or the key set on the command line."""
    rc, err = _predict(work, *args)
    (work / "m").rmdir()
    where = "--out" if args[0] == "--out" else "command line"
    _refused_up_front(
        work, rc, err, f"angel.predict.out.path=/proc/angelps-pred.csv ({where}): {PROC}"
    )


def test_a_prediction_output_under_a_file_says_it_is_a_file(work: Path) -> None:
    rc, err = _predict(work, "--out", str(work / "afile" / "pred.csv"))
    (work / "m").rmdir()
    _refused_up_front(
        work,
        rc,
        err,
        f"angel.predict.out.path={work / 'afile' / 'pred.csv'} (--out): "
        f"{work / 'afile'} is a file, not a directory",
    )
