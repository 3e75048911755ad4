"""Fault matrix: control characters in every message.

A value a user or an input file supplies (a key name, a value, a data line, a file name, an
address, a model or decay name, an output path, a run name) is quoted by the one-line error
it causes; each such value here holds an escape sequence, a carriage return, a newline, BEL
and, where the entry point can carry one, NUL. Through the real CLI (``python -m angelps``, a
process of its own), every one exits 2 with one ``angelps: error:`` line that quotes the value
escaped (as ``repr`` writes it), and no raw control character reaches stdout or stderr. The
console lines of a job that runs (the banner, notes, warnings) escape them too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from angelconf.printable import printable, printable_lines, uncoloured
from learners.cli.main import main
from learners.runs.retention import Checkpoints
from learners.runs.run_log import RunLog
from tests.child_env import python_path

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")
DATA = str(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm")

#: What an argument can carry (argv cannot hold NUL) ...
V = "\x1b[31mred\x1b[0m\r\n\x07"
#: ... and what a file can.
VF = "\x1b[2J\x00\x07\x1b]0;title\x07"
_RAW = ("\x1b", "\r", "\x00", "\x07")


def _key_in_file(d: Path) -> list[str]:
    f = d / "job.properties"
    f.write_bytes(f"ml.epoch{VF}.num = 3\n".encode())
    return ["conf", "--conf", str(f)]


def _value_in_file(d: Path) -> list[str]:
    f = d / "job.properties"
    # \r and \n as .properties escapes: they reach the value itself.
    f.write_bytes(f"ml.epoch.num = 3{VF}\\r\\n4\n".encode())
    return ["train", "--conf", str(f)]


def _data_line(d: Path) -> list[str]:
    f = d / "bad.libsvm"
    f.write_bytes(b"1 3:1 11:1\n-1 5:1 7:1\n" * 20 + f"1 3:1 {VF}\n".encode())
    sets = {
        "angel.train.data.path": f,
        "angel.save.model": "false",
        "angel.log.path": d / "log",
        "ml.epoch.num": 1,
    }
    return ["train", "--conf", CONF, *(f"--set={k}={v}" for k, v in sets.items())]


def _train(d: Path, *more: str) -> list[str]:
    """``angelps train`` of conf/lr_a9a.properties with every path in ``d``, then ``more``."""
    sets = {
        "angel.train.data.path": DATA,
        "angel.save.model.path": d / "model",
        "angel.log.path": d / "log",
    }
    return ["train", "--conf", CONF, *(f"--set={k}={v}" for k, v in sets.items()), *more]


def _empty_model(d: Path) -> str:
    (d / "model").mkdir(exist_ok=True)
    return str(d / "model")


# (name, the arguments in folder d, a part of the value as the error line quotes it)
CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("key in a .properties file", _key_in_file, "ml.epoch\\x1b[2J\\x00\\x07"),
    ("value in a .properties file", _value_in_file, "3\\x1b[2J\\x00\\x07\\x1b]0;title\\x07\\r\\n4"),
    (
        "key of --set",
        lambda d: ["conf", "--conf", CONF, "--set", f"ml.epoch{V}=3"],
        "ml.epoch\\x1b",
    ),
    (
        "value of --set",
        lambda d: _train(d, "--set", f"ml.learn.rate=0.1{V}"),
        "0.1\\x1b[31mred\\x1b[0m",
    ),
    ("value of --KEY", lambda d: _train(d, "--ml.epoch.num", f"2{V}"), "2\\x1b"),
    ("unknown option", lambda d: _train(d, f"--ml.epoch{V}", "2"), "\\r\\n\\x07"),
    ("data line", _data_line, "\\x1b[2J\\x00\\x07"),
    ("configuration file", lambda d: ["conf", "--conf", str(d / f"job{V}.properties")], "\\r\\n"),
    (
        "data path",
        lambda d: _train(d, "--set", f"angel.train.data.path={d}/no{V}.libsvm"),
        "no\\x1b[31mred\\x1b[0m\\r\\n\\x07.libsvm",
    ),
    (
        "--address",
        lambda d: _train(d, "--set=angel.ray.connect.timeout.s=2", "--address", f"ray://x{V}:1"),
        "x\\x1b[31mred\\x1b[0m\\r\\n\\x07:1",
    ),
    (
        "model name",
        lambda d: _train(d, "--set", f"ml.model.class.name=Logistic{V}"),
        "Logistic\\x1b[31m",
    ),
    (
        "decay name",
        lambda d: ["schedule", "--set", f"ml.opt.decay.class.name=Cos{V}", "--steps", "3"],
        "Cos\\x1b[31m",
    ),
    ("--steps", lambda d: ["schedule", "--steps", f"3{V}"], "3\\x1b[31m"),
    (
        "model path of predict",
        lambda d: [
            "predict",
            "--conf",
            CONF,
            "--model",
            f"{d}/m{V}",
            "--input",
            DATA,
            "--out",
            f"{d}/p.csv",
        ],
        "m\\x1b[31mred",
    ),
    (
        "output path of predict",
        lambda d: [
            "predict",
            "--conf",
            CONF,
            "--model",
            _empty_model(d),
            "--input",
            DATA,
            "--out",
            f"{d}/out{V}/p.csv",
        ],
        "out\\x1b[31mred\\x1b[0m\\r\\n\\x07",
    ),
    (
        "model path of export",
        lambda d: ["export", "--model", f"{d}/m{V}", "--out", f"{d}/w.safetensors"],
        "m\\x1b[31mred",
    ),
    ("run name of plot", lambda d: ["plot", f"run{V}"], "run\\x1b[31mred\\x1b[0m\\r\\n\\x07"),
    ("log folder of plot", lambda d: ["plot", "--log-dir", f"{d}/log{V}"], "log\\x1b[31m"),
    ("verb", lambda d: [f"tr{V}ain"], "tr\\x1b[31m"),
]


@pytest.mark.parametrize(("args", "quoted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_control_character_in_a_user_value_is_escaped(
    tmp_path: Path, args: Callable[[Path], list[str]], quoted: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=python_path(ROOT), ANGELPS_DEBUG="")
    proc = subprocess.run(
        [sys.executable, "-m", "angelps", *args(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=240,
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 2, err
    for c in _RAW:
        assert c not in out and c not in err, (repr(c), err)
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1, err
    assert quoted in errors[0], err
    assert "Traceback" not in err


def test_the_console_lines_of_a_job_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """The banner and done lines (stdout), warnings, and a failed save's warning (stderr)."""
    log = RunLog(None, tty=False)
    log.say(f"saving to /runs/m{V}\nrun /runs/r{VF}")
    log.warn(f"angelps: warning: cannot copy the run to s3://b/{V}")
    Checkpoints("/nowhere", 1, False, "warn").warn(f"angelps: warning: {VF}")
    out, err = capsys.readouterr()
    assert out == (
        "saving to /runs/m\\x1b[31mred\\x1b[0m\\r\n"  # the \n ends a line of the block
        "\\x07\nrun /runs/r\\x1b[2J\\x00\\x07\\x1b]0;title\\x07\n"
    )
    assert err == (
        "angelps: warning: cannot copy the run to s3://b/\\x1b[31mred\\x1b[0m\\r\\n\\x07\n"
        "angelps: warning: \\x1b[2J\\x00\\x07\\x1b]0;title\\x07\n"
    )


def test_printable() -> None:
    assert printable("a\x1b[31mb\r\n\x00\tc") == "a\\x1b[31mb\\r\\n\\x00\\tc"
    assert printable("plain text, ünïcode") == "plain text, ünïcode"
    assert printable_lines("a\x1b\nb\r") == "a\\x1b\nb\\r"


def test_uncoloured() -> None:
    assert (
        uncoloured("\x1b[36mray::A.f()\x1b[39m (pid=1)\x1b[1;31m!\x1b[0m") == "ray::A.f() (pid=1)!"
    )
    assert uncoloured("\x1b[2J stays for printable") == "\x1b[2J stays for printable"


def test_a_python_warning_is_written_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warning quoting a Ray error (the socket transport's fallback) or a value: the
    command line writes it (warnings.formatwarning) uncoloured, control characters escaped."""
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after
    assert main(["schedule", "--steps", "1"]) == 0
    text = warnings.formatwarning(
        f"angelps: no direct connection (\x1b[36mray::S.f()\x1b[39m{VF})", RuntimeWarning, "t.py", 7
    )
    assert text == (
        "angelps: warning: no direct connection (ray::S.f()\\x1b[2J\\x00\\x07\\x1b]0;title\\x07)\n"
    )
    monkeypatch.setenv("ANGELPS_DEBUG", "1")  # Python's own form, where the code warned
    text = warnings.formatwarning("angelps: no direct connection", RuntimeWarning, "t.py", 7)
    assert text == "t.py:7: RuntimeWarning: angelps: no direct connection\n"
