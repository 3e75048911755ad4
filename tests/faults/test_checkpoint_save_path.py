"""Fault matrix: a save path that a checkpoint would destroy is refused before Ray starts.

``angel.save.model.path`` naming a directory of user files, the current directory, the log
directory (or one that contains it), or a regular file: `angelps train` exits 2 with one line
naming the key, the path and why, Ray is never started, and every file is still there, byte for
byte.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import ray

from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")
DATA = str(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm")


def _tree(root: Path) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(d, f), root): Path(d, f).read_bytes()
        for d, _, fs in os.walk(root)
        for f in fs
    }


def _train(save: str, log: str, *extra: str) -> int:
    args = ["train", "--conf", CONF, "--set", f"angel.train.data.path={DATA}"]
    for s in (f"angel.save.model.path={save}", f"angel.log.path={log}", *extra):
        args += ["--set", s]
    return main(args)


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """A working directory full of user files, a log directory with metrics; Ray forbidden."""

    def no_ray(*a, **k):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray, "init", no_ray)
    work = tmp_path / "work"
    (work / "docs").mkdir(parents=True)
    (work / "notes.txt").write_text("do not lose me\n")
    (work / "docs" / "paper.bin").write_bytes(bytes(range(256)))
    (work / "logs").mkdir()
    (work / "logs" / "metrics.jsonl").write_text('{"kind": "epoch", "epoch": 0}\n')
    (work / "report.csv").write_text("a,b\n1,2\n")
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize(
    ("save", "log", "why"),
    [
        (
            "docs",
            "logs",
            ": {p} is a non-empty directory without an angelps checkpoint (manifest.json): "
            "angelps will not replace it (choose a new or empty directory)",
        ),
        (
            ".",
            "logs",
            " is the current directory: a checkpoint replaces its directory; "
            "choose a directory of its own",
        ),
        (
            "logs",
            "logs",
            " is the log directory (angel.log.path=logs): a checkpoint replaces its directory; "
            "choose a directory of its own",
        ),
        (
            "..",
            "{work}/logs",
            " contains the current directory: a checkpoint replaces its directory; "
            "choose a directory of its own",
        ),
        (
            "report.csv",
            "logs",
            ": {p} is a file, not a checkpoint directory: angelps will not replace it "
            "(remove it or choose another path)",
        ),
        (
            "report.csv/model",
            "logs",
            ": {work}/report.csv is a file, so the directory cannot be created",
        ),
    ],
    ids=["user-dir", "cwd", "log-dir", "contains-cwd", "file", "file-as-parent"],
)
def test_bad_save_path_exits_2_before_ray_and_keeps_every_file(user_files, capsys, save, log, why):
    work = user_files
    save, log = save.format(work=work), log.format(work=work)
    before = _tree(work.parent)
    assert _train(save, log) == 2
    err = capsys.readouterr().err
    p = os.path.realpath(save)
    assert (
        err
        == f"angelps: error: angel.save.model.path={save} (command line)"
        + why.format(p=p, work=work)
        + "\n"
    )
    assert _tree(work.parent) == before  # nothing deleted, renamed or written


def test_a_log_dir_inside_the_save_path_is_refused(user_files, capsys):
    assert _train("out", "out/logs") == 2
    assert (
        "angel.save.model.path=out (command line) contains the log directory (angel.log.path=out/logs)"
        in capsys.readouterr().err
    )
    assert not (user_files / "out").exists()


def test_summary_json_naming_a_directory_exits_2_before_training(user_files, capsys):
    code = main(["train", "--conf", CONF, "--summary-json", "docs"])
    assert code == 2
    assert capsys.readouterr().err == (
        "angelps: error: --summary-json docs is a directory: expected a file name\n"
    )
    code = main(["train", "--conf", CONF, "--summary-json", "notes.txt/s.json"])
    assert code == 2
    assert capsys.readouterr().err == (
        "angelps: error: --summary-json notes.txt/s.json: notes.txt is a file, not a directory\n"
    )


def test_an_unwritable_parent_is_refused(user_files, capsys, monkeypatch):
    """(Root may write anywhere: the refusal is simulated where the check tries the write.)"""
    mkdtemp = tempfile.mkdtemp

    def refuse(*args, dir=None, **kw):
        if dir is not None and os.path.realpath(dir) == os.path.realpath(user_files):
            raise PermissionError(13, "Permission denied")
        return mkdtemp(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert _train("new/model", "logs") == 2
    assert capsys.readouterr().err == (
        "angelps: error: angel.save.model.path=new/model (command line): cannot write there "
        f"({os.path.realpath(user_files)}: Permission denied); choose a folder you can write to\n"
    )


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("angel.save.model.path", "angel.save.model.path=/proc/angelps-model (command line)"),
        ("angel.log.path", "angel.log.path=/proc/angelps-model (command line)"),
    ],
)
def test_a_place_that_refuses_writes_even_to_root_is_refused_up_front(
    user_files, capsys, key, said
):
    """/proc refuses a new file to root too: the check tries the write (os.access said yes to
    root, and the job failed after it started, with a bare OS error)."""
    other = "angel.log.path=logs" if key != "angel.log.path" else "angel.save.model.path=model"
    assert _train("model", "logs", other, f"{key}=/proc/angelps-model") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"angelps: error: {said}: cannot write there (/proc: "), err
    assert err.endswith("); choose a folder you can write to\n"), err


def test_a_summary_json_that_cannot_be_written_is_refused_before_training(user_files, capsys):
    """It failed after the whole training, naming only the OS error."""
    assert main(["train", "--conf", CONF, "--summary-json", "/proc/x/summary.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "angelps: error: --summary-json /proc/x/summary.json: cannot write there (/proc: "
    ), err
