"""Fault matrix: small things a careful operator meets, each refused or shown safely before Ray.

- a save path inside a folder the job writes itself (``<log>/ps-backup``,
  ``angel.ps.backup.path``, ``<log>/latest``): refused by the pre-flight, exit 2;
- a step size finite as a double but infinite in the tables' float32 (``ml.learn.rate=1e39``):
  refused naming the key, exit 2;
- a key given twice in a .properties file: an error naming both lines, exit 2;
- ``angelps conf`` printing a value with control characters: escaped, one line per key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from learners.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")


def _train(tmp_path: Path, **sets: object) -> list[str]:
    data = tmp_path / "d.libsvm"
    data.write_text("1 1:1\n0 2:1\n")
    base = {"angel.train.data.path": data, "angel.log.path": tmp_path / "log"}
    return ["train", "--conf", CONF, *(f"--set={k}={v}" for k, v in {**base, **sets}.items())]


@pytest.mark.parametrize(
    ("save", "what"),
    [
        ("log/ps-backup", "is the shard backups' folder (angel.log.path/ps-backup)"),
        ("log/ps-backup/m", "is inside the shard backups' folder (angel.log.path/ps-backup)"),
        ("log/latest", "is the latest run's pointer (latest)"),
        ("bk/m", "is inside the shard backups' folder (angel.ps.backup.path={bk})"),
    ],
)
def test_a_save_path_in_the_job_s_own_folders_is_refused(tmp_path, capsys, save, what):
    bk = tmp_path / "bk"
    args = _train(tmp_path, **{"angel.save.model.path": tmp_path / save})
    if save.startswith("bk"):
        args.append(f"--set=angel.ps.backup.path={bk}")
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"angelps: error: angel.save.model.path={tmp_path / save} (command line) "
        f"{what.format(bk=bk)}, which the job writes and removes by itself: choose a directory "
        "of its own\n"
    )
    assert not (tmp_path / "log").exists()  # refused before anything is written


@pytest.mark.parametrize("key", ["ml.learn.rate", "ml.opt.decay.max.lr", "ml.opt.decay.0.eta.min"])
def test_a_step_size_infinite_in_float32_is_refused(tmp_path, capsys, key):
    sets = {key: "1e39"}
    if key != "ml.learn.rate":
        sets["ml.opt.decay.class.name"] = "CyclicLR"
    if ".0." in key:
        sets.update({
            "ml.opt.decay.class.name": "SequentialLR",
            "ml.opt.decay.schedulers": "CosineAnnealingLR",
        })  # fmt: skip
    assert main(_train(tmp_path, **sets)) == 2
    assert capsys.readouterr().err == (
        f"angelps: error: {key}=1e+39 (command line) is infinite in float32 (the dtype of the "
        "parameter tables, largest 3.402823e+38): expected a step size that it holds\n"
    )


def test_a_key_given_twice_in_a_file_is_an_error_naming_both_lines(tmp_path, capsys):
    job = tmp_path / "job.properties"
    job.write_text("ml.epoch.num=5\n# a comment\nml.learn.rate=0.1\nml.epoch.num=6\n")
    assert main(["conf", "--conf", str(job)]) == 2
    assert capsys.readouterr().err == (
        f"angelps: error: {job}:4: ml.epoch.num is given twice in this file (first at line 1): "
        "keep one (--set on the command line overrides a file)\n"
    )


def test_conf_prints_control_characters_escaped(tmp_path, capsys):
    job = tmp_path / "job.properties"
    # An escape sequence (clear screen), a carriage return and a newline inside one value.
    job.write_text("angel.job.name=a\\u001b[2Jb\\rc\\nd\n")
    assert main(["conf", "--conf", str(job)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("angel.job.name")]
    assert "a\\x1b[2Jb\\rc\\nd" in line and f"# {job}:1" in line
    assert "\x1b" not in out and "\r" not in out
