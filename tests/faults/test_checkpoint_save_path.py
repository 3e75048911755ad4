"""Fault matrix: a save path that a checkpoint would destroy is refused before Ray starts.

``angel.save.model.path`` naming a directory of user files, the current directory, the log
directory (or one that contains it), or a regular file: `angelps train` exits 2 with one line
naming the key, the path and why, Ray is never started, and every file is still there, byte for
byte.
"""

from __future__ import annotations

import os
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
    """(Root may write anywhere: the permission answer is simulated.)"""
    monkeypatch.setattr(
        os, "access", lambda p, mode: os.path.realpath(p) != os.path.realpath(user_files)
    )
    assert _train("new/model", "logs") == 2
    assert capsys.readouterr().err == (
        f"angelps: error: angel.save.model.path=new/model (command line): {user_files} "
        "is not writable\n"
    )
