"""The whole-job progress bar (learners.runs.progress): chunks sized by time, the bar's text, a real
run's console, and the bar closed when training fails or is interrupted."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from tqdm import tqdm

from learners.job.learner import GraphLearner
from learners.job.train_loop import TrainingLoop
from learners.runs.progress import Chunker, JobBar, PlainProgress, merge_chunks
from learners.runs.run_log import step_record
from learners.worker.chunk_stats import StepStats
from tests.learners.data_helpers import a9a_head

ROOT = Path(__file__).resolve().parents[2]


def test_chunks_take_about_a_quarter_second_and_never_cross_a_metrics_line():
    c = Chunker(log_every=50, target_s=0.25)
    assert c.next(0, 115) == 1  # nothing measured yet: one update
    c.observe(1, 0.01)  # 10 ms per update: 25 fit in a quarter second
    assert c.next(1, 115) == 25
    assert c.next(40, 115) == 10  # up to the metrics line at update 50
    assert c.next(110, 115) == 5  # up to the end of the epoch
    c.observe(10, 10.0)  # slow updates (a second each, smoothed): one at a time
    assert c.next(50, 115) == 1
    fast = Chunker(log_every=50)
    fast.observe(100, 0.01)
    assert fast.next(0, 115) == 50  # fast updates: a whole metrics line per call


def _out(updates: int, loss_sum: float, lr: float) -> StepStats:
    return StepStats(updates=updates, samples=10 * updates, loss_sum=loss_sum, pull_s=0.1,
                     compute_s=0.2, push_s=0.1, elapsed_s=0.5, last_lr=lr,
                     last_rates={"momentum": lr})  # fmt: skip


def test_chunks_of_one_metrics_line_are_summed_per_worker():
    first = [_out(3, 1.5, 0.1), _out(3, 2.5, 0.1)]
    merged = merge_chunks(None, first)
    merged = merge_chunks(merged, [_out(2, 1.0, 0.05), _out(2, 1.0, 0.05)])
    assert [m.updates for m in merged] == [5, 5]
    assert [m.loss_sum for m in merged] == [2.5, 3.5]
    assert merged[0].samples == 50 and merged[0].elapsed_s == 1.0
    assert merged[0].pull_s == pytest.approx(0.2)
    assert merged[0].last_lr == 0.05 and merged[0].last_rates == {"momentum": 0.05}
    assert first[0].updates == 3  # the workers' answers are not changed
    # A chunk that made no update (all skipped) keeps the step size of the one before.
    merged = merge_chunks(merged, [_out(0, 0.0, 0.0), _out(0, 0.0, 0.0)])
    assert merged[0].last_lr == 0.05 and merged[0].last_rates == {"momentum": 0.05}
    rec = step_record(0, 7, 7, merged)
    assert rec["lr"] == 0.05 and rec["momentum"] == 0.05 and rec["loss"] == (2.5 + 3.5) / 100
    assert rec["bytes_per_step"] == 0.0 and "cache_hit_rate" not in rec


def test_the_bar_counts_the_whole_job_and_says_samples_loss_and_lr():
    f = io.StringIO()
    bar = JobBar(total=30, done=10, epochs=3, updates_per_epoch=10, file=f, ncols=100)
    bar.update(5, samples=12_800, seconds=1.0, loss=0.4321, lr=0.0125)
    bar.tick()
    text = f.getvalue()
    assert "epoch 2/3  50%|" in text  # resumed after epoch 1: the bar starts at 10 of 30
    assert "| 15/30 upd [" in text
    assert ", 12.8k samples/s, loss 0.4321, lr 0.0125]" in text
    bar.write("epoch 2/3  lr 0.0125 ...")
    bar.close()
    bar.close()  # idempotent
    assert not tqdm._instances  # type: ignore[attr-defined]
    assert f.getvalue().endswith("\r")  # the bar's line cleared, nothing left on it


def test_a_terminal_without_a_size_still_gets_a_bar(monkeypatch):
    # (a pty with no window size says 0 columns: tqdm then drew nothing, a long epoch silent)
    import os
    import shutil

    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a: os.terminal_size((0, 0)))
    f = io.StringIO()
    bar = JobBar(total=30, done=0, epochs=3, updates_per_epoch=10, file=f)
    bar.update(5, samples=1_000, seconds=1.0, loss=0.5, lr=0.01)
    bar.tick()
    bar.close()
    assert "| 5/30 upd [" in f.getvalue()


def test_off_a_terminal_a_plain_line_every_so_many_seconds():
    now = [100.0]
    f = io.StringIO()
    p = PlainProgress(300, 0, 3, 100, every_s=30.0, file=f, clock=lambda: now[0])
    now[0] = 110.0
    p.update(50, 1600, 0.125, 0.5, 0.02)  # 10 s since the start: not yet
    assert f.getvalue() == ""
    now[0] = 160.0
    p.update(70, 2240, 0.2, 0.4321, 0.0125)  # 60 s, 120 of 300 updates: 90 s left
    assert f.getvalue() == (  # (3,840 samples in the two chunks' 0.325 s: 11.8k a second)
        "progress: epoch 2/3   40% 120/300 updates [01:00<01:30]  11.8k samples/s"
        "  loss 0.4321  lr 0.0125\n"
    )
    now[0] = 170.0
    p.update(10, 320, 0.1, 0.4, 0.0125)  # 10 s after that line: none
    p.write("epoch 2/3  lr 0.0125 ...")
    assert f.getvalue().count("progress:") == 1
    p.tick()
    p.close()


def test_a_line_shows_the_samples_per_second_of_every_chunk_since_the_line_before():
    now = [0.0]
    f = io.StringIO()
    p = PlainProgress(300, 0, 3, 100, every_s=30.0, file=f, clock=lambda: now[0])
    now[0] = 30.0
    p.update(10, 10_000, 1.0, 0.5, 0.02)  # the first line: 10k samples in 1 s
    now[0] = 45.0
    p.update(20, 240_000, 8.0, 0.5, 0.02)  # 30k samples/s, no line yet
    now[0] = 60.0
    p.update(1, 8_000, 4.0, 0.5, 0.02)  # a stalled chunk (2k samples/s) ends the window
    first, second = f.getvalue().splitlines()
    assert "10.0k samples/s" in first
    # 248,000 samples in 12 s since the first line, not the stalled chunk's 2.0k
    assert "20.7k samples/s" in second and "2.0k samples/s" not in second


def test_a_resumed_job_estimates_from_its_own_updates():
    now = [0.0]
    f = io.StringIO()
    p = PlainProgress(300, 200, 3, 100, every_s=1.0, file=f, clock=lambda: now[0])
    now[0] = 5.0
    p.update(50, 1600, 0.1, 0.3, 0.01)  # 50 updates in 5 s since the resume: 5 s left
    assert "epoch 3/3   83% 250/300 updates [00:05<00:05]" in f.getvalue()


def _learner(tmp_path: Path, **more: object) -> GraphLearner:
    data = a9a_head(tmp_path / "a9a.libsvm", 3000)
    sets = {
        "angel.train.data.path": str(data),
        "angel.log.path": str(tmp_path / "runs"),
        "angel.save.model.path": str(tmp_path / "model"),
        "angel.job.name": "bar",
        "ml.epoch.num": 2,
        "ml.minibatch.size": 32,  # 2700 training rows: 85 updates per epoch
        "angel.log.every.steps": 20,
        **more,
    }
    return GraphLearner.from_properties(ROOT / "conf" / "lr_a9a.properties", sets)


@pytest.mark.usefixtures("ray_local")
def test_a_real_run_on_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("learners.runs.run_log._terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", "120")
    learner = _learner(tmp_path)
    try:
        summary = learner.train().summary
    finally:
        learner.shutdown()
    cap = capsys.readouterr()
    # The bar on stderr: the whole job's updates, its epoch, samples/s, the loss and the lr.
    assert "epoch 1/2" in cap.err and "epoch 2/2" in cap.err
    assert "/170 upd [" in cap.err
    assert " samples/s, loss 0." in cap.err and ", lr 0.0" in cap.err
    assert not tqdm._instances  # type: ignore[attr-defined]
    # The epoch lines and the last line on stdout; the last names the run, best and checkpoint.
    lines = cap.out.strip().splitlines()
    assert lines[-3].startswith("epoch 1/2  lr ") and lines[-2].startswith("epoch 2/2  lr ")
    assert lines[-1] == (
        f"done: 2 epochs, {summary['elapsed_s']:.1f} s, valid_auc {summary['valid_auc']:.4f}, "
        f"valid_logloss {summary['valid_logloss']:.4f}, valid_accuracy "
        f"{summary['valid_accuracy']:.4f}; best epoch {summary['best_epoch']} (valid_auc "
        f"{summary['best_value']:.4f}) at {summary['best_checkpoint']}; checkpoint "
        f"{tmp_path / 'model'} (epoch 2); run {summary['run_dir']}"
    )
    # Chunks are sized by time, metrics lines by angel.log.every.steps, as before.
    rows = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(r) for r in rows if '"kind": "step"' in r]
    assert [s["step"] for s in steps] == [20, 40, 60, 80, 85, 105, 125, 145, 165, 170]
    assert [s["updates"] for s in steps] == [20, 20, 20, 20, 5] * 2


@pytest.mark.usefixtures("ray_local")
def test_a_real_run_off_a_terminal_prints_progress_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("learners.runs.run_log._terminal", lambda: False)
    learner = _learner(tmp_path, **{"angel.log.progress.seconds": 1e-9})  # at every chunk
    try:
        learner.train()
    finally:
        learner.shutdown()
    cap = capsys.readouterr()
    lines = [x for x in cap.out.splitlines() if x.startswith("progress: ")]
    assert lines and lines[-1].startswith("progress: epoch 2/2  100% 170/170 updates [")
    assert all(" samples/s  loss 0." in x and "  lr 0.0" in x for x in lines)
    assert "\r" not in cap.out + cap.err  # no bar drawn
    quiet = _learner(tmp_path, **{"angel.log.progress.seconds": 0, "ml.epoch.num": 1})
    try:
        quiet.train()
    finally:
        quiet.shutdown()
    assert "progress: " not in capsys.readouterr().out


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    "error", [RuntimeError("boom"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
def test_the_bar_is_closed_when_training_stops(tmp_path, monkeypatch, capsys, error):
    monkeypatch.setattr("learners.runs.run_log._terminal", lambda: True)

    def fail(self):
        raise error

    monkeypatch.setattr(TrainingLoop, "validate", fail)  # after the first epoch's updates
    learner = _learner(tmp_path)
    try:
        with pytest.raises(type(error)):
            learner.train()
    finally:
        learner.shutdown()
    err = capsys.readouterr().err
    assert "epoch 1/2" in err  # the bar was drawn
    assert not tqdm._instances  # type: ignore[attr-defined]  # and closed
    assert err.endswith("\r")  # its line cleared: the next message starts on a clean line
