"""A shard killed between the last step of an epoch and its checkpoint, on a real local Ray:
Ray restarts it from its last backup, and no step comes to find that out before the save. Each
worker's client replays the pushes the shard lacks before the save (``before_save``:
PSClient.catch_up), so the checkpoint holds every update, bit for bit the uninterrupted run's.
Before, the save failed while the shard was restarting ("the actor is restarting": the job
stopped) and, once it was back, wrote the backup's rows without the updates since. A shard
killed after the workers caught up fails the save's own calls: nothing is committed, the
workers catch up again and the same checkpoint is written once more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

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
    want, got = _tables(str(reference[1])), _tables(str(d / "model"))
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name][0], want[name][0])
        np.testing.assert_array_equal(got[name][1], want[name][1])
        assert got[name][2].keys() == want[name][2].keys()
        for k in want[name][2]:
            np.testing.assert_array_equal(got[name][2][k], want[name][2][k])
