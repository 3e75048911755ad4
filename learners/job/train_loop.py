"""The training loop of a :class:`~learners.job.learner.GraphLearner` (:class:`TrainingLoop`):

    start or join Ray → workers load their data parts → PS tables launched → the rate plan sent
    to the workers → for each epoch:
        workers run updates in chunks (pull, forward, backward, push with lr; see
        learners/worker/train_worker.py) → validate (metrics over all workers' predictions) →
        the schedules after the epoch (ReduceLROnPlateau gets the validation metric) →
        checkpoint → stop early?

The rate plan (learners/job/rate_plan.py) goes to the workers once; each advances it once per
applied optimizer update (never per micro-batch, never for a skipped update) and at each new
epoch; the driver keeps its copy in step from the applied updates the workers report, feeds
ReduceLROnPlateau its metric and then sends the plan again. Each run writes to its own directory
``<angel.log.path>/<job>-<time>`` (:mod:`learners.runs.folders`, :mod:`learners.runs.run_log`);
checkpoints are :mod:`learners.job.saved_model`, the copies kept and a failed write
:mod:`learners.runs.retention`; the progress bar and the chunks of updates that move it
:mod:`learners.runs.progress`; the schedule between epochs :mod:`learners.job.epoch_schedule`;
a worker lost mid-run :mod:`learners.job.failover`. The loop runs on the job's actors
(:class:`learners.job.actors.JobActors`), whose options it reads.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from angelconf.config import Config, ConfigError
from angelps.checkpoint.errors import CheckpointError, NoCheckpoint
from angelps.checkpoint.store import holds_checkpoint
from angelps.client.pending_save import PendingSave
from angelps.file_store import files_for
from decay import StepSizeScheduler
from learners.data.problems import printable
from learners.job import failover, memory_kills, saved_model
from learners.job.actors import JobActors
from learners.job.disk_space import check_log_space, explain
from learners.job.epoch_schedule import schedule_epoch
from learners.job.loop_options import TrainPlan
from learners.job.preflight import check_job, check_resume, lower_is_better, watched_metric
from learners.job.rate_plan import RatePlan, build_rate_plan
from learners.job.save_lock import SaveLock
from learners.models.angel_json import check_saved_graph
from learners.models.config import job_model_info
from learners.runs.folders import (
    drop_unstarted_run,
    log_root,
    new_run_dir,
    relative_under_ray_job,
)
from learners.runs.log_store import run_logs_for
from learners.runs.metrics import reported_names, validation_metrics
from learners.runs.progress import PROGRESS_EVERY, Chunker, merge_chunks, tier_note
from learners.runs.progress import TrainProgress as _Progress
from learners.runs.retention import Checkpoints, CheckpointWriteError, kept_summary
from learners.runs.run_config import log_hparams, write_config
from learners.runs.run_log import (
    RunLog,
    banner,
    done_line,
    epoch_line,
    jsonable,
    start_record,
    step_record,
)
from learners.worker.chunk_stats import StepStats
from learners.worker.group import WorkerDied

__all__ = ["SAVE_KEY", "TrainResult", "TrainingLoop"]

SAVE_KEY = "angel.save.model.path"


@dataclass
class TrainResult:
    """What ``train()`` returns: one dict per epoch and the final summary."""

    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class TrainingLoop:
    """The epochs of a job on its actors: the rate plan, progress, validation, checkpoints,
    restarts after a lost worker and early stopping."""

    def __init__(self, actors: JobActors, quiet: bool = False) -> None:
        """``actors``: the job's (their options are the job's); ``quiet``: no progress lines."""
        self.actors = actors
        self.quiet = quiet
        self.rates: RatePlan | None = None  # the schedules of every update (job's, tables')
        self.sched: StepSizeScheduler | None = None  # (the job's schedule: rates.main)
        self.epoch = 0  # the epoch running, or the last one run
        self.chunker = Chunker(actors.plan.log_every)
        self._unwatched_said = False  # (the watched metric's absence, said once)

    @property
    def conf(self) -> Config:
        return self.actors.conf

    @property
    def plan(self) -> TrainPlan:
        return self.actors.plan

    def train(self, resume: bool = False) -> TrainResult:
        """Train ``ml.epoch.num`` epochs (continuing from ``angel.save.model.path`` if ``resume``)."""
        check_job(self.conf, self.plan, resume)
        check_log_space(str(self.plan.log_dir))  # room for the run and the first backups
        self._run_dir: Path | None = None  # the run's local folder, once made
        try:
            return self._train_locked(resume)
        except BaseException:
            if self._run_dir is not None:
                drop_unstarted_run(self._run_dir)  # (a failure before training: no empty run)
            raise

    def _train_locked(self, resume: bool) -> TrainResult:
        """:meth:`train` under the save path's lock, a full disk said as such."""
        try:
            if not self.plan.save_path:
                return self._train(resume)
            # One writer per save path, for the whole job (a second job is refused: exit 2).
            key = "angel.save.model.path"
            with SaveLock(
                str(self.plan.save_path), str(self.conf["angel.job.name"]), self.conf.source(key)
            ):
                return self._train(resume)
        except CheckpointWriteError:
            raise  # names its path and the last good checkpoint already
        except Exception as e:
            paths = {"angel.log.path": str(self.plan.log_dir)}
            paths["angel.save.model.path"] = str(self.plan.save_path or "")
            full = explain(e, paths, self._resumable())
            if full is None:
                raise
            raise full from e

    def _resumable(self) -> bool:
        """Whether ``--resume`` would find a checkpoint to continue from (for a failure's hint)."""
        path = self.plan.save_path
        try:
            return bool(path) and holds_checkpoint(str(path))
        except Exception:  # (unreadable storage: the hint is no worse than before)
            return True

    def _train(self, resume: bool) -> TrainResult:
        plan, t_start = self.plan, time.perf_counter()
        if resume:
            # Every file checked (a damaged latest falls back to <path>.prev), before any actor.
            with _named("--resume: ", self.conf, SAVE_KEY):
                point = saved_model.resume_point(str(plan.save_path))
            check_resume(point, plan, self.conf)
            check_saved_graph(self.conf, point["learner"], str(plan.save_path), SAVE_KEY)
        elif plan.load_path:
            # (before Ray starts: a missing model said in a second, not after the start-up)
            graph = self.conf.get("ml.model.graph")
            with _named("", self.conf, "angel.load.model.path"):
                try:
                    extra = saved_model.read_extra(str(plan.load_path))
                except CheckpointError:  # (none there, or damaged: said as it is)
                    raise
                except ConfigError:
                    if graph:
                        raise
                    extra = None  # (a checkpoint without a learner: the load says what it lacks)
            if graph and extra is not None:
                check_saved_graph(self.conf, extra["learner"], str(plan.load_path))
        _check_watched_name(self.conf, plan)
        if not resume and not plan.load_path and plan.save_path and not self.quiet:
            note = saved_model.replaced_note(str(plan.save_path), _angel_name(self.conf))
            if note is not None:
                print(printable(note), file=sys.stderr)
        self.actors.start_ray()
        # A log path on object storage: the run is staged locally and copied there (runs.py).
        run_dir = new_run_dir(log_root(plan.log_dir), str(self.conf["angel.job.name"]))
        # (a log path on object storage: its run is staged, and copied there when written)
        local = files_for(str(plan.log_dir)).disk_path(str(plan.log_dir)) is not None
        self._run_dir = run_dir if local else None
        progress_s = PROGRESS_EVERY.read(self.conf)  # plain progress lines off a terminal
        log = RunLog(
            run_dir, self.quiet, plan.tensorboard, progress_s=progress_s, upload_to=plan.log_dir
        )
        note = relative_under_ray_job(
            {"angel.log.path": plan.log_dir, "angel.save.model.path": plan.save_path}
        )
        if note:
            log.warn(note)
        # Failover (learners.job.failover): shard backups under the job's own path; a dead worker
        # restarts the job from its last checkpoint.
        self.actors.ps_options = failover.backup_options(self.actors.ps_options, plan.log_dir)
        if plan.save_model and not plan.save_path:
            # Saved by default, into the run's own folder (angel.save.model=false: not at all).
            # (a log path on object storage: beside the run's copy there, not in its staging)
            home = run_logs_for(plan.log_dir).home(run_dir)
            plan = self.actors.plan = replace(plan, save_path=f"{home}/model")
        # (after the default path: a dead worker restarts from the run folder's checkpoint too;
        # made before it, the failover saw no save path and restarted from the first epoch)
        restarts = failover.WorkerFailover(
            failover.FailoverOptions.from_config(self.conf), plan.save_path
        )
        ckpts = self._checkpoints(log)
        try:
            progress = self.prepare(resume, log)
            if resume and ckpts is not None:
                ckpts.resumed(progress.next_epoch - 1)
            self._open_run(log, run_dir, progress)
            epoch = progress.next_epoch
            while epoch < plan.epochs:
                self.epoch = epoch
                try:
                    row = self.run_epoch(epoch, log, progress)
                    row.update(self.validate())
                    self._schedule_epoch(row)
                    improved = self._track(epoch, row, progress)
                    self._say_unwatched(row, log)
                    row["elapsed_s"] = time.perf_counter() - t_start
                    progress.history.append(row)
                    log.record(row)
                    log.say(epoch_line(row, plan.epochs))
                    if ckpts is not None and self._saves_after(epoch, progress):
                        self._save(ckpts, epoch, progress, improved)
                except WorkerDied as died:
                    # At any moment, the end-of-epoch save included: the job restarts from its
                    # last checkpoint (once the one being written is committed, or not) and
                    # runs the epochs since (and their saves) again.
                    if ckpts is not None:
                        ckpts.wait(lost_worker=True)
                    progress = restarts.restart(self, died, log, progress)
                    if ckpts is not None and progress.next_epoch > 0:
                        ckpts.resumed(progress.next_epoch - 1)
                    epoch = progress.next_epoch
                    continue
                if self.early_stop(progress, log):
                    break
                epoch += 1
            if ckpts is not None:
                ckpts.wait()  # the last checkpoint committed before the summary names it
            log.close_bar()
            summary = self._summary(progress, time.perf_counter() - t_start, run_dir, ckpts)
            if log.tb is not None:
                log_hparams(log.tb, self.conf, summary)
            log.write_summary(summary)
            log.say(done_line(summary))
            return TrainResult(history=progress.history, summary=jsonable(summary))
        except Exception as e:
            # (a failure with no worker death to restart for, e.g. a shard that Ray restarted
            # until its restarts ran out: said as the memory's where Ray killed for it)
            oom = memory_kills.explained(
                e, restarts.since_ms, failover.names(self.actors), plan.save_path
            )
            if oom is None:
                raise
            # (its workers are not asked anything again: some of the job's processes are gone,
            # and save() says that the failure stopped them rather than fail on a dead one)
            failover.kill_workers(self.actors)
            raise oom from e
        finally:
            if ckpts is not None and ckpts.writing:  # (an error: its files may all be written)
                ckpts.abandon()
            log.close()  # the progress bar too: on Ctrl-C and on errors as well

    def _save(self, ckpts: Checkpoints, epoch: int, progress: _Progress, improved: bool) -> None:
        """The end-of-epoch save (in the background: angel.save.model.async); a worker lost
        during it is a WorkerDied that says so (a lost worker is not a failed write: the epoch
        is run again, then saved)."""
        ckpts.wait()  # the one before, written in the background (its errors name its epoch)
        try:
            # In the background only when training goes on: the job's last checkpoint is
            # waited for at once (a copy would only add its time and memory).
            if self.plan.save_async and not self._ends_after(epoch, progress):
                start = partial(self.checkpoint, epoch=epoch, progress=progress, background=True)
                ckpts.save_async(start, epoch, improved)
            else:
                ckpts.save(
                    partial(self.checkpoint, epoch=epoch, progress=progress), epoch, improved
                )
        except failover.WorkerDied as died:
            why = f"{died.reason}, while the checkpoint of epoch {epoch + 1} was written"
            raise failover.WorkerDied(died.index, why) from died

    def _checkpoints(self, log: RunLog) -> Checkpoints | None:
        """The job's checkpoints (angel.save.model.*), None without a save path."""
        p = self.plan
        if not p.save_path:
            return None
        return Checkpoints(p.save_path, p.keep_last, p.keep_best, p.save_failure, warn=log.warn)

    def _open_run(self, log: RunLog, run_dir: Path, progress: _Progress) -> None:
        """The run's first record (what the plot's title says), its keys for TensorBoard, and
        the whole-job progress bar."""
        assert self.actors.size is not None
        plan, conf, updates = self.plan, self.conf, self.actors.size.updates_per_epoch
        log.record(
            start_record(
                run_dir.name, conf, plan, self.actors.size, _angel_name(conf), progress.next_epoch
            )
            | {"task": self.actors.model_task(), "watch": self.watch_metric()}
        )
        log.config_text(conf)
        write_config(run_dir, conf)  # every key, its value and where it came from
        log.bar(updates * plan.epochs, updates * progress.next_epoch, plan.epochs, updates)

    def prepare(self, resume: bool, log: RunLog) -> _Progress:
        """Workers, PS and scheduler up; the checkpoint or saved weights loaded; the banner."""
        plan = self.plan
        workers = self.actors.start_workers()
        assert self.actors.size is not None and self.actors.ps is not None
        dense_params = int(workers.execute_single(0, "dense_param_count"))
        self.rates = build_rate_plan(
            self.conf, plan, self.actors.size, self.actors.tables, dense_params
        )
        self.sched = self.rates.main
        progress = _Progress()
        if resume:
            info = saved_model.restore(
                str(plan.save_path), self.actors.ps, workers, self.actors.held()
            )
            self.rates.load_state_dict(info["scheduler"])
            progress.next_epoch = int(info["next_epoch"])
            progress.history = list(info["history"])
            progress.best, progress.since_best = info["best"], int(info["since_best"])
            progress.best_epoch = info.get("best_epoch", progress.epoch_of_best())
        elif plan.load_path:
            saved_model.restore(plan.load_path, self.actors.ps, workers, self.actors.held())
        workers.execute("set_rates", self.rates)  # once: each worker keeps it in step itself
        log.say(
            banner(
                self.conf,
                self.plan,
                self.actors.ps_options,
                self.actors.size,
                self.actors.tables,
                _angel_name(self.conf),
                dense_params,
                self.rates,
                self.actors.placed.where() if self.actors.placed is not None else None,
            )
        )
        if resume:
            said, *warnings = _resume_lines(self.conf, plan, info, progress.next_epoch)
            log.say(said)
            for line in warnings:
                log.warn(line)
        return progress

    def run_epoch(self, epoch: int, log: RunLog, progress: _Progress) -> dict[str, Any]:
        """One epoch of updates, in chunks of about a quarter second (so that the bar moves),
        one metrics line per ``angel.log.every.steps`` updates: its training record."""
        workers, size = self.actors.workers, self.actors.size
        assert workers is not None and size is not None and self.rates is not None
        plan, updates = self.plan, size.updates_per_epoch
        self.rates.start_epoch(epoch)
        workers.execute("begin_epoch", epoch)  # (each worker moves its own plan to the epoch)
        done, loss_sum, samples, skipped = 0, 0.0, 0, 0
        line: list[StepStats] | None = None  # the chunks since the last metrics line
        last_lr = float(self.rates.peek())
        t_epoch = time.perf_counter()
        while done < updates:
            n = self.chunker.next(done, updates)
            # Another chunk follows (of this epoch or the next): the workers fetch its
            # first batch's rows with this chunk's last push (one round trip, not two).
            end = done + n >= updates
            more = not end or epoch + 1 < plan.epochs
            t0 = time.perf_counter()
            outs: list[StepStats] = workers.execute(
                "run_steps", n, None, more, epoch + 1 if end else None
            )
            seconds = time.perf_counter() - t0
            self.chunker.observe(n, seconds)
            done += n
            chunk_samples = sum(o.samples for o in outs)
            loss_sum += sum(o.loss_sum for o in outs)
            samples += chunk_samples
            skipped += outs[0].skipped
            if outs[0].updates:
                last_lr = outs[0].last_lr
            self.rates.advance(outs[0].updates)  # (applied ones: every worker applies the same)
            line = merge_chunks(line, outs)
            if done % plan.log_every == 0 or done == updates:
                n_line = (done - 1) % plan.log_every + 1
                log.record(step_record(epoch, epoch * updates + done, n_line, line))
                line = None
            if log.progress is not None:
                log.progress.update(
                    n, chunk_samples, seconds, loss_sum / max(samples, 1), last_lr, tier_note(outs)
                )
        train_s = time.perf_counter() - t_epoch
        progress.samples += samples
        progress.train_s += train_s
        return {
            "kind": "epoch",
            "epoch": epoch,
            # the global update at the end of the epoch: the x of its metrics in plots and TB
            "step": (epoch + 1) * updates,
            # the step size of the epoch's last update
            "lr": last_lr,
            "train_loss": loss_sum / max(samples, 1),
            "train_samples_per_s": samples / max(train_s, 1e-9),
            "skipped_updates": skipped,
        }

    def _schedule_epoch(self, row: Mapping[str, Any]) -> None:
        """The schedules after an epoch (learners/job/epoch_schedule.py); a metric-driven one
        (ReduceLROnPlateau) changed the plan in a way the workers cannot count: they get it."""
        assert self.rates is not None and self.actors.workers is not None
        if schedule_epoch(self.rates, self.plan, row, self.watch_metric()):
            self.actors.workers.execute("set_rates", self.rates)

    def _track(self, epoch: int, row: Mapping[str, Any], progress: _Progress) -> bool:
        """Early stopping's count: epochs since the watched metric last improved; True when
        this epoch is the best so far."""
        metric_name = self.watch_metric()
        return progress.watch(epoch, row.get(metric_name), lower_is_better(metric_name))

    def _say_unwatched(self, row: Mapping[str, Any], log: RunLog) -> None:
        """Once a job: the watched metric is missing from a validated epoch (an AUC of one
        class only is undefined): no best epoch is kept, and early stopping never acts."""
        name = self.watch_metric()
        if self._unwatched_said or not row.get("valid_rows"):
            return
        if row.get(name) is not None:
            return
        self._unwatched_said = True
        why = (
            "the validation rows hold one class only, where the AUC is undefined"
            if name == "valid_auc"
            else "this job's validation does not report it"
        )
        log.warn(
            f"angelps: warning: {name} (ml.early.stop.metric) is not reported ({why}): no best "
            "epoch is kept and early stopping does not act; check the labels, or watch another "
            "metric (valid_logloss)"
        )

    def _stops(self, progress: _Progress) -> bool:
        patience = self.plan.early_stop_patience
        return patience > 0 and progress.since_best >= patience

    def _saves_after(self, epoch: int, progress: _Progress) -> bool:
        """Whether the checkpoint is written after ``epoch`` (0-based): every
        angel.save.model.every.howmany.epochs-th epoch, the last and one an early stop ends."""
        return (epoch + 1) % self.plan.save_every == 0 or self._ends_after(epoch, progress)

    def _ends_after(self, epoch: int, progress: _Progress) -> bool:
        """Whether training ends after ``epoch`` (0-based): the last, or an early stop."""
        return epoch + 1 >= self.plan.epochs or self._stops(progress)

    def early_stop(self, progress: _Progress, log: RunLog) -> bool:
        """True when the watched metric has not improved for ``ml.early.stop.patience`` epochs."""
        metric_name = self.watch_metric()
        if self._stops(progress):
            log.say(
                f"early stop: {metric_name} has not improved for {progress.since_best} epochs "
                f"(best {progress.best:.6g})"
            )
            progress.stopped_early = True
            return True
        return False

    def _summary(
        self, progress: _Progress, elapsed_s: float, run_dir: Path, ckpts: Checkpoints | None
    ) -> dict[str, Any]:
        assert self.actors.size is not None
        plan, size = self.plan, self.actors.size
        last = progress.history[-1] if progress.history else {}
        summary = {
            "model": _angel_name(self.conf),
            "epochs": len(progress.history),
            "workers": plan.workers,
            "global_batch": size.batch_size * plan.workers * plan.accum,
            "updates_per_epoch": size.updates_per_epoch,
            **{k: v for k, v in last.items() if k.startswith("valid_")},
            "train_loss": last.get("train_loss"),
            "train_samples_per_s": progress.samples / max(progress.train_s, 1e-9),
            "elapsed_s": elapsed_s,
            "stopped_early": progress.stopped_early,
            "skipped_lines": size.skipped_lines,
            "skipped_first": size.skipped_first,
            "run_dir": str(run_dir),
            **kept_summary(ckpts, progress.best_epoch, self.watch_metric(), progress.best),
        }
        for k in ("valid_auc", "valid_logloss", "valid_accuracy"):
            summary.setdefault(k, None)
        return summary

    def watch_metric(self) -> str:
        return watched_metric(self.plan, self.actors.model_task())

    # --- validation and checkpoints --------------------------------------------------------------

    def validate(self) -> dict[str, Any]:
        """Validation metrics over every worker's validation part ({} when there is none)."""
        assert self.actors.workers is not None
        outs = self.actors.workers.execute("validate")
        if sum(o["rows"] for o in outs) == 0:
            return {}
        return jsonable(validation_metrics(self.actors.model_task(), outs))

    def checkpoint(
        self, path: str, epoch: int, progress: _Progress, background: bool = False
    ) -> PendingSave | None:
        """Save the PS tables and the workers' state, resumable after ``epoch``;
        ``background``: return once the rows are copied, the files being written meanwhile
        (the result commits them)."""
        assert self.actors.ps is not None and self.actors.workers is not None
        assert self.actors.size is not None
        conf = self.conf
        section = {
            "epoch": epoch,
            "next_epoch": epoch + 1,
            "scheduler": self.rates.state_dict() if self.rates is not None else None,
            "dense_placement": self.plan.dense_placement,
            "conf": {k: v for k, v in conf.to_properties().items() if conf.is_set(k)},
            "history": jsonable(progress.history),
            "best": progress.best,
            "best_epoch": progress.best_epoch,
            "since_best": progress.since_best,
            "model": _angel_name(conf),
            "num_features": self.actors.size.num_features,
            "num_fields": self.actors.size.num_fields,
            "tables": [t.to_dict() for t in self.actors.tables],
            # Shuffling is a pure function of (ml.seed, epoch): the data position is the epoch.
            "data_position": {"epoch": epoch + 1, "row": 0},
        }
        return saved_model.save(
            path, self.actors.ps, self.actors.workers, section, self.actors.held(), background
        )


def _check_watched_name(conf: Config, plan: TrainPlan) -> None:
    """ConfigError for an ``ml.early.stop.metric`` the model does not report, before anything
    starts: it was found only by early stopping or a plateau after an epoch, and with neither
    (the default) the best checkpoint was kept by nothing, silently."""
    key = "ml.early.stop.metric"
    if not conf.is_set(key):
        return
    task = job_model_info(conf).task
    name, names = watched_metric(plan, task), reported_names(task)
    if name not in names:
        raise ConfigError(
            f"{key}={plan.early_stop_metric} ({conf.source(key)}): this model reports no "
            f"{name}; valid names: {', '.join(names)}"
        )


def _resume_lines(
    conf: Config, plan: TrainPlan, info: Mapping[str, Any], next_epoch: int
) -> list[str]:
    """The banner's line of a resumed job (where from, the epochs left), and a warning for each
    data path that is not the one the checkpoint trained on: the epochs left read other data,
    and the best epoch is then chosen across different validation sets."""
    lines = [
        f"  resume   {plan.save_path} after epoch {next_epoch}: epochs {next_epoch + 1}.."
        f"{plan.epochs} left of {plan.epochs}"
    ]
    saved = dict(info.get("conf") or {})
    for key in ("angel.train.data.path", "angel.validate.data.path"):
        now, was = conf[key], saved.get(key)
        if now and was and not _same_path(str(was), str(now)):
            lines.append(
                f"angelps: warning: {key}={now} ({conf.source(key)}) is not the data the "
                f"checkpoint trained on ({was}): the epochs left read other data, and the best "
                "epoch is chosen across both"
            )
    return lines


def _same_path(a: str, b: str) -> bool:
    """Whether two data paths name the same input (a local one relative or not; one inside
    the copy of the working directory Ray made for a submitted job by its place in it)."""
    if a == b:
        return True
    da, db = files_for(a).disk_path(a), files_for(b).disk_path(b)  # (None: object storage)
    if da is None or db is None:
        return False
    return _in_job_dir(os.path.abspath(da)) == _in_job_dir(os.path.abspath(db))


def _in_job_dir(path: str) -> str:
    """``path`` relative to the working directory of its job: to Ray's copy of it for a
    submitted job (``.../_ray_pkg_<hash>/data/x``: ``data/x``), else to this one's."""
    _, sep, tail = path.partition("/_ray_pkg_")
    if sep:
        return tail.partition("/")[2]
    return os.path.relpath(path)


def _angel_name(conf: Mapping[str, Any]) -> str:
    """The model's Angel class name, whatever spelling ``ml.model.class.name`` used."""
    return job_model_info(conf).angel_name


@contextmanager
def _named(what: str, conf: Config, key: str) -> Iterator[None]:
    """A missing checkpoint said with the key that pointed at it, its value and its source
    (``what``: how the job read it)."""
    try:
        yield
    except NoCheckpoint as e:
        source = conf.source(key) if conf.is_set(key) else "default"
        raise NoCheckpoint(f"{what}{key}={conf[key]} ({source}): {e}") from None
