"""Fault matrix: one writer per save path.

On a real local Ray: ``angelps train`` in its own process (with its own private Ray) is parked
inside its first save, holding ``model.lock``; a second job with the same
``angel.save.model.path`` is refused before it starts anything, exit 2, one line naming the
holder (job, pid, host). The first job is then SIGKILLed with its process group: its lock is
stale (its pid is gone) and the next job takes it over, says so, trains and removes it. A lock
naming a reused pid is stale too; on object storage (moto's S3) the lock object works the same,
and of contenders that take it at the same moment one holds it and the others are refused.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from angelconf.config import ConfigError
from angelps import fs
from angelps.checkpoint import remote_lock
from learners.cli.main import main
from learners.job.save_lock import SaveLock
from tests.child_env import python_path
from tests.object_store import make_bucket, s3_server

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf" / "lr_a9a.properties")

# `angelps train` parked in its first save: writes its pid to MARKER, then sleeps until killed.
_PARKED = r"""
import os, sys, time
from angelps.checkpoint import files as checkpoint
from learners.cli.main import main

marker = sys.argv[1]

def write_manifest(root, manifest, real=checkpoint.write_manifest):
    if ".tmp-" in os.path.basename(root):
        with open(marker + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.rename(marker + ".part", marker)
        time.sleep(3600)
    return real(root, manifest)

checkpoint.write_manifest = write_manifest
sys.exit(main(sys.argv[2:]))
"""


def _args(d: Path, job: str) -> list[str]:
    data = d / "a9a.libsvm"
    if not data.exists():
        with open(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm") as f:
            data.write_text("".join(next(f) for _ in range(1000)))
    sets = {
        "angel.train.data.path": data,
        "angel.save.model.path": d / "model",
        "angel.log.path": d / job,
        "angel.job.name": job,
        "ml.epoch.num": 1,
    }
    return ["train", "--conf", CONF, *(f"--set={k}={v}" for k, v in sets.items())]


def _wait(marker: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the first job never reached its save"
        time.sleep(0.2)
    return int(marker.read_text())


@pytest.mark.usefixtures("ray_local")
def test_a_second_job_on_the_same_save_path_is_refused(tmp_path, capsys):
    marker = tmp_path / "parked"
    env = {**os.environ, "PYTHONPATH": python_path(ROOT)}
    first = subprocess.Popen(
        [sys.executable, "-c", _PARKED, str(marker), *_args(tmp_path, "first")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its private Ray in its group: one kill ends the job
    )
    try:
        pid = _wait(marker, first)
        lock = tmp_path / "model.lock"
        holder = json.loads(lock.read_text())
        assert (holder["job"], holder["pid"], holder["host"]) == (
            "first",
            pid,
            socket.gethostname(),
        )
        assert main(_args(tmp_path, "second")) == 2
        err = capsys.readouterr().err
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        assert err == (
            f"angelps: error: angel.save.model.path={tmp_path / 'model'} (command line) is in "
            f"use by job 'first' (pid {pid} on {socket.gethostname()}, since {since}): one job "
            "writes a save path at a time; wait for it to end or choose another path (if that "
            f"job is gone, remove {lock})\n"
        )
        assert not (tmp_path / "second").exists()  # refused before its run folder
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    # The killed job's lock is stale: the next job takes it over, says so, and removes it.
    assert lock.exists()
    assert main(_args(tmp_path, "third")) == 0
    err = capsys.readouterr().err
    assert (
        f"angelps: note: removing the stale lock {lock} of job 'first' (pid {pid} on "
        f"{socket.gethostname()}, since {since}), which is no longer running\n"
    ) in err
    assert not lock.exists()
    assert (tmp_path / "model" / "manifest.json").exists()


def test_a_lock_of_a_reused_pid_or_another_host(tmp_path, capsys):
    save = str(tmp_path / "model")
    lock = tmp_path / "model.lock"
    # This very pid, but another process start: the holder is gone (its pid was reused).
    lock.write_text(
        json.dumps({"job": "old", "host": socket.gethostname(), "pid": os.getpid(),
                    "pid_start": "1", "since": 0})
    )  # fmt: skip
    with SaveLock(save, "new"):
        assert json.loads(lock.read_text())["job"] == "new"
    assert not lock.exists()
    assert "removing the stale lock" in capsys.readouterr().err
    # Another host's lock cannot be checked from here: it is respected.
    lock.write_text(json.dumps({"job": "far", "host": "elsewhere", "pid": 1, "since": 0}))
    with pytest.raises(ConfigError, match=r"in use by job 'far' \(pid 1 on elsewhere, since "):
        SaveLock(save, "new").acquire()
    assert json.loads(lock.read_text())["job"] == "far"


@pytest.fixture
def bucket() -> Iterator[str]:
    with s3_server() as env, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        make_bucket(env, "locks")
        yield "s3://locks"


def test_the_lock_on_object_storage(bucket):
    save = f"{bucket}/runs/model"
    with SaveLock(save, "one"):
        with pytest.raises(
            ConfigError, match=f"^angel.save.model.path={save} is in use by job 'one'"
        ):
            SaveLock(save, "two").acquire()
    with SaveLock(save, "two") as lock:  # released: the next job takes it
        assert lock.held


def test_a_lock_file_s_content_is_shown_escaped(tmp_path, capsys):
    lock = tmp_path / "model.lock"
    holder = {"job": "x\x1b[2Jy", "host": socket.gethostname(), "pid": 0, "since": 0}
    lock.write_text(json.dumps(holder))
    with SaveLock(str(tmp_path / "model"), "new"):
        pass
    err = capsys.readouterr().err
    assert "job 'x\\x1b[2Jy'" in err and "\x1b" not in err
    holder["host"] = "far\rhost"
    lock.write_text(json.dumps(holder))
    with pytest.raises(ConfigError) as e:
        SaveLock(str(tmp_path / "model"), "new").acquire()
    assert "on far\\rhost" in str(e.value) and "\r" not in str(e.value)


def _contend(save: str, jobs: list[str], race: Any = None) -> dict[str, Any]:
    """Each of ``jobs`` takes the lock of ``save`` in a thread of its own (all at once): job ->
    its held SaveLock, or the ConfigError that refused it."""
    out: dict[str, Any] = {}
    start = threading.Barrier(len(jobs))

    def take(job: str) -> None:
        start.wait()
        if race is not None:
            race(job)
        lock = SaveLock(save, job)
        try:
            lock.acquire()
            out[job] = lock
        except ConfigError as e:
            out[job] = e

    threads = [threading.Thread(target=take, args=(j,), name=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_two_jobs_taking_the_object_storage_lock_in_the_same_round_trip(bucket, monkeypatch):
    """Job 'late' checks that no lock is there, then stalls until job 'early' has taken it:
    without a conditional put, its plain write would replace early's lock and both would
    hold it. Its claim then finds early's lock, and it is refused."""
    save = f"{bucket}/race/model"
    real_exists, checked, early_done = fs.exists, threading.Event(), threading.Event()

    def exists(path: str) -> bool:
        found = real_exists(path)
        if threading.current_thread().name == "late" and not checked.is_set():
            checked.set()  # late saw no lock ...
            assert early_done.wait(60)  # ... and goes on once early holds it
        return found

    def race(job: str) -> None:
        if job == "early":
            assert checked.wait(60)

    monkeypatch.setattr(fs, "exists", exists)
    real_acquire = SaveLock.acquire

    def acquire(self: SaveLock) -> None:
        try:
            real_acquire(self)
        finally:
            if self.me["job"] == "early":
                early_done.set()

    monkeypatch.setattr(SaveLock, "acquire", acquire)
    out = _contend(save, ["early", "late"], race)
    assert isinstance(out["early"], SaveLock) and out["early"].held
    assert isinstance(out["late"], ConfigError), out
    assert f"angel.save.model.path={save} is in use by job 'early'" in str(out["late"])
    assert json.loads(fs.read_bytes(f"{save}.lock"))["job"] == "early"
    out["early"].release()
    assert not fs.exists(f"{save}.lock")
    assert remote_lock.claims(f"{save}.lock") == {}  # every claim withdrawn


def test_many_jobs_taking_the_object_storage_lock_at_once(bucket):
    save = f"{bucket}/many/model"
    jobs = [f"job{i}" for i in range(6)]
    out = _contend(save, jobs)
    held = [j for j in jobs if isinstance(out[j], SaveLock)]
    assert len(held) == 1, out
    for j in jobs:
        if j not in held:
            assert f"is in use by job '{held[0]}'" in str(out[j]), out[j]
    assert json.loads(fs.read_bytes(f"{save}.lock"))["job"] == held[0]
    assert remote_lock.claims(f"{save}.lock") == {}
    out[held[0]].release()


def test_a_claim_left_by_a_crashed_contender_is_ignored_once_stale(bucket, monkeypatch):
    save = f"{bucket}/stale/model"
    fs.write_bytes(f"{save}.lock.claim-leftover", b"")
    time.sleep(1.1)  # the store's clock counts seconds
    monkeypatch.setattr(remote_lock, "STALE_S", 0.5)
    with SaveLock(save, "next") as lock:
        assert lock.held
    assert remote_lock.claims(f"{save}.lock") == {}


def test_two_jobs_finding_the_same_stale_lock(tmp_path, monkeypatch, capsys):
    """Both find a stale lock; 'early' removes it and takes the lock while 'late' is between
    reading the stale lock and removing it. Late must not remove early's lock (it did: both
    then held it): it is refused."""
    save, lock = str(tmp_path / "model"), tmp_path / "model.lock"
    stale = {"job": "old", "host": socket.gethostname(), "pid": os.getpid(), "pid_start": "1"}
    lock.write_text(json.dumps({**stale, "since": 0}))
    real_holder, read, early_done = SaveLock._holder, threading.Event(), threading.Event()

    def holder(self: SaveLock, path: str | None = None) -> dict[str, Any]:
        found = real_holder(self, path) if path else real_holder(self)
        if self.me["job"] == "late" and not read.is_set():
            read.set()  # late has read the stale lock ...
            assert early_done.wait(60)  # ... and removes it once early holds the path
        return found

    real_acquire = SaveLock.acquire

    def acquire(self: SaveLock) -> None:
        try:
            real_acquire(self)
        finally:
            if self.me["job"] == "early":
                early_done.set()

    def race(job: str) -> None:
        if job == "early":
            assert read.wait(60)

    monkeypatch.setattr(SaveLock, "_holder", holder)
    monkeypatch.setattr(SaveLock, "acquire", acquire)
    out = _contend(save, ["early", "late"], race)
    assert isinstance(out["early"], SaveLock) and out["early"].held
    assert isinstance(out["late"], ConfigError), out
    assert "is in use by job 'early'" in str(out["late"])
    assert json.loads(lock.read_text())["job"] == "early"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.lock"]  # nothing set aside
    out["early"].release()
    assert not lock.exists()
