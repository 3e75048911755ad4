"""Recovery on a real local Ray: a shard killed in the middle of training is restarted by Ray,
restores its latest backup, the client replays the pushes made since, and the run ends exactly
where an uninterrupted run ends."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
import ray

from angelps.checkpoint.backups import read_backup
from angelps.client.channel import Channel
from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.server.launch import actor_name
from angelps.table import OptimizerSpec, TableSpec

W = TableSpec("w", rows=-1, cols=1, sparse=True, init="zeros", optimizer=OptimizerSpec("adam"))
B = TableSpec("b", rows=1, cols=1, init="zeros", optimizer=OptimizerSpec("momentum"))
STEPS = 24


def _data(seed=0, n=4000, feats=300, nnz=8):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, feats, (n, nnz)) * 7919 + 13  # sparse hashed-looking ids
    true = rng.standard_normal(feats * 7919 + 14)
    y = (true[ids].sum(1) > 0).astype(np.float64)
    return ids, y


def kill_shard(job: str, shard: int, pid: int, back: bool = False) -> None:
    """Kill ``shard`` of ``job`` (process ``pid``) by Ray, which restarts it; wait for the
    process to be gone, and with ``back`` for the new one to answer."""
    handle = ray.get_actor(actor_name(job, shard), namespace="angelps")
    ray.kill(handle, no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"shard {shard} (pid {pid}) did not die")
    while back and time.monotonic() < deadline:
        try:
            ray.get(handle.ping.remote(), timeout=5)
            return
        except ray.exceptions.RayError:
            time.sleep(0.1)


def _train(client, kill_at=None, job=None, fused=True, back=False):
    ids, y = _data()
    bs = len(y) // STEPS
    lr = 0.05
    rows = client.pull_many({"w": ids[:bs].ravel(), "b": np.array([0])})
    losses = []
    for step in range(STEPS):
        if step == kill_at:
            # Find the shard as an operator would, by name, and kill its process (waited
            # for: ray.kill returns before it is gone, and under load it went after the last
            # step, with nothing left to recover).
            kill_shard(job, 1, client.learn_pids()[1], back=back)
        x = ids[step * bs : (step + 1) * bs]
        t = y[step * bs : (step + 1) * bs]
        w = rows["w"].reshape(bs, -1)
        z = w.sum(1) + rows["b"][0, 0]
        p = 1 / (1 + np.exp(-z))
        losses.append(float(np.mean(-(t * np.log(p + 1e-12) + (1 - t) * np.log(1 - p + 1e-12)))))
        g = ((p - t) / bs)[:, None]
        upd = {
            "w": (x.ravel(), np.repeat(g, x.shape[1], axis=0)),
            "b": (np.array([0]), np.array([[g.sum()]])),
        }
        nxt = ids[((step + 1) % STEPS) * bs : ((step + 1) % STEPS + 1) * bs].ravel()
        if fused:
            rows = client.push_pull(upd, lr, {"w": nxt, "b": np.array([0])})
        else:
            client.push_many(upd, lr)
            rows = client.pull_many({"w": nxt, "b": np.array([0])})
    keys = np.unique(ids)
    return client.pull_many({"w": keys, "b": np.array([0])}), losses


def _launch(job, tmp_path, interval=5, background=True):
    return PSClient.launch(
        [W, B],
        PSOptions.from_config(
            {
                "angel.job.name": job,
                "angel.ps.number": 2,
                "angel.ps.backup.interval": interval,
                "angel.ps.backup.async": background,
                "angel.ps.backup.path": str(tmp_path),
            }
        ),
    )


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tmp_path_factory):
    c = _launch("ref", tmp_path_factory.mktemp("ref"))
    try:
        return _train(c)
    finally:
        c.shutdown()


@pytest.mark.parametrize(
    "fused, background",
    [(True, False), (True, True), pytest.param(False, True, marks=pytest.mark.slow)],
)
def test_killed_shard_recovers_and_training_is_unchanged(
    uninterrupted, tmp_path, fused, background, capsys
):
    ref, ref_losses = uninterrupted
    job = f"chaos{fused:d}{background:d}"
    c = _launch(job, tmp_path, background=background)
    try:
        got, losses = _train(c, kill_at=13, job=job, fused=fused)
        # The steps after the restart went over a connection to the new process again (before,
        # the call that met the restart gave the connection up for the rest of the job).
        assert isinstance(c.net.chans[1], Channel)
        stats = c.stats()
        assert [s["restarted"] for s in stats] == [False, True]
        # Killed after 13 pushes with a backup every 5 updates (inline): shard 1 came back at clock 10
        # and the client replayed pushes 10..12 (then training went on to 24).
        assert stats[1]["clocks"]["pushed"] == [STEPS]
        backup_dir = c.options.shard.backup_dir
        # (the process is gone before push 13: that call fails, or with a prefetch in flight
        # the one after it)
        err = capsys.readouterr().err
        m = re.fullmatch(
            r"angelps: warning: parameter shard 1 died; Ray restarted it and it restored its "
            r"backup at clock (\d+) of worker 0, which replayed (\d+) push\(es\) since; "
            r"training goes on\n",
            err,
        )
        assert m is not None, err
        if not background:
            assert (m[1], m[2]) in {("10", "4"), ("10", "5"), ("15", "0"), ("15", "1")}, err
        # (in the background a backup starts at the first update after the one before it is
        # written: its clock depends on the disk's speed, what it holds does not)
        assert read_backup(os.path.join(backup_dir, "shard-1")) is not None
    finally:
        c.shutdown()
    assert not os.path.exists(backup_dir)  # shutdown removes this launch's backups
    # Bit-identical to the run that was never interrupted: no update lost or applied twice.
    np.testing.assert_array_equal(got["w"], ref["w"])
    np.testing.assert_array_equal(got["b"], ref["b"])
    assert losses == ref_losses
    assert losses[-1] < losses[0]


def test_a_restart_whose_backup_holds_every_push_is_still_reported(uninterrupted, tmp_path, capsys):
    """Killed right after the update its inline backup was written at (clock 15) and back
    before the worker's next push: that push reaches the new process by Ray and is the one it
    expects, so nothing fails and nothing is replayed. The shard's reply says it restarted
    (before, the restart went unreported: no call failed)."""
    ref, ref_losses = uninterrupted
    job = "held"
    c = _launch(job, tmp_path, background=False)
    try:
        got, losses = _train(c, kill_at=15, job=job, back=True)
        assert [s["restarted"] for s in c.stats()] == [False, True]
        err = capsys.readouterr().err
        assert err == (
            "angelps: warning: parameter shard 1 died; Ray restarted it and it restored its "
            "backup at clock 15 of worker 0, which replayed 0 push(es) since; training goes on\n"
        )
    finally:
        c.shutdown()
    np.testing.assert_array_equal(got["w"], ref["w"])
    assert losses == ref_losses


def test_a_shard_ray_killed_for_memory_is_recovered_and_the_warning_says_so(
    uninterrupted, tmp_path, monkeypatch, capsys
):
    """Ray's memory monitor may kill a shard at a passing peak (a checkpoint's copy of its
    tables): recovered as any other death (a job at such a limit trained on to its end that
    way), but the warning names the kill and what keeps it away. The kills are Ray's worker
    table's (angelps/memory_kills.py): one is put there for this test."""
    from angelps.client import recovery
    from angelps.memory_kills import MemoryKill

    ref, ref_losses = uninterrupted
    asked: list[tuple[int, float]] = []
    kill = MemoryKill(4242, 2**30, "Memory on the node (IP: 127.0.0.1) was 22GB used")

    def kills(since: int, settle_s: float) -> list[MemoryKill]:
        asked.append((since, settle_s))
        return [kill]

    monkeypatch.setattr(recovery, "memory_kills", kills)
    job = "oom"
    c = _launch(job, tmp_path, background=False)
    try:
        got, losses = _train(c, kill_at=7, job=job)
        assert asked == [(c._log.since_ms, 0.0)]
    finally:
        c.shutdown()
    err = capsys.readouterr().err
    m = re.fullmatch(
        re.escape(
            "angelps: warning: parameter shard 1 died (Ray killed the job's process(es) pid 4242 "
            "(1.00 GiB) because the node ran low on memory; to keep it from happening again: "
            "more shard actors on more nodes, angel.ps.number, or checkpoints written without a "
            "copy of the tables, angel.save.model.async=false); Ray restarted it and it "
            "restored its backup at clock 5 of worker 0, which replayed "
        )
        + r"(\d) push\(es\) since; training goes on\n",
        err,
    )
    # (pushes 5, 6 and, with the prefetch in flight when the process went, 7)
    assert m is not None and m[1] in ("2", "3"), err
    np.testing.assert_array_equal(got["w"], ref["w"])
    assert losses == ref_losses


def test_a_shard_that_dies_again_while_a_worker_replays_is_recovered_again(
    uninterrupted, tmp_path, monkeypatch, capsys
):
    """Killed mid-training, then again once the worker has found out where it came back and
    replays (its replayed calls fail): the worker recovers it again (before: the second
    failure was raised, and the job failed although Ray restarted the shard)."""
    from angelps.client.recovery import ReplayLog

    ref, ref_losses = uninterrupted
    job, real, again = "twice", ReplayLog._restored_clock, []

    def restored_clock(self: ReplayLog, shard: int) -> int:
        start = real(self, shard)
        if not again:
            again.append(start)
            pid = ray.get(ray.get_actor(actor_name(job, shard), namespace="angelps").pid.remote())
            kill_shard(job, shard, pid)  # (its replay, next, goes to the dead process)
        return start

    monkeypatch.setattr(ReplayLog, "_restored_clock", restored_clock)
    c = _launch(job, tmp_path, background=False)
    try:
        got, losses = _train(c, kill_at=13, job=job)
        assert [s["restarted"] for s in c.stats()] == [False, True]
    finally:
        c.shutdown()
    assert len(again) == 1
    warned = re.findall(r"angelps: warning: parameter shard 1 died; .*\n", capsys.readouterr().err)
    assert len(warned) == 1, warned  # (said once: for the recovery that went through)
    np.testing.assert_array_equal(got["w"], ref["w"])
    np.testing.assert_array_equal(got["b"], ref["b"])
    assert losses == ref_losses


def test_without_backups_a_dead_shard_fails_clearly(ray_local, tmp_path):
    c = PSClient.launch(
        [W, B],
        PSOptions.from_config(
            {"angel.job.name": "nobackup", "angel.ps.number": 2, "angel.ps.backup.interval": 0}
        ),
    )
    try:
        c.push("w", np.array([1, 2, 3]), np.ones(3), 0.1)
        pid = c.stats()[0]["pid"]
        ray.kill(ray.get_actor(actor_name("nobackup", 0), namespace="angelps"))
        # ray.kill returns before the process is gone; a direct connection could still
        # reach it for a while, so wait until it is (Ray's own calls fail at once).
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        with pytest.raises(
            RuntimeError,
            match=r"parameter shard\(s\) \[0\] died and shard "
            r"backups are off",
        ):
            # keys on both shards, so the pull itself calls the dead one
            c.pull("w", np.arange(64))
    finally:
        c.shutdown()


X = TableSpec("x", rows=4, cols=1, init="zeros", optimizer=OptimizerSpec("sgd"))


@ray.remote(num_cpus=0)
class Worker:
    def run(self, client: PSClient, steps: int, kill: tuple[str, int] | None) -> list[float]:
        """Push -1 to row 0..3 each step (BSP: +2 per step with two workers); optionally kill
        shard 1 of job ``kill[0]`` after ``kill[1]`` steps. Returns the row-0 value seen at
        each clock."""
        keys = np.arange(4)
        seen = [float(client.pull("x", keys)[0, 0])]
        for step in range(steps):
            if kill is not None and step == kill[1]:
                # (waited for: under load the process died after both workers' last steps,
                # and nothing was left to replay to it)
                kill_shard(kill[0], 1, client.learn_pids()[1])
            r = client.push_pull({"x": (keys, -np.ones((4, 1)))}, 1.0, {"x": keys})
            seen.append(float(r["x"][0, 0]))
        client.flush()
        return seen


@pytest.mark.slow  # ~30 s: two worker actors and a shard restart
def test_bsp_two_workers_recover_from_a_killed_shard(ray_local, tmp_path):
    c = PSClient.launch(
        [X],
        PSOptions.from_config(
            {
                "angel.job.name": "chaos-bsp",
                "angel.ps.number": 2,
                "angel.ps.backup.interval": 3,
                "angel.ps.backup.path": str(tmp_path),
            }
        ),
        num_workers=2,
    )
    try:
        ws = [Worker.remote(), Worker.remote()]
        steps = 12
        seen = ray.get(
            [
                ws[0].run.remote(c.for_worker(0), steps, ("chaos-bsp", 7)),
                ws[1].run.remote(c.for_worker(1), steps, None),
            ]
        )
        # Every pull of both workers saw exactly the updates of all earlier steps, before and
        # after the restart: the lost updates were replayed by both workers' clients.
        for s in seen:
            assert s == [2.0 * k for k in range(steps + 1)]
        # The launching client, at clock 0, reads the current rows without waiting.
        np.testing.assert_array_equal(c.pull("x", np.arange(4))[:, 0], [2.0 * steps] * 4)
        assert [st["restarted"] for st in c.stats()] == [False, True]
    finally:
        c.shutdown()


def test_a_backup_that_fails_in_the_background_stops_the_job_with_its_reason(ray_local, tmp_path):
    """On a real Ray: a shard's backup directory turned into a file (what a lost mount or a
    clean-up by hand can do) makes its next background backup fail; the worker's next call
    gets the shard's reason, and the shard's last good backup is what a restart would use."""
    c = PSClient.launch(
        [W, B],
        PSOptions.from_config(
            {
                "angel.job.name": "badbackup",
                "angel.ps.number": 1,
                "angel.ps.backup.interval": 2,
                "angel.ps.backup.path": str(tmp_path),
            }
        ),
    )
    shard_dir = os.path.join(c.options.shard.backup_dir, "shard-0")
    try:
        keys = np.array([3, 5, 8])
        for _ in range(2):  # a backup at clock 2 (in the background)
            c.push_many({"w": (keys, np.ones((3, 1)))}, 0.1)
        c.flush()
        for _ in range(100):
            if c.stats()[0]["backup_clocks"] == [2]:
                break
            time.sleep(0.05)
        assert read_backup(shard_dir)[1]["clocks"]["pushed"] == [2]
        aside = shard_dir + ".aside"
        os.rename(shard_dir, aside)
        with open(shard_dir, "w") as f:
            f.write("not a directory")
        with pytest.raises(RuntimeError) as e:
            for _ in range(40):  # the backup at clock 4 fails; a later call says so
                c.push_many({"w": (keys, np.ones((3, 1)))}, 0.1)
                c.flush()
                time.sleep(0.02)
        msg = str(e.value)
        assert f"shard 0: its backup under {shard_dir} failed (FileExistsError: " in msg, msg
        assert msg.endswith(
            "the job stops rather than train on without one: make room there, choose another "
            "angel.ps.backup.path or set angel.ps.backup.interval=0"
        ), msg
        assert read_backup(aside)[1]["clocks"]["pushed"] == [2]  # the last good one, intact
    finally:
        c.shutdown()
