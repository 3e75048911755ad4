"""Checks of a training job that need more than one key, made before any actor starts.

A single key's type and range are checked when the configuration is loaded
(:mod:`angelconf.config`); what depends on several keys, on the model class or on the file
system is checked here, so that a job that cannot run fails in a second with one line naming
the keys, not minutes later inside a worker.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from angelconf.config import Config, ConfigError
from angelps import TableSpec
from angelps.checkpoint import store as checkpoint_store
from angelps.checkpoint.errors import CheckpointError
from angelps.file_store import files_for
from decay import ReduceLROnPlateau
from decay.keys import LR_KEY, PREFIX
from learners.angel_keys import check_output_policy
from learners.job.job_options import JobOptions
from learners.job.loop_options import TrainPlan
from learners.job.optimizer_use import unused_optimizer_keys
from learners.job.paths import PATH_KEYS, cannot_write, check_url
from learners.job.rate_plan import check_rates_early
from learners.job.sparse_keys import unused_placement_keys
from learners.models.config import job_model_info, unused_model_keys
from learners.models.table_decl import table_specs
from learners.models.tables import model_tables
from learners.runs.log_store import run_logs_for

__all__ = [
    "check_job",
    "check_rates",
    "check_resume",
    "check_save_path",
    "lower_is_better",
    "tables_up_front",
    "watched_metric",
]

_LOWER_IS_BETTER = ("loss", "logloss", "mse", "rmse", "mae")
#: The dtype of every parameter table a learner creates (TableSpec's default).
_TABLE_DTYPE = str(TableSpec.__dataclass_fields__["dtype"].default)
#: The schedule keys (top level and every child) that are absolute step sizes.
_RATE_SUFFIXES = (".eta.min", ".base.lr", ".max.lr", ".min.lr")

_PLATEAU_MODE = inspect.signature(ReduceLROnPlateau).parameters["mode"].default


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of ``metric`` (``valid_auc``, ``valid_loss``...) is better."""
    return metric.endswith(_LOWER_IS_BETTER)


def watched_metric(plan: TrainPlan, task: str) -> str:
    """The validation metric that early stopping and ReduceLROnPlateau follow
    (``ml.early.stop.metric``; ``auto``: AUC, accuracy or RMSE by the model's task)."""
    name = plan.early_stop_metric.lower()
    if name != "auto":
        return name if name.startswith("valid_") else f"valid_{name}"
    return {"binary": "valid_auc", "multiclass": "valid_accuracy"}.get(task, "valid_rmse")


#: The unused keys said in this process (:func:`check_job`).
_SAID: set[str] = set()


def check_job(conf: Config, plan: TrainPlan, resume: bool) -> None:
    """Raise ConfigError for a job that cannot train: no data, an unknown model or one that
    lacks its field count, --resume without a checkpoint path, a save path that a checkpoint
    must not replace (:func:`check_save_path`), a plateau facing the wrong way."""
    train_path = conf["angel.train.data.path"]
    if not train_path:
        raise ConfigError(
            "angel.train.data.path is not set: expected the path of the training data (in the "
            "job file, --conf FILE, or on the command line: --angel.train.data.path PATH)"
        )
    # Object storage first: one bounded check per URL, before anything is written or started.
    urls = {k for k in PATH_KEYS if "predict" not in k and check_url(conf, k)}
    if "angel.train.data.path" not in urls and not Path(str(train_path)).exists():
        raise ConfigError(
            f"angel.train.data.path={train_path} "
            f"({conf.source('angel.train.data.path')}) does not exist"
        )
    cls = job_model_info(conf)  # unknown names fail here, first
    for unused in [
        *unused_model_keys(conf),
        *unused_optimizer_keys(conf),
        *unused_placement_keys(conf),
    ]:
        # (once a process: the command line checks the job, then training checks it again)
        if unused not in _SAID:
            _SAID.add(unused)
            warnings.warn(f"angelps: {unused}", UserWarning, stacklevel=2)
    if cls.needs_fields and int(conf["ml.fm.field.num"]) < 1:
        raise ConfigError(
            f"{cls.angel_name} needs ml.fm.field.num (the number of fields, one id per field "
            "in every sample; census: 13)"
        )
    if resume and not plan.save_path:
        raise ConfigError("--resume needs angel.save.model.path (the checkpoint directory)")
    if plan.save_path:
        check_save_path(
            plan.save_path,
            plan.log_dir,
            conf.source("angel.save.model.path"),
            str(conf["angel.ps.backup.path"] or ""),
        )
        if not resume:
            check_output_policy(conf, "angel.save.model.path")
    _check_log_path(conf, plan.log_dir)
    check_rates(conf)
    _check_plateau(conf, watched_metric(plan, cls.task))
    _check_kept(conf, plan)
    check_rates_early(conf)  # per-table keys, momentum cycles (learners/job/rate_plan.py)


def check_save_path(save_path: str, log_dir: str, source: str = "", backup_path: str = "") -> None:
    """Refuse a checkpoint path whose replacement would lose files: the current directory or
    one that contains it, the log directory (``angel.log.path``) or one that contains it, a
    folder the job itself writes (``<log>/ps-backup``, ``angel.ps.backup.path``, ``<log>/latest``)
    or one inside it, a regular file, a non-empty directory of other files (no angelps
    manifest.json); and one whose parent cannot be created or written. ConfigError naming the
    key, path and reason."""
    where = f"angel.save.model.path={save_path}" + (f" ({source})" if source else "")
    disk = files_for(save_path).disk_path(save_path)
    if disk is None:  # object storage: reachable (check_url); only its content is checked here
        try:
            checkpoint_store.check_target(save_path)
        except (CheckpointError, OSError) as e:
            raise ConfigError(f"{where}: {e}") from None
        return
    path = Path(os.path.realpath(disk))
    for name, other in (("the current directory", "."), ("the log directory", log_dir)):
        o = Path(os.path.realpath(other))
        if path == o or path in o.parents:
            what = "is" if path == o else "contains"
            shown = "" if other == "." else f" (angel.log.path={other})"
            raise ConfigError(
                f"{where} {what} {name}{shown}: a checkpoint replaces its directory; "
                "choose a directory of its own"
            )
    _check_own_folders(path, where, log_dir, backup_path)
    try:
        checkpoint_store.check_target(str(path))
    except CheckpointError as e:
        raise ConfigError(f"{where}: {e}") from None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{where}: {parent} is a file, so the directory cannot be created")
    why = cannot_write(parent)
    if why is not None:
        raise ConfigError(f"{where}: cannot write there ({why}); choose a folder you can write to")


def _check_log_path(conf: Config, log_dir: str) -> None:
    """``angel.log.path`` on a disk must be a folder that can be written (or made): a file
    there, or a place that refuses writes, failed after Ray had started. So must a local
    ``angel.ps.backup.path`` when backups are on (it failed after Ray started, with a bare OS
    error naming no key)."""
    _check_folder(conf, "angel.log.path", log_dir, "the folder of the job's runs")
    if int(conf["angel.ps.backup.interval"]) > 0:
        backups = str(conf["angel.ps.backup.path"] or "")
        _check_folder(conf, "angel.ps.backup.path", backups, "the folder of the shard backups")


def _check_folder(conf: Config, key: str, folder: str, what: str) -> None:
    """ConfigError naming ``key`` when ``folder`` (a local path; empty or a URL: nothing to
    check here) is a file, or files cannot be written in it or in folders made under it."""
    disk = files_for(folder).disk_path(folder) if folder else None
    if disk is None:
        return  # (unset, or object storage: check_url reached it)
    where = f"{key}={folder}" + (f" ({conf.source(key)})" if conf.is_set(key) else "")
    if disk.exists() and not disk.is_dir():
        raise ConfigError(f"{where} is a file: expected {what}")
    why = cannot_write(disk)
    if why is not None:
        raise ConfigError(f"{where}: cannot write there ({why}); choose a folder you can write to")


def _check_own_folders(path: Path, where: str, log_dir: str, backup_path: str) -> None:
    """Refuse a save path equal to or inside a folder the job writes and removes by itself:
    its shard backups (``<log>/ps-backup`` or ``angel.ps.backup.path``) and ``<log>/latest``
    (a run's pointer)."""
    own = run_logs_for(log_dir).own_folders()
    if backup_path and files_for(backup_path).disk_path(backup_path) is not None:
        own.append((backup_path, f"the shard backups' folder (angel.ps.backup.path={backup_path})"))
    for folder, what in own:
        o = Path(os.path.realpath(folder))
        if path == o or o in path.parents:
            raise ConfigError(
                f"{where} is {'' if path == o else 'inside '}{what}, which the job writes and "
                "removes by itself: choose a directory of its own"
            )


def check_rates(conf: Config) -> None:
    """ConfigError for a step size (``ml.learn.rate``, a schedule's ``eta.min``, ``base.lr``,
    ``max.lr``, ``min.lr``) that is finite as a double but not in the tables' dtype (float32:
    1e39 would be inf there, and training would end with NaNs naming no key)."""
    dtype = np.dtype(_TABLE_DTYPE)
    largest = float(np.finfo(dtype).max)
    for key in conf:
        if not (key == LR_KEY or (key.startswith(PREFIX) and key.endswith(_RATE_SUFFIXES))):
            continue
        value = conf[key]
        if conf.is_set(key) and isinstance(value, float) and abs(value) > largest:
            raise ConfigError(
                f"{key}={conf.to_properties().get(key, value)} ({conf.source(key)}) is infinite "
                f"in {dtype} (the dtype of the parameter tables, largest {largest:.7g}): "
                "expected a step size that it holds"
            )


def _check_kept(conf: Config, plan: TrainPlan) -> None:
    """Keeping checkpoints needs a save path (a URL: a prefix inside its bucket, as the copies
    are its siblings); keeping the best one needs validation data."""
    for key, asked in (
        ("angel.save.model.keep.last", plan.keep_last > 1),
        ("angel.save.model.keep.best", plan.keep_best),
    ):
        if asked and not plan.save_model and conf.is_set(key):
            raise ConfigError(
                f"{key}={str(conf[key]).lower()} ({conf.source(key)}) keeps checkpoints, but "
                f"angel.save.model=false ({conf.source('angel.save.model')}): drop one of them"
            )
        save = str(plan.save_path or "")
        if asked and save and files_for(save).parent(save) is None:
            # The copies are siblings (<path>.best): beside a bucket they would be other buckets.
            raise ConfigError(
                f"{key}={str(conf[key]).lower()} ({conf.source(key)}) keeps copies beside the "
                f"checkpoint (<path>.best, <path>.epoch-<n>), so angel.save.model.path="
                f"{plan.save_path} ({conf.source('angel.save.model.path')}) must name a prefix "
                "inside the bucket, not the bucket itself"
            )
    if (
        plan.keep_best
        and conf.is_set("angel.save.model.keep.best")
        and (not conf["angel.validate.data.path"])
    ):
        if float(conf["ml.data.validate.ratio"]) <= 0:
            raise ConfigError(
                "angel.save.model.keep.best=true needs a validation metric: set "
                "ml.data.validate.ratio > 0 or angel.validate.data.path"
            )


def _check_plateau(conf: Config, metric: str) -> None:
    """The plateau's mode must match the direction of the metric it is fed."""
    if str(conf["ml.opt.decay.class.name"]).lower() != "reducelronplateau":
        return
    want = "min" if lower_is_better(metric) else "max"
    # Unset, the mode is ReduceLROnPlateau's own default (the key is shared with CyclicLR).
    mode = str(conf["ml.opt.decay.mode"] or _PLATEAU_MODE).lower()
    if mode != want:
        raise ConfigError(
            f"ReduceLROnPlateau is fed {metric} (ml.early.stop.metric), where "
            f"{'lower' if want == 'min' else 'higher'} is better, but "
            f"ml.opt.decay.mode={mode}: set ml.opt.decay.mode={want}"
        )


def check_resume(extra: Mapping[str, Any], plan: TrainPlan, conf: Config | None = None) -> None:
    """ConfigError when the checkpoint holds another model than the job's (``conf``), or has
    already trained ``ml.epoch.num`` epochs or more."""
    saved = extra["learner"].get("model")
    if conf is not None and saved:
        mine = job_model_info(conf).angel_name  # (as the checkpoint records it)
        if str(saved).lower() != mine.lower():
            key = "ml.model.class.name"
            raise ConfigError(
                f"--resume: the checkpoint in {plan.save_path} holds a {saved} model, but "
                f"{key}={conf[key]} ({conf.source(key)}): resume with the job that wrote it, or "
                "train this one afresh (without --resume) into another angel.save.model.path"
            )
    done = int(extra["learner"].get("next_epoch", 0))
    if plan.epochs <= done:
        raise ConfigError(
            f"--resume: the checkpoint in {plan.save_path} has trained {done} epoch(s) and "
            f"ml.epoch.num={plan.epochs}, so there is nothing left to train; ml.epoch.num is the "
            f"total number of epochs: set it above {done} to train more"
        )


def tables_up_front(conf: Config, options: JobOptions) -> list[TableSpec] | None:
    """The PS tables when the configuration alone sizes them (``ml.feature.index.range`` set,
    ``ml.fm.field.num`` too for a model with fields, dense layers on the workers), so that the
    shards start with the workers; None when the workers' data must be read first."""
    data = options.data
    if data.index_range <= 0 or options.loop.dense_placement != "worker":
        return None
    fields = data.field_num if data.field_num > 0 else None
    if job_model_info(conf).needs_fields and fields is None:
        return None
    try:  # learners.models.tables: the tables without building the model (and without torch)
        tables = model_tables(options.model.sized(data.index_range, fields))
    except ConfigError:
        return None  # the workers' own build reports it
    return table_specs(conf, tables)
