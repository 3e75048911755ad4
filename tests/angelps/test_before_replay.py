"""Calls that reach a shard Ray restarted from its backup before its workers replayed the
pushes since (on a real local Ray).

A checkpoint asked for then: before, the save wrote the backup's rows (a checkpoint silently
missing those pushes); now the saving client replays its pushes first (PSClient.catch_up), and
a shard still waiting for another worker's refuses to save (NotReplayed) until that worker
catches up. A save whose shard dies after the client caught up is made again once it caught
up again; a load waits for a shard Ray is restarting. A read by the launching client (at
clock 0, behind every worker): before, it made the shard forget that worker 0 had pushes to
replay, so that worker's next push waited for them until it timed out; now it is served and
the worker replays at its next step."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.server.shard import NotReplayed
from tests.angelps.test_recovery import X, _data, _launch, _train, kill_shard


def _pulled(path: str, keys: np.ndarray, tmp: str) -> dict[str, np.ndarray]:
    """The rows of ``keys`` (and the bias) in the checkpoint at ``path``, through a fresh PS."""
    c = _launch("reload", tmp)
    try:
        c.load(path)
        return c.pull_many({"w": keys, "b": np.array([0])})
    finally:
        c.shutdown()


def _uninterrupted(job: str, tmp_path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The keys of :func:`_train`'s data and its rows at the end of a run never interrupted."""
    c = _launch(job, tmp_path / "ref")
    try:
        return np.unique(_data()[0]), _train(c)[0]
    finally:
        c.shutdown()


def test_a_save_right_after_a_shard_restart_holds_every_push(ray_local, tmp_path, capsys):
    keys, ref = _uninterrupted("saveref", tmp_path)
    job = "saverestart"
    # Inline backups every 5 updates: the last at clock 20 of the 24 pushes.
    c = _launch(job, tmp_path / "backups", interval=5, background=False)
    try:
        _train(c)  # (its last call, a pull, answered: nothing is in flight)
        capsys.readouterr()
        kill_shard(job, 1, c.stats()[1]["pid"])
        c.save(str(tmp_path / "ckpt"))
        assert [s["restarted"] for s in c.stats()] == [False, True]
    finally:
        c.shutdown()
    err = capsys.readouterr().err
    assert re.search(
        r"parameter shard 1 died; Ray restarted it and it restored its backup at clock 20 of "
        r"worker 0, which replayed 4 push\(es\) since",
        err,
    ), err
    got = _pulled(str(tmp_path / "ckpt"), keys, str(tmp_path / "reload"))
    np.testing.assert_array_equal(got["w"], ref["w"])
    np.testing.assert_array_equal(got["b"], ref["b"])


def _launch_x(
    job: str, backups: Path, more: dict[str, Any] | None = None, num_workers: int = 1
) -> PSClient:
    """Two shards of table X, inline backups every 3 updates under ``backups``."""
    conf = {
        "angel.job.name": job,
        "angel.ps.number": 2,
        "angel.ps.backup.interval": 3,
        "angel.ps.backup.async": False,
        "angel.ps.backup.path": str(backups),
        **(more or {}),
    }
    return PSClient.launch([X], PSOptions.from_config(conf), num_workers=num_workers)


def test_a_restarted_shard_refuses_to_save_until_every_worker_caught_up(ray_local, tmp_path):
    job = "saverestart2"
    c = _launch_x(job, tmp_path / "backups", num_workers=2)
    ckpt = tmp_path / "ckpt"
    try:
        ws = [c.for_worker(0), c.for_worker(1)]
        keys = np.arange(4)
        for _ in range(8):  # BSP: each update is both workers' -1, so +2 a row with sgd at 1.0
            for w in ws:
                w.push_many({"x": (keys, -np.ones((4, 1)))}, 1.0)
        for w in ws:
            w.flush()
        kill_shard(
            job, 1, c.stats()[1]["pid"]
        )  # (its backup at clock 6: the pushes of clocks 6 and 7 are lost)
        with pytest.raises(
            NotReplayed,
            match=r"^parameter shard 1 was restarted and restored its backup \(worker 1 at "
            r"clock 6\); those workers have not replayed their pushes since, so a checkpoint "
            r"now would lack them and none is written: each worker's client replays them at "
            r"its next step or PSClient.catch_up\(\), then save again$",
        ):
            ws[0].save(str(ckpt))  # (worker 0 replays its own first)
        assert not ckpt.exists()
        assert sorted(os.listdir(tmp_path)) == ["backups"]  # (no temporary left)
        assert ws[1].catch_up() == 2
        assert ws[1].catch_up() == 0  # (nothing more)
        ws[0].save(str(ckpt))
        for w in ws:
            w.shutdown()
    finally:
        c.shutdown()
    back = PSClient.launch([X], PSOptions.from_config({"angel.job.name": "saverestart3"}))
    try:
        back.load(str(ckpt))
        np.testing.assert_array_equal(back.pull("x", np.arange(4))[:, 0], [16.0] * 4)
    finally:
        back.shutdown()


@pytest.mark.parametrize("pushes", [8, 2])
def test_a_read_by_the_launching_client_leaves_the_worker_to_replay(ray_local, tmp_path, pushes):
    """(2 pushes: the shard comes back at its first backup, worker 0 at clock 0, the clock of
    the launching client's read.)"""
    job = f"drvread{pushes}"
    c = _launch_x(job, tmp_path, {"angel.matrixtransfer.request.timeout.ms": 20000})
    try:
        w, keys = c.for_worker(0), np.arange(4)
        for _ in range(pushes):  # sgd at 1.0: +1 a row a push
            w.push_many({"x": (keys, -np.ones((4, 1)))}, 1.0)
        w.flush()
        kill_shard(job, 1, c.stats()[1]["pid"], back=True)  # (back at its last backup)
        held = pushes // 3 * 3  # (backups every 3 pushes, and at clock 0)
        # The launching client at clock 0 reads what the shards hold now (shard 1: its backup)
        np.testing.assert_array_equal(c.pull("x", keys)[:, 0], [pushes] * 2 + [held] * 2)
        r = w.push_pull({"x": (keys, -np.ones((4, 1)))}, 1.0, {"x": keys})
        np.testing.assert_array_equal(r["x"][:, 0], [pushes + 1.0] * 4)
        w.shutdown()
    finally:
        c.shutdown()


def test_a_shard_killed_after_the_client_caught_up_is_caught_up_again_and_saved(
    ray_local, tmp_path, monkeypatch
):
    """The shard dies between the catch-up and the save's own calls: those fail before
    anything is committed, the client catches up again (replaying what the restarted shard
    lacks) and saves once more; the checkpoint holds every push."""
    keys, ref = _uninterrupted("saveref2", tmp_path)
    job, real, calls = "saveagain", PSClient.catch_up, []

    def catch_up(self: PSClient) -> int:
        out = real(self)
        calls.append(out)
        if len(calls) == 1:
            kill_shard(job, 1, self.stats()[1]["pid"])
        return out

    monkeypatch.setattr(PSClient, "catch_up", catch_up)
    c = _launch(job, tmp_path / "backups", interval=5, background=False)
    try:
        _train(c)
        c.save(str(tmp_path / "ckpt"))
    finally:
        c.shutdown()
    assert calls == [0, 4]  # (nothing to replay, then the 4 pushes since the backup at 20)
    got = _pulled(str(tmp_path / "ckpt"), keys, str(tmp_path / "reload"))
    np.testing.assert_array_equal(got["w"], ref["w"])
    np.testing.assert_array_equal(got["b"], ref["b"])


def test_a_load_waits_for_a_shard_ray_is_restarting(ray_local, tmp_path):
    job = "loadrestart"
    c = _launch_x(job, tmp_path / "backups")
    try:
        w, keys = c.for_worker(0), np.arange(4)
        for _ in range(5):
            w.push_many({"x": (keys, -np.ones((4, 1)))}, 1.0)
        w.flush()
        c.save(str(tmp_path / "ckpt"))  # (by the launching client: x = 5)
        for _ in range(2):
            w.push_many({"x": (keys, -np.ones((4, 1)))}, 1.0)
        w.flush()
        w.shutdown()
        kill_shard(job, 1, c.stats()[1]["pid"])  # (not waited for: the load meets it restarting)
        c.load(str(tmp_path / "ckpt"))
        np.testing.assert_array_equal(c.pull("x", keys)[:, 0], [5.0] * 4)
    finally:
        c.shutdown()
