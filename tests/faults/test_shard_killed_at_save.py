"""A shard killed at a checkpoint, on a real local Ray (conf/lr_a9a.properties, two workers).

Between the last step of an epoch and its save: Ray restarts it from its last backup, and no
step comes to find that out before the save. Each worker's client replays the pushes the
shard lacks before the save (``before_save``: PSClient.catch_up), so the checkpoint holds
every update, bit for bit the uninterrupted run's. Before, the save failed while the shard was
restarting ("the actor is restarting": the job stopped) and, once it was back, wrote the
backup's rows without the updates since. A shard killed after the workers caught up fails the
save's own calls: nothing is committed, the workers catch up again and the same checkpoint is
written once more.

While it writes its part of a checkpoint in the background (training going on): that
checkpoint is lost with the process, the job says so and trains on (the shard restored, its
workers replaying), and the next checkpoint is written as usual. Before, the job stopped with
"no checkpoint is being written" (angel.save.failure=stop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from angelps.server.launch import actor_name
from tests.angelps.test_before_replay import kill_shard
from tests.faults.test_failover import _metrics, _run, _sets
from tests.learners.test_worker_tables import _tables

pytestmark = pytest.mark.usefixtures("ray_local")

# Inline backups every 20 updates: a9a's epoch is 58 updates with two workers, so the shard
# comes back at clock 40 and each worker replays 18 pushes.
BACKUPS = {"angel.ps.backup.interval": 20, "angel.ps.backup.async": False}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    d = tmp_path_factory.mktemp("ref")
    history, _, _ = _run(d, {**_sets(d, "presave-ref", 2, 1), **BACKUPS}, None)
    return _metrics(history), d / "model"


class _KillAfterCatchUp:
    """The worker group, but once every worker has caught up (``before_save``), the shard is
    killed: the save's own calls then meet it restarting."""

    def __init__(self, workers: Any, kill: Any) -> None:
        self._workers, self._kill = workers, kill

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workers, name)

    def execute(self, method: str, *args: Any) -> Any:
        out = self._workers.execute(method, *args)
        if method == "before_save" and self._kill is not None:
            self._kill, kill = None, self._kill
            kill()
        return out


@pytest.mark.parametrize(
    "when",
    [
        pytest.param("restarting", id="saved while the shard restarts"),
        pytest.param("back", id="saved once the shard is back"),
        pytest.param("caught-up", id="killed after the workers caught up, saved again"),
    ],
)
def test_a_shard_killed_just_before_the_save_leaves_a_checkpoint_with_every_update(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    reference: tuple[Any, Path],
    when: str,
) -> None:
    from learners.job import saved_model

    job, real_save, killed = f"presave-{when}", saved_model.save, []

    def save(path: str, ps: Any, workers: Any, *args: Any, **kwargs: Any) -> Any:
        pid = ps.stats()[0]["pid"]
        killed.append(pid)
        if when == "caught-up":
            workers = _KillAfterCatchUp(workers, lambda: kill_shard(job, 0, pid))
        else:
            kill_shard(job, 0, pid, back=when == "back")
        return real_save(path, ps, workers, *args, **kwargs)

    monkeypatch.setattr(saved_model, "save", save)
    d = tmp_path / "run"
    history, stats, _ = _run(d, {**_sets(d, job, 2, 1), **BACKUPS}, None)
    assert len(killed) == 1
    again = "angelps: warning: a parameter shard failed while the checkpoint was written ("
    assert (again in capsys.readouterr().err) == (when == "caught-up")
    assert [s["restarted"] for s in stats] == [True]
    assert stats[0]["clocks"]["pushed"] == [58, 58]
    assert _metrics(history) == reference[0]
    _assert_same_tables(_tables(str(reference[1])), _tables(str(d / "model")))


def _assert_same_tables(want: dict[str, Any], got: dict[str, Any]) -> None:
    """Every table's keys, rows and optimizer state equal, bit for bit."""
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name][0], want[name][0])
        np.testing.assert_array_equal(got[name][1], want[name][1])
        assert got[name][2].keys() == want[name][2].keys()
        for k in want[name][2]:
            np.testing.assert_array_equal(got[name][2][k], want[name][2][k])


def test_a_shard_killed_while_it_writes_a_checkpoint_in_the_background_loses_only_that_one(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from angelps.client import pending_save

    ref_dir = tmp_path_factory.mktemp("ref2")
    ref, _, _ = _run(ref_dir, {**_sets(ref_dir, "bgsave-ref", 2, 2), **BACKUPS}, None)
    job, real_get, killed = "bgsave", pending_save._get, []

    def get(refs: Any) -> Any:
        out = real_get(refs)
        if not killed:  # (the first: epoch 1's copies, made; its files being written)
            h = ray.get_actor(actor_name(job, 0), namespace="angelps")
            killed.append(ray.get(h.pid.remote()))
            kill_shard(job, 0, killed[0], back=True)
        return out

    monkeypatch.setattr(pending_save, "_get", get)
    d = tmp_path / "run"
    history, stats, _ = _run(d, {**_sets(d, job, 2, 2), **BACKUPS}, None)
    assert len(killed) == 1
    err = capsys.readouterr().err
    assert (
        "angelps: warning: the checkpoint of epoch 1 was not written: a parameter shard failed "
        "while it wrote it in the background (SaveLost: parameter shard 0 was restarted while "
        "it wrote its part of the checkpoint: that checkpoint is lost (the one before stays)); "
        "training goes on and the next checkpoint is written as usual; no checkpoint has been "
        "written yet"
    ) in err, err
    assert [s["restarted"] for s in stats] == [True]
    assert _metrics(history) == _metrics(ref)
    _assert_same_tables(_tables(str(ref_dir / "model")), _tables(str(d / "model")))
