"""Fault matrix: a shard or a worker killed in the middle of training, default failover settings.

On a real local Ray, conf/lr_a9a.properties (LogisticRegression on a9a, BSP, ``ml.seed`` 0) with
nothing about failover set: shard backups every ``angel.ps.backup.interval`` updates under
``<angel.log.path>/ps-backup``, ``angel.worker.max.restarts`` restarts. A thread kills, while the
job trains,

- its shard (after its first backup), by Ray (``ray.kill``) or by SIGKILL of its process: Ray
  restarts it, it restores its backup, the worker replays its pushes since;
- one of its two workers (once the first epoch's checkpoint is written), by Ray or by SIGKILL:
  the job restarts every worker and shard from that checkpoint and says so on the console.

Each job finishes with exactly the per-epoch metrics (validation AUC and logloss, training loss)
of the uninterrupted run: these faults are bit-exact (docs/checkpoints.md). One of each kind runs
by default, the other variants are slow.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

from angelps.options import BACKUP_INTERVAL
from angelps.server.launch import actor_name
from learners.job.learner import GraphLearner
from learners.runs.folders import latest_run

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "lr_a9a.properties"
EPOCHS = 4  # of the worker faults
METRICS = ("epoch", "train_loss", "valid_auc", "valid_logloss", "lr")

pytestmark = pytest.mark.usefixtures("ray_local")


def _sets(d: Path, job: str, workers: int, epochs: int, save: bool | None = True) -> dict[str, Any]:
    """``save``: to d/model (True), to the run folder, the default (None), not at all (False)."""
    return {
        "angel.train.data.path": str(ROOT / "data" / "a9a" / "a9a_123d_train.libsvm"),
        "angel.save.model.path": str(d / "model") if save else "",
        "angel.save.model": save is not False,
        "angel.log.path": str(d / "log"),
        "angel.job.name": job,
        "angel.workergroup.number": workers,
        "ml.epoch.num": epochs,
    }


def _metrics(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: row[k] for k in METRICS} for row in history]


class Killer(threading.Thread):
    """Calls ``kill`` once ``ready()`` is true (polled every 20 ms while the job trains)."""

    def __init__(self, ready: Callable[[], bool], kill: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.ready, self.kill = ready, kill
        self.killed = False
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.ready():
                    self.kill()
                    self.killed = True
                    return
            except (ValueError, AttributeError, ray.exceptions.RayError):
                pass  # the actors are not up yet
            time.sleep(0.02)


def _run(d: Path, sets: dict[str, Any], killer: Callable[[GraphLearner], Killer] | None) -> Any:
    """Train; returns (history, the shards' stats at the end, the killer)."""
    learner = GraphLearner.from_properties(CONF, sets, quiet=True)
    k = killer(learner) if killer else None
    if k:
        k.start()
    try:
        result = learner.train()
        assert learner.actors.ps is not None
        stats = learner.actors.ps.stats()
    finally:
        if k:
            k.stop.set()
        learner.shutdown()
    return result.history, stats, k


_REF: dict[tuple[int, int], list[dict[str, Any]]] = {}


def _reference(tmp_path_factory: pytest.TempPathFactory, workers: int, epochs: int) -> Any:
    """The uninterrupted run's metrics (one per worker count and epochs, per module)."""
    if (workers, epochs) not in _REF:
        d = tmp_path_factory.mktemp(f"ref{workers}")
        history, _, _ = _run(d, _sets(d, f"ref{workers}", workers, epochs), None)
        _REF[(workers, epochs)] = _metrics(history)
    return _REF[(workers, epochs)]


# --- a shard ---------------------------------------------------------------------------------


def _shard_killer(job: str, how: str, seen: dict[str, Any]) -> Callable[[GraphLearner], Killer]:
    def make(learner: GraphLearner) -> Killer:
        shard = {}

        def ready() -> bool:
            h = ray.get_actor(actor_name(job, 0), namespace="angelps")
            st = ray.get(h.stats.remote(), timeout=10)
            if st["backup_clocks"][0] == 0:
                return False  # no backup yet
            assert learner.actors.ps is not None
            seen["backup_dir"] = learner.actors.ps.options.shard.backup_dir
            seen["mode"] = stat.S_IMODE(os.stat(seen["backup_dir"]).st_mode)
            seen["killed_at"] = st["clocks"]["pushed"][0]
            shard.update(handle=h, pid=st["pid"])
            return True

        def kill() -> None:
            if how == "sigkill":
                os.kill(shard["pid"], signal.SIGKILL)
            else:
                ray.kill(shard["handle"], no_restart=False)

        return Killer(ready, kill)

    return make


@pytest.mark.parametrize(
    "how,workers,epochs",
    [
        ("sigkill", 1, 8),
        pytest.param("ray", 1, 8, marks=pytest.mark.slow),
        pytest.param("sigkill", 2, 14, marks=pytest.mark.slow),
    ],
)
def test_a_killed_shard_is_restored_and_the_job_ends_as_if_uninterrupted(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, how: str, workers: int, epochs: int
) -> None:
    ref = _reference(tmp_path_factory, workers, epochs)
    job, seen = f"shard-{how}-{workers}", {}
    sets = _sets(tmp_path, job, workers, epochs)
    history, stats, killer = _run(tmp_path, sets, _shard_killer(job, how, seen))
    assert killer is not None and killer.killed
    # Killed mid-training (a9a: 115 updates an epoch with one worker, 58 with two), after its
    # first backup of training, and restarted by Ray from it.
    assert BACKUP_INTERVAL.default <= seen["killed_at"] < epochs * (115 // workers)
    assert [s["restarted"] for s in stats] == [True]
    # The backups lived in a private directory under the job's log directory, removed at the end.
    backups = Path(seen["backup_dir"])
    assert backups.parent == tmp_path / "log" / "ps-backup"
    assert backups.name.startswith(f"{job}-") and seen["mode"] == 0o700
    assert not (tmp_path / "log" / "ps-backup").exists()
    assert _metrics(history) == ref


# --- a worker --------------------------------------------------------------------------------


def _worker_pid(actor: Any) -> int:
    from ray._private import state

    return int(state.actors(actor._actor_id.hex())["Pid"])


def _worker_killer(d: Path, how: str, when: str = "checkpoint") -> Callable[[GraphLearner], Killer]:
    def make(learner: GraphLearner) -> Killer:
        def ready() -> bool:
            if learner.actors.workers is None or len(learner.actors.workers.actors) < 2:
                return False
            run = latest_run(d / "log")
            if when == "checkpoint":  # (at the save path, or the run folder's by default)
                in_run = run is not None and (run / "model" / "manifest.json").exists()
                return in_run or (d / "model" / "manifest.json").exists()
            log = run / "metrics.jsonl" if run is not None else d / "log" / "no-run-yet"
            return log.exists() and '"kind": "step"' in log.read_text()

        def kill() -> None:
            assert learner.actors.workers is not None
            victim = learner.actors.workers.actors[1]
            if how == "sigkill":
                os.kill(_worker_pid(victim), signal.SIGKILL)
            else:
                ray.kill(victim)

        return Killer(ready, kill)

    return make


@pytest.mark.parametrize("how", ["ray", pytest.param("sigkill", marks=pytest.mark.slow)])
def test_a_killed_worker_restarts_the_job_from_its_checkpoint(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    ref = _reference(tmp_path_factory, 2, EPOCHS)
    sets = _sets(tmp_path, f"worker-{how}", 2, EPOCHS)
    history, _, killer = _run(tmp_path, sets, _worker_killer(tmp_path, how))
    assert killer is not None and killer.killed
    err = capsys.readouterr().err
    assert "angelps: warning: worker 1 died (" in err, err
    assert (
        f"); restarting the workers and parameter shards from the checkpoint "
        f"{tmp_path / 'model'} (epoch 1 done), restart 1 of angel.worker.max.restarts=3\n"
    ) in err
    assert _metrics(history) == ref


@pytest.mark.slow
def test_without_a_checkpoint_a_killed_worker_restarts_the_job_from_the_beginning(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = _reference(tmp_path_factory, 2, EPOCHS)
    sets = _sets(tmp_path, "worker-nosave", 2, EPOCHS, save=False)  # (no checkpoint at all)
    history, _, killer = _run(tmp_path, sets, _worker_killer(tmp_path, "ray", when="step"))
    assert killer is not None and killer.killed
    err = capsys.readouterr().err
    assert (
        "); restarting the workers and parameter shards from the beginning (no checkpoint "
        "yet: angel.save.model=false saves none), restart 1 of angel.worker.max.restarts=3\n"
    ) in err
    assert _metrics(history) == ref


def test_without_a_save_path_a_killed_worker_restarts_from_the_run_folder_s_checkpoint(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job saves into its run folder by default: a dead worker restarts from there (it
    restarted from the first epoch, the failover made before that default was filled in)."""
    ref = _reference(tmp_path_factory, 2, EPOCHS)
    sets = _sets(tmp_path, "worker-runsave", 2, EPOCHS, save=None)
    history, _, killer = _run(tmp_path, sets, _worker_killer(tmp_path, "ray"))
    assert killer is not None and killer.killed
    err = capsys.readouterr().err
    model = next((tmp_path / "log").glob("worker-runsave-*")) / "model"
    assert (
        f"); restarting the workers and parameter shards from the checkpoint {model} (epoch 1 "
        "done), restart 1 of angel.worker.max.restarts=3\n"
    ) in err
    assert _metrics(history) == ref


@pytest.mark.slow
def test_a_dead_worker_beyond_the_allowed_restarts_fails_the_job_with_one_line(
    tmp_path: Path,
) -> None:
    sets = {**_sets(tmp_path, "worker-norestart", 2, EPOCHS), "angel.worker.max.restarts": 0}
    with pytest.raises(RuntimeError) as e:
        _run(tmp_path, sets, _worker_killer(tmp_path, "ray"))
    msg = str(e.value)
    assert msg.startswith("worker 1 died: The actor is dead because"), msg
    assert msg.endswith(
        "; the job has restarted 0 time(s), as many as angel.worker.max.restarts=0 allows"
    ), msg
    assert "\n" not in msg


def _kill_and_wait(victim: Any) -> None:
    """Kill worker actor ``victim`` and wait until Ray knows it is dead (ray.kill is
    asynchronous)."""
    ray.kill(victim)
    for _ in range(200):
        try:
            ray.get(victim.__ray_ready__.remote(), timeout=1)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.05)


class _KillAfter:
    """The worker group, but worker 1 is killed once ``method`` has answered (a proxy:
    everything else is the group's own)."""

    def __init__(self, workers: Any, method: str) -> None:
        self._workers, self._method = workers, method

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workers, name)

    def __len__(self) -> int:
        return len(self._workers)

    def execute(self, method: str, *args: Any) -> Any:
        out = self._workers.execute(method, *args)
        if method == self._method:
            _kill_and_wait(self._workers.actors[1])
        return out

    def execute_single(self, index: int, method: str, *args: Any) -> Any:
        out = self._workers.execute_single(index, method, *args)
        if method == self._method:
            _kill_and_wait(self._workers.actors[1])
        return out


# Where in the second epoch's save worker 1 is killed, and the epochs done by the checkpoint
# the job restarts from: up to the RNG states the save needs the dead worker (it fails, and
# the job runs the second epoch again); after them the checkpoint is written without it, and
# the death is found as the third epoch starts.
SAVE_KILLS = [
    pytest.param("start", 1, id="before the dense layers are taken"),
    pytest.param("dense_state", 1, id="after the dense layers", marks=pytest.mark.slow),
    pytest.param("rng_state", 2, id="after the RNG states", marks=pytest.mark.slow),
    pytest.param("tables", 2, id="after the shards wrote their tables", marks=pytest.mark.slow),
    pytest.param("committed", 2, id="after the commit", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("point", "resumed"), SAVE_KILLS)
def test_a_worker_killed_during_the_checkpoint_is_handled_like_any_other_death(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    point: str,
    resumed: int,
) -> None:
    """Worker 1 killed at one of five points of the second epoch's save: the save is not
    blamed on the disk; the job restarts from the last checkpoint, says so, and ends with the
    uninterrupted run's metrics; its metrics.jsonl has each epoch's record once."""
    from angelps.checkpoint import files
    from learners.job import saved_model

    ref = _reference(tmp_path_factory, 2, EPOCHS)
    real_save, real_manifest, saves = saved_model.save, files.write_manifest, []

    def save(
        path: str, ps: Any, workers: Any, section: Any, held: Any = (), background: bool = False
    ) -> Any:
        saves.append(workers)
        if len(saves) != 2:
            return real_save(path, ps, workers, section, held, background)
        if point == "start":
            _kill_and_wait(workers.actors[1])
        elif point in ("dense_state", "rng_state"):
            workers = _KillAfter(workers, point)
        pending = real_save(path, ps, workers, section, held, background)
        if pending is not None:  # (written in the background: "committed" once it is)
            pending.result()
        if point == "committed":
            _kill_and_wait(workers.actors[1])
        return pending

    def write_manifest(root: str, manifest: Any) -> None:
        if point == "tables" and len(saves) == 2 and ".tmp-" in os.path.basename(root):
            _kill_and_wait(saves[-1].actors[1])
        real_manifest(root, manifest)

    monkeypatch.setattr(saved_model, "save", save)
    monkeypatch.setattr(files, "write_manifest", write_manifest)
    history, _, _ = _run(tmp_path, _sets(tmp_path, "save-death", 2, EPOCHS), None)
    err = capsys.readouterr().err
    assert "CheckpointWriteError" not in err and "could not be written" not in err, err
    assert "angelps: warning: worker 1 died (" in err, err
    during = ", while the checkpoint of epoch 2 was written" if resumed == 1 else ""
    assert (
        f"{during}); restarting the workers and parameter shards from the checkpoint "
        f"{tmp_path / 'model'} (epoch {resumed} done), restart 1 of "
        "angel.worker.max.restarts=3\n"
    ) in err, err
    # The second epoch's save again after the restart, when it failed.
    assert len(saves) == EPOCHS + (1 if resumed == 1 else 0)
    assert _metrics(history) == ref
    run = latest_run(tmp_path / "log")
    assert run is not None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [1, 2, 3, 4]
    steps = [r["step"] for r in rows if r["kind"] == "step"]
    assert steps == sorted(set(steps))
    for f in run.iterdir():  # Ray's reasons for the death: no colour codes into the files
        assert not f.is_file() or b"\x1b" not in f.read_bytes(), f


@pytest.mark.slow
def test_a_killed_worker_holding_table_rows_restarts_from_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """angel.sparse.placement=worker: the lost worker's rows come back from the checkpoint
    (every worker reads its share of the files), and the job ends as the uninterrupted one."""
    held = {"angel.sparse.placement": "worker"}
    ref_dir = tmp_path / "ref"
    ref, _, _ = _run(ref_dir, {**_sets(ref_dir, "held-ref", 2, EPOCHS), **held}, None)
    sets = {**_sets(tmp_path, "held-ray", 2, EPOCHS), **held}
    history, _, killer = _run(tmp_path, sets, _worker_killer(tmp_path, "ray"))
    assert killer is not None and killer.killed
    err = capsys.readouterr().err
    assert (
        f"); restarting the workers and parameter shards from the checkpoint "
        f"{tmp_path / 'model'} (epoch 1 done), restart 1 of angel.worker.max.restarts=3\n"
    ) in err
    assert _metrics(history) == _metrics(ref)


@pytest.mark.parametrize(
    ("placement", "resumed"),
    [
        pytest.param("ps", 2, id="tables on the shards: committed without the worker"),
        pytest.param("worker", 1, id="tables held by the workers: not committed"),
    ],
)
def test_a_worker_killed_while_the_checkpoint_is_written_in_the_background(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    placement: str,
    resumed: int,
) -> None:
    """Worker 1 killed once the second epoch's save has copied the rows (its files written
    in the background, angel.save.model.async): with the tables on the shards the commit
    needs no worker and the job restarts from that checkpoint; with tables held by the
    workers the dead worker's files never come, that checkpoint is not committed, and the
    job restarts from the first. Either way it ends as the uninterrupted run."""
    from learners.job import saved_model

    held = {"angel.sparse.placement": placement}
    ref_dir = tmp_path / "ref"
    ref, _, _ = _run(ref_dir, {**_sets(ref_dir, "bg-ref", 2, 3), **held}, None)
    real_save, saves = saved_model.save, []

    def save(path: str, ps: Any, workers: Any, section: Any, *more: Any) -> Any:
        saves.append(section["epoch"])
        pending = real_save(path, ps, workers, section, *more)
        if len(saves) == 2:
            assert pending is not None  # (in the background: not the job's last save)
            _kill_and_wait(workers.actors[1])
        return pending

    monkeypatch.setattr(saved_model, "save", save)
    history, _, _ = _run(tmp_path, {**_sets(tmp_path, "bg-death", 2, 3), **held}, None)
    err = capsys.readouterr().err
    assert "CheckpointWriteError" not in err and "could not be written" not in err, err
    assert (
        f"); restarting the workers and parameter shards from the checkpoint "
        f"{tmp_path / 'model'} (epoch {resumed} done), restart 1 of "
        "angel.worker.max.restarts=3\n"
    ) in err, err
    assert saves == ([0, 1, 1, 2] if resumed == 1 else [0, 1, 2])
    assert _metrics(history) == _metrics(ref)
