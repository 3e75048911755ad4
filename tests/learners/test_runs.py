"""Runs in their own directories (learners.runs.folders) and the checkpoints a job keeps
(learners.runs.retention): names, the latest pointer, finding a run, the copies kept and pruned."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from angelps.checkpoint import local_dir as checkpoint_dir
from learners.runs.folders import find_run, latest_run, new_run_dir, run_name
from learners.runs.retention import Checkpoints, CheckpointWriteError
from learners.runs.run_log import RunLog, done_line
from learners.worker.group import WorkerDied
from tests.learners.data_helpers import a9a_head

WHEN = time.mktime((2026, 11, 23, 12, 45, 0, 0, 0, -1))


def test_run_dirs_are_named_by_job_and_time_and_latest_points_at_the_newest(tmp_path):
    first = new_run_dir(tmp_path, "lr_a9a", WHEN)
    again = new_run_dir(tmp_path, "lr_a9a", WHEN)  # the same second: a suffix, never shared
    other = new_run_dir(tmp_path, "my job/2", WHEN + 60)
    assert [first.name, again.name, other.name] == [
        "lr_a9a-20261123-124500",
        "lr_a9a-20261123-124500-2",
        "my_job_2-20261123-124600",
    ]
    assert (tmp_path / "latest").read_text() == "my_job_2-20261123-124600\n"
    assert latest_run(tmp_path) == other
    assert not list(tmp_path.glob(".latest*"))  # the pointer is replaced, not left half-written
    assert run_name("..", WHEN) == "run-20261123-124500"


def test_a_run_that_never_trained_is_dropped_and_latest_goes_back(tmp_path):
    from learners.runs.folders import drop_unstarted_run

    done = new_run_dir(tmp_path, "lr", when=1_700_000_000)
    (done / "metrics.jsonl").write_text('{"kind": "start"}\n{"kind": "epoch", "epoch": 1}\n')
    failed = new_run_dir(tmp_path, "lr", when=1_700_000_100)
    (failed / "metrics.jsonl").write_text('{"kind": "start"}\n')
    assert latest_run(tmp_path) == failed
    assert not drop_unstarted_run(done)  # (it trained: kept)
    assert drop_unstarted_run(failed)
    assert not failed.exists() and latest_run(tmp_path) == done
    model = new_run_dir(tmp_path, "lr", when=1_700_000_200)
    (model / "model").mkdir()  # anything of a checkpoint: kept
    assert not drop_unstarted_run(model) and model.exists()
    alone = tmp_path / "alone"
    only = new_run_dir(alone, "lr", when=1_700_000_300)  # no run left: no pointer
    assert drop_unstarted_run(only) and not (alone / "latest").exists()


def test_a_latest_pointer_never_leads_outside_its_root(tmp_path):
    (tmp_path / "latest").write_text("../elsewhere\n")
    assert latest_run(tmp_path) is None
    (tmp_path / "latest").write_text("gone-20261123-124500\n")
    assert latest_run(tmp_path) is None  # named, but removed since


def _metrics(run: Path) -> Path:
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "epoch", "epoch": 0}) + "\n")
    return run / "metrics.jsonl"


def test_find_run_by_name_directory_root_file_or_latest(tmp_path):
    root = tmp_path / "runs"
    a = new_run_dir(root, "a", WHEN)
    b = new_run_dir(root, "b", WHEN)
    _metrics(a), _metrics(b)
    loose = tmp_path / "old.jsonl"
    loose.write_text("")
    assert find_run(None, root).metrics == b / "metrics.jsonl"  # the latest
    assert find_run("a-20261123-124500", root).name == "a-20261123-124500"  # a name under root
    assert find_run(str(a), root).metrics == a / "metrics.jsonl"  # a run directory
    assert find_run(str(root), tmp_path).name == b.name  # a log root: its latest run
    assert find_run(str(a / "metrics.jsonl"), root).name == a.name  # the file, named by its run
    assert find_run(str(loose), root).name == "old"
    with pytest.raises(ValueError, match=r"^nope: no such run, run directory or metrics file; "):
        find_run("nope", root)
    with pytest.raises(ValueError, match=r"no runs under .*empty \(no .*latest\)"):
        find_run(None, tmp_path / "empty")


def test_a_run_on_object_storage_is_named_by_its_url_or_by_its_kept_copy(
    tmp_path, monkeypatch, capsys
):
    copied: list[tuple[str, str]] = []
    monkeypatch.setattr(
        "learners.runs.run_log.upload_run", lambda d, url: copied.append((d.name, url))
    )
    run = new_run_dir(tmp_path, "job", WHEN)
    log = RunLog(run, quiet=True, upload_to="s3://b/runs/")
    summary = {"epochs": 1, "elapsed_s": 1.0, "run_dir": str(run)}
    log.write_summary(summary)  # copied at once, so the done line names where the run is
    url = "s3://b/runs/job-20261123-124500"
    assert summary["run_dir"] == url
    assert done_line(summary) == f"done: 1 epochs, 1.0 s; no model saved; run {url}"
    assert json.loads((run / "summary.json").read_text())["run_dir"] == url
    assert copied == [(run.name, "s3://b/runs/")]
    log.close()  # nothing written since: not copied again
    assert copied == [(run.name, "s3://b/runs/")] and capsys.readouterr().err == ""
    run_b = new_run_dir(tmp_path, "job", WHEN)
    log = RunLog(run_b, quiet=True, upload_to="s3://b/runs/")
    log.write_summary({"epochs": 1, "elapsed_s": 1.0, "run_dir": str(run_b)})
    log.record({"kind": "step", "step": 2})  # written after the summary's copy
    log.close()  # copied once more, with it
    assert copied[1:] == [(run_b.name, "s3://b/runs/")] * 2 and capsys.readouterr().err == ""

    def unreachable(d: Path, url: str) -> None:
        raise OSError("the store is gone")

    monkeypatch.setattr("learners.runs.run_log.upload_run", unreachable)
    run = new_run_dir(tmp_path, "job", WHEN)
    log = RunLog(run, quiet=True, upload_to="s3://b/runs")
    summary = {"epochs": 1, "elapsed_s": 1.0, "run_dir": str(run)}
    log.write_summary(summary)
    # Not copied: the user is told where the run is kept, in the warning and the done line.
    assert summary["run_dir"] == str(run) and run.name == "job-20261123-124500-3"
    warning = (
        "angelps: warning: cannot copy the run to s3://b/runs: the store is gone; "
        f"it is kept in {run}\n"
    )
    assert capsys.readouterr().err == warning
    log.close()
    assert capsys.readouterr().err == warning


def _writer(calls: list[int], fail_on: set[int] | None = None):
    """A checkpoint writer with the real commit (angelps.checkpoint.local_dir) and a manifest whose
    learner section records the epoch, failing (as a full disk would) on the given calls."""

    def write(path: str) -> None:
        calls.append(len(calls))
        tmp = checkpoint_dir.new_tmp_dir(path)
        if fail_on and len(calls) - 1 in fail_on:
            os.rmdir(tmp)
            raise OSError(28, "No space left on device", tmp)
        manifest = {"format": "angelps-checkpoint", "extra": {"learner": {"epoch": len(calls)}}}
        Path(tmp, "manifest.json").write_text(json.dumps(manifest))
        Path(tmp, "w.bin").write_bytes(b"x" * 100)
        checkpoint_dir.commit_dir(tmp, path)

    return write


def _epoch_of(path: Path) -> int:
    return json.loads((path / "manifest.json").read_text())["extra"]["learner"]["epoch"]


def test_keep_last_and_best_as_linked_copies(tmp_path):
    save = tmp_path / "model"
    ck = Checkpoints(str(save), keep_last=2, keep_best=True)
    calls: list[int] = []
    improved = [True, True, False, False]  # the best is epoch 2 (index 1)
    for epoch, better in enumerate(improved):
        assert ck.save(_writer(calls), epoch, better)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["model", "model.best", "model.epoch-3", "model.epoch-4", "model.prev"]
    assert _epoch_of(save) == 4 and _epoch_of(tmp_path / "model.prev") == 3
    assert _epoch_of(tmp_path / "model.best") == 2
    # The latest and its epoch copy share their files: no extra disk.
    assert os.path.samefile(save / "w.bin", tmp_path / "model.epoch-4" / "w.bin")
    assert ck.where(1) == str(tmp_path / "model.best")
    assert ck.where(3) == str(save)
    assert ck.where(2) == str(tmp_path / "model.epoch-3")
    assert ck.where(0) is None  # pruned


def test_a_fresh_job_drops_the_copies_of_the_job_it_replaces(tmp_path):
    """An earlier job's <path>.best and <path>.epoch-<n> would pass for this job's (a best
    epoch of other data: `--model model.best` silently another model); they go at this job's
    first commit, not before (a job that fails first leaves them), and a resumed job keeps
    them."""
    save = tmp_path / "model"
    old = Checkpoints(str(save), keep_last=3, keep_best=True)
    calls: list[int] = []
    for epoch in range(3):
        assert old.save(_writer(calls), epoch, improved=epoch == 1)
    before = [
        "model",
        "model.best",
        "model.epoch-1",
        "model.epoch-2",
        "model.epoch-3",
        "model.prev",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    (tmp_path / "model.epoch-9").mkdir()  # (not a checkpoint: whatever stands there stays)

    resumed = Checkpoints(str(save), keep_best=True)  # --resume: the same job goes on
    resumed.resumed(2)
    assert resumed.save(_writer(calls), 3, improved=False)
    assert (tmp_path / "model.best").is_dir() and (tmp_path / "model.epoch-3").is_dir()

    said: list[str] = []
    fresh = Checkpoints(str(save), warn=said.append)  # no validation: it keeps no best
    failing = _writer(calls, fail_on={len(calls)})
    assert not Checkpoints(str(save), on_failure="continue", warn=said.append).save(
        failing, 0, improved=False
    )
    assert (tmp_path / "model.best").is_dir()  # nothing dropped before a commit
    assert fresh.save(_writer(calls), 0, improved=False)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["model", "model.epoch-9", "model.prev"]
    assert fresh.where(0) == str(save) and fresh.where(1) is None
    assert [s for s in said if "removed" in s] == [
        f"angelps: note: removed {tmp_path / 'model.epoch-1'}, kept by the job this one replaced",
        f"angelps: note: removed {tmp_path / 'model.epoch-2'}, kept by the job this one replaced",
        f"angelps: note: removed {tmp_path / 'model.epoch-3'}, kept by the job this one replaced",
        f"angelps: note: removed {tmp_path / 'model.best'}, kept by the job this one replaced",
    ]


def test_the_defaults_keep_only_the_latest_and_its_previous(tmp_path):
    save = tmp_path / "model"
    ck = Checkpoints(str(save))
    calls: list[int] = []
    for epoch in range(3):
        ck.save(_writer(calls), epoch, improved=epoch == 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.prev"]
    assert ck.where(0) is None and ck.where(2) == str(save)


def test_a_failed_write_stops_naming_the_last_good_checkpoint(tmp_path):
    save = tmp_path / "model"
    ck = Checkpoints(str(save), on_failure="stop")
    calls: list[int] = []
    write = _writer(calls, fail_on={1})
    ck.save(write, 0, True)
    with pytest.raises(CheckpointWriteError) as e:
        ck.save(write, 1, True)
    assert str(e.value) == (
        f"the checkpoint of epoch 2 could not be written to {save}: OSError: [Errno 28] No space "
        f"left on device: '{save}.tmp-{str(e.value).split('.tmp-')[1][:12]}'; the last good "
        f"checkpoint is {save} (epoch 1); stopped (angel.save.failure=stop): make room or fix "
        "the path, then continue with --resume"
    )
    assert _epoch_of(save) == 1  # untouched


def test_a_failed_first_write_says_to_train_again_not_to_resume(tmp_path):
    """With no checkpoint written yet, --resume has nothing to continue from (it is refused):
    the error said "continue with --resume" all the same."""
    save = tmp_path / "model"
    ck = Checkpoints(str(save), on_failure="stop")
    with pytest.raises(CheckpointWriteError) as e:
        ck.save(_writer([], fail_on={0}), 0, True)
    assert str(e.value).endswith(
        "; no checkpoint has been written yet; stopped (angel.save.failure=stop): make room or "
        "fix the path, then train again"
    )
    assert not save.exists()


class _Pending:
    """A checkpoint written in the background (angelps.client.pending_save.PendingSave): its
    ``result()`` waits for ``gate`` (the files), then commits with ``write`` or raises
    ``error``."""

    def __init__(self, write, path: str, error: BaseException | None = None) -> None:
        self.write, self.path, self.error = write, path, error
        self.gate = threading.Event()

    def result(self) -> None:
        assert self.gate.wait(10)
        if self.error is not None:
            raise self.error
        self.write(self.path)


def _start(pendings: list[_Pending], calls: list[int], error: BaseException | None = None):
    def start(path: str) -> _Pending:
        pendings.append(_Pending(_writer(calls), path, error))
        return pendings[-1]

    return start


def test_a_checkpoint_in_the_background_is_committed_by_its_thread(tmp_path):
    """save_async returns at once; the commit and the copies come from the commit thread; the
    next save waits for it first; the seconds training waited are counted."""
    save = tmp_path / "model"
    ck = Checkpoints(str(save), keep_last=2, keep_best=True)
    calls: list[int] = []
    pendings: list[_Pending] = []
    assert ck.save_async(_start(pendings, calls), 0, True)
    assert ck.writing and not save.exists() and ck.last_good is None
    threading.Timer(0.3, pendings[0].gate.set).start()
    assert ck.save_async(_start(pendings, calls), 1, False)  # waits for epoch 1's commit first
    assert _epoch_of(save) == 1 and ck.last_good is not None and ck.last_good.epoch == 0
    assert ck.waited_s >= 0.25
    pendings[1].gate.set()
    assert ck.wait() and not ck.writing
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["model", "model.best", "model.epoch-1", "model.epoch-2", "model.prev"]
    assert ck.where(0) == str(tmp_path / "model.best") and ck.where(1) == str(save)


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_a_checkpoint_that_fails_in_the_background_meets_the_policy_when_waited_for(
    tmp_path, policy
):
    save = tmp_path / "model"
    said: list[str] = []
    ck = Checkpoints(str(save), on_failure=policy, warn=said.append)
    calls: list[int] = []
    pendings: list[_Pending] = []
    ck.save(_writer(calls), 0, True)
    full = OSError(28, "No space left on device")
    assert ck.save_async(_start(pendings, calls, full), 1, True)
    pendings[0].gate.set()
    what = (
        f"the checkpoint of epoch 2 could not be written to {save}: OSError: [Errno 28] No "
        f"space left on device; the last good checkpoint is {save} (epoch 1)"
    )
    if policy == "stop":
        with pytest.raises(CheckpointWriteError) as e:
            ck.wait()
        assert str(e.value) == (
            f"{what}; stopped (angel.save.failure=stop): make room or fix the path, then "
            "continue with --resume"
        )
    else:
        assert not ck.wait()
        assert said == [f"angelps: warning: {what}; training goes on (angel.save.failure=continue)"]
    assert ck.failures == 1 and _epoch_of(save) == 1


def test_a_worker_lost_while_a_checkpoint_is_written_in_the_background(tmp_path):
    """A worker that died writing its part: the job restarts (WorkerDied naming the epoch of
    the checkpoint), not a failed write; a job already restarting waits for it quietly."""
    save = tmp_path / "model"
    ck = Checkpoints(str(save))
    calls: list[int] = []
    pendings: list[_Pending] = []
    for lost in (False, True):
        died = WorkerDied(1, "The actor is dead because its worker process has died")
        assert ck.save_async(_start(pendings, calls, died), 2, True)
        pendings[-1].gate.set()
        if lost:
            assert not ck.wait(lost_worker=True)
        else:
            with pytest.raises(WorkerDied) as e:
                ck.wait()
            assert str(e.value) == (
                "worker 1 died: The actor is dead because its worker process has died, while "
                "the checkpoint of epoch 3 was written"
            )
    assert ck.failures == 0 and not save.exists()


def test_a_job_ending_on_an_error_waits_a_bounded_time_for_the_checkpoint(tmp_path, monkeypatch):
    from learners.runs import retention

    monkeypatch.setattr(retention, "ABANDON_WAIT_S", 0.2)
    save = tmp_path / "model"
    said: list[str] = []
    ck = Checkpoints(str(save), warn=said.append)
    pendings: list[_Pending] = []
    ck.save_async(_start(pendings, []), 0, True)
    ck.abandon()  # its files never come
    assert said == [
        "angelps: note: waiting for the checkpoint of epoch 1 being written in the background "
        "(at most 0.2 s)",
        "angelps: warning: the checkpoint of epoch 1 was still being written after 0.2 s: not "
        "committed; no checkpoint has been written yet",
    ]
    pendings[0].gate.set()


def test_a_failed_write_warns_and_goes_on_with_continue(tmp_path):
    save = tmp_path / "model"
    said: list[str] = []
    ck = Checkpoints(str(save), on_failure="continue", warn=said.append)
    calls: list[int] = []
    write = _writer(calls, fail_on={0, 2})
    assert not ck.save(write, 0, True)
    assert "no checkpoint has been written yet; training goes on" in said[0]
    assert ck.save(write, 1, False)
    assert not ck.save(write, 2, False)
    assert said[1].startswith(
        f"angelps: warning: the checkpoint of epoch 3 could not be written to {save}"
    )
    assert f"the last good checkpoint is {save} (epoch 2)" in said[1]
    assert ck.failures == 2 and ck.last_good is not None and ck.last_good.epoch == 1


ROOT = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path, **sets: object):
    from learners.job.learner import GraphLearner

    data = a9a_head(tmp_path / "a9a.libsvm", 3000)
    base = {
        "angel.train.data.path": str(data),
        "angel.log.path": str(tmp_path / "runs"),
        "angel.job.name": "keep",
        "angel.save.model.path": "",  # the job file's, unless a test sets one
        "ml.epoch.num": 3,
    }
    return GraphLearner.from_properties(
        ROOT / "conf" / "lr_a9a.properties", {**base, **sets}, quiet=True
    )


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"angel.save.model.keep.best": "true", "angel.save.model": "false"},
            "angel.save.model.keep.best=true (program) keeps checkpoints, but "
            "angel.save.model=false (program): drop one of them",
        ),
        (
            {"angel.save.model.keep.last": 3, "angel.save.model": "false"},
            "angel.save.model.keep.last=3 (program) keeps checkpoints, but "
            "angel.save.model=false (program): drop one of them",
        ),
        (
            {"angel.save.model.keep.best": "true", "ml.data.validate.ratio": 0, "SAVE": 1},
            "angel.save.model.keep.best=true needs a validation metric: set "
            "ml.data.validate.ratio > 0 or angel.validate.data.path",
        ),
    ],
)
def test_keeping_checkpoints_is_checked_before_anything_runs(tmp_path, sets, message):
    from angelconf.config import ConfigError

    sets = dict(sets)
    if sets.pop("SAVE", None):
        sets["angel.save.model.path"] = str(tmp_path / "model")
    learner = _job(tmp_path, **sets)
    with pytest.raises(ConfigError) as e:
        learner.train()
    assert str(e.value) == message.replace("MODEL", str(tmp_path / "model"))
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


@pytest.mark.usefixtures("ray_local")
def test_a_run_keeps_its_files_apart_and_says_where_the_best_epoch_is(tmp_path):
    save = tmp_path / "model"
    sets = {
        "angel.save.model.path": str(save),
        "angel.save.model.keep.last": 2,
        "angel.save.model.keep.best": "true",
        # logloss: its best epoch is not always the last, unlike this job's AUC
        "ml.early.stop.metric": "valid_logloss",
    }
    learner = _job(tmp_path, **sets)
    try:
        first = learner.train().summary
    finally:
        learner.shutdown()
    learner = _job(tmp_path, **sets)
    try:
        second = learner.train().summary
    finally:
        learner.shutdown()
    runs = tmp_path / "runs"
    assert Path(first["run_dir"]).parent == runs and first["run_dir"] != second["run_dir"]
    assert Path(second["run_dir"]).name == (runs / "latest").read_text().strip()
    for s in (first, second):
        run = Path(s["run_dir"])
        assert sorted(p.name for p in run.iterdir()) == [
            "config.properties",
            "metrics.jsonl",
            "summary.json",
        ]
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert [x["kind"] for x in lines].count("start") == 1  # one run per file
        assert json.loads((run / "summary.json").read_text()) == s
    history = [
        json.loads(x) for x in (Path(second["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [h["valid_logloss"] for h in history if h["kind"] == "epoch"]
    best = min(range(3), key=lambda i: losses[i])
    assert second["best_epoch"] == best + 1 and second["best_metric"] == "valid_logloss"
    assert second["best_value"] == pytest.approx(losses[best])
    assert second["best_checkpoint"] == f"{save}.best"
    assert _epoch_of(Path(f"{save}.best")) == best
    assert second["checkpoint"] == str(save) and second["checkpoint_epoch"] == 3
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model"))
    assert names == ["model", "model.best", "model.epoch-2", "model.epoch-3", "model.prev"]


@pytest.mark.usefixtures("ray_local")
def test_a_checkpoint_every_n_epochs_and_after_the_last(tmp_path):
    """angel.save.model.every.howmany.epochs=2 over 5 epochs: checkpoints after epochs 2, 4
    and 5 (the last), none after 1 and 3; the run resumes from the last one."""
    save = tmp_path / "model"
    sets = {
        "angel.save.model.path": str(save),
        "angel.save.model.keep.last": 5,
        "angel.save.model.keep.best": "false",
        "angel.save.model.every.howmany.epochs": 2,
        "ml.epoch.num": 5,
    }
    learner = _job(tmp_path, **sets)
    try:
        summary = learner.train().summary
    finally:
        learner.shutdown()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model"))
    assert names == ["model", "model.epoch-2", "model.epoch-4", "model.epoch-5", "model.prev"]
    assert summary["checkpoint_epoch"] == 5 and summary["epochs"] == 5
    assert _epoch_of(Path(f"{save}.prev")) == 3  # (0-based: epoch 4's, the one before)
    learner = _job(tmp_path, **{**sets, "ml.epoch.num": 7})
    try:
        resumed = learner.train(resume=True).summary
    finally:
        learner.shutdown()
    assert resumed["epochs"] == 7 and resumed["checkpoint_epoch"] == 7
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model.epoch"))
    assert names == ["model.epoch-4", "model.epoch-5", "model.epoch-6", "model.epoch-7"]


@pytest.mark.parametrize(
    ("epoch", "every", "stops", "saves"),
    [
        (0, 1, False, True),
        (0, 3, False, False),
        (2, 3, False, True),
        (3, 3, False, False),
        (3, 3, True, True),  # an early stop ends here: its epoch is saved
        (6, 3, False, True),  # the last of 7
        (6, 100, False, True),
    ],
)
def test_which_epochs_are_saved(epoch, every, stops, saves):
    from types import SimpleNamespace

    from learners.job.train_loop import TrainingLoop

    plan = SimpleNamespace(save_every=every, epochs=7, early_stop_patience=2 if stops else 0)
    loop = SimpleNamespace(plan=plan)
    loop._stops = lambda p: TrainingLoop._stops(loop, p)  # type: ignore[attr-defined]
    loop._ends_after = lambda e, p: TrainingLoop._ends_after(loop, e, p)  # type: ignore[attr-defined]
    progress = SimpleNamespace(since_best=2)
    assert TrainingLoop._saves_after(loop, epoch, progress) is saves  # type: ignore[arg-type]


def test_relative_outputs_of_a_submitted_job_are_pointed_out(monkeypatch, tmp_path, capsys):
    from learners.runs.folders import relative_under_ray_job

    paths = {"angel.log.path": "runs", "angel.save.model.path": str(tmp_path / "m")}
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert relative_under_ray_job(paths) is None  # not a submitted job: relative is fine
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.chdir(tmp_path)
    assert relative_under_ray_job(paths) == (
        f"angelps: note: angel.log.path=runs is relative to {tmp_path}, the working directory Ray "
        "made for this job, which Ray deletes with it: give absolute paths to keep the outputs"
    )
    assert relative_under_ray_job({"angel.log.path": str(tmp_path)}) is None
    # --summary-json too, said before the job starts (here it stops at its missing data)
    from learners.cli.main import main

    assert main(["train", "--summary-json", "s.json"]) == 2
    err = capsys.readouterr().err
    assert (
        f"angelps: note: --summary-json=s.json is relative to {tmp_path}, the working directory "
        "Ray made for this job, which Ray deletes with it: give absolute paths to keep the outputs"
    ) in err


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"angel.save.failure": "retry"},
            "angel.save.failure=retry is not valid: expected one of stop, continue",
        ),
        (
            {"angel.save.model.keep.last": 0},
            "angel.save.model.keep.last=0 is not valid: expected a number > 0",
        ),
        (
            {"angel.save.model.keep.best": "maybe"},
            "angel.save.model.keep.best=maybe is not valid: expected true or false",
        ),
        (
            {"angel.save.model.every.howmany.epochs": 0},
            "angel.save.model.every.howmany.epochs=0 is not valid: expected a number > 0",
        ),
    ],
)
def test_the_checkpoint_keys_refuse_impossible_values(sets, message):
    from angelconf.config import ConfigError, load_config
    from learners.keys import all_keys

    with pytest.raises(ConfigError) as e:
        load_config(None, sets, all_keys())
    assert str(e.value) == f"override: {message}"


def test_a_restart_does_not_write_an_epoch_or_step_record_twice(tmp_path):
    """A worker lost during the save of epoch 2 restarts the job from epoch 1's checkpoint: its
    step and epoch records (written before the save) come again and are written once."""
    from learners.runs.run_log import RunLog

    log = RunLog(tmp_path, tty=False, quiet=True)
    log.record({"kind": "start", "run": "r"})
    for epoch in (0, 1, 1, 2):  # epoch 1 (the second) twice: it ran again after the restart
        for step in (1, 2):
            log.record({"kind": "step", "epoch": epoch, "step": 2 * epoch + step, "loss": 0.5})
        log.record({"kind": "epoch", "epoch": epoch, "step": 2 * epoch + 2, "valid_auc": 0.9})
    log.write_summary({"epochs": 3})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("epoch"), r.get("step")) for r in rows] == [
        ("start", None, None),
        *[("step", 1, 1), ("step", 1, 2), ("epoch", 1, 2)],
        *[("step", 2, 3), ("step", 2, 4), ("epoch", 2, 4)],
        *[("step", 3, 5), ("step", 3, 6), ("epoch", 3, 6)],
        ("summary", None, None),
    ]


def test_a_missing_run_names_the_newest_five_and_says_it_cut_the_list(tmp_path):
    for minute in range(8):
        run = new_run_dir(tmp_path, "lr", when=1_700_000_000 + 60 * minute)
        (run / "metrics.jsonl").write_text('{"kind": "start"}\n')
    with pytest.raises(ValueError) as e:
        find_run("nope", str(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert str(e.value) == (
        f"nope: no such run, run directory or metrics file; runs under {tmp_path} (the last 5 "
        f"of 8 by name): {', '.join(names[-5:])}"
    )


def test_a_resumed_job_s_data_is_compared_by_its_place_in_the_job_s_directory(monkeypatch):
    """A submitted job reads its data from Ray's copy of the working directory: resumed from
    the checkout (or submitted again, another copy), the same file is not other data."""
    from learners.job.train_loop import _same_path

    monkeypatch.chdir(ROOT)
    pkg = "/tmp/ray/session_1/runtime_resources/working_dir_files/_ray_pkg_fef2a259"
    assert _same_path(f"{pkg}/data/a9a/x.libsvm", str(ROOT / "data" / "a9a" / "x.libsvm"))
    assert _same_path(f"{pkg}/data/x", "/tmp/r2/_ray_pkg_0c1d/data/x")
    assert not _same_path(f"{pkg}/data/x", f"{pkg}/data/y")
    assert not _same_path("/tmp/a/x", "/tmp/b/x")
    assert _same_path("s3://b/x", "s3://b/x") and not _same_path("s3://b/x", "/b/x")
