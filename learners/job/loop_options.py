"""The training loop's configuration keys and :class:`TrainPlan`, the settings built from them.

A key module: it imports only the standard library and ``angelconf.config``, so the command line's
config-only verbs (``angelps conf``, ``angelps schedule``) list and check these keys without
loading torch or Ray.

:class:`TrainPlan` is built once from the job configuration (:meth:`TrainPlan.from_config`) at
the learner's entry point, as the loop section of ``learners.job.job_options.JobOptions``; the
driver's loop and every worker read it, and it crosses Ray as a frozen dataclass (never a dict of
string keys). Every default lives in its ``Key`` below, none in
the dataclass. :class:`JobSize` holds what is known only once the workers have read their data
(feature range, batch size, updates per epoch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from angelconf.config import Config, Key, at_least, non_negative, positive
from angelconf.options import key_field, keyed, read_keys
from learners.job.save_keys import SAVE_MODEL, keep_best
from learners.job.sparse_keys import SparseOptions
from learners.worker.feed import FeedOptions

__all__ = ["KEYS", "TrainPlan"]

EPOCHS = Key("ml.epoch.num", "int", 30, "Training epochs (Angel's default 30).", check=at_least(1))
MINIBATCH_SIZE = Key(
    "ml.minibatch.size",
    "int",
    128,
    "Rows per mini-batch on each worker (the global batch is this × workers × "
    "ml.grad.accum.steps); also the chunk size of prediction.",
    check=positive,
)
UPDATES_PER_EPOCH = Key(
    "ml.num.update.per.epoch",
    "int",
    10,
    "Angel's way to size batches: when set explicitly, each worker's batch is "
    "ceil(local rows / (this × ml.grad.accum.steps)) and ml.minibatch.size only sizes prediction.",
    check=positive,
)
WORKERS = Key("angel.workergroup.number", "int", 1, "Number of training workers.", check=positive)
STREAM = Key(
    "ml.data.stream",
    "bool",
    False,
    "Read the training rows from disk during every epoch, one ml.data.chunk.rows chunk at "
    "a time (inputs larger than memory; shuffling within a chunk); false: hold them in memory.",
)
WORKER_CPUS = Key(
    "angel.worker.cpus",
    "float",
    1.0,
    "CPUs Ray reserves for each worker actor.",
    check=positive,
)
TORCH_THREADS = Key(
    "angel.worker.torch.threads",
    "int",
    1,
    "torch intra-op threads per worker: one is fastest for small models (LR, FM); give "
    "MLP models (DeepFM, DNN) as many as angel.worker.cpus (docs/benchmarks-train.md).",
    check=positive,
)
DEVICE = Key(
    "angel.worker.device",
    "str",
    "cpu",
    "Where workers compute: cpu, or cuda (one GPU per worker; needs ml.amp for mixed precision).",
    choices=("cpu", "cuda"),
)
WORKER_GPUS = Key(
    "angel.worker.gpus",
    "float",
    0.0,
    "GPUs Ray reserves for each worker actor (fractions share a device with other workers "
    "or shards); > 0 makes the workers compute on CUDA, as angel.worker.device=cuda does.",
    check=non_negative,
)
RAY_CONNECT_TIMEOUT = Key(
    "angel.ray.connect.timeout.s",
    "float",
    30.0,
    "Seconds to wait for the Ray cluster of --address or RAY_ADDRESS to accept a connection "
    "before failing with an error naming the address (docs/cluster.md).",
    check=positive,
)


#: Resources with keys of their own (angel.*.cpus, .gpus, angel.ps.memory).
_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def parse_resources(text: str | None) -> dict[str, float]:
    """``"ps:1,ssd:0.5"`` → ``{"ps": 1.0, "ssd": 0.5}`` (Ray custom resources); ValueError
    saying what is wrong."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, amount = (x.strip() for x in item.partition(":"))
        if not sep or not name:
            raise ValueError(f"{item.strip()!r} is not NAME:AMOUNT")
        if name in _BUILTIN_RESOURCES:
            raise ValueError(f"{name} has a key of its own (angel.*.cpus, .gpus, angel.ps.memory)")
        try:
            value = float(amount)
        except ValueError:
            raise ValueError(f"{name}: {amount!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: the amount must be a number > 0")
        if name in out:
            raise ValueError(f"{name} is named twice")
        out[name] = value
    return out


def _resources_check(value: str) -> str | None:
    try:
        parse_resources(value)
    except ValueError as e:
        return (
            "Ray custom resources as NAME:AMOUNT pairs separated by commas, such as ps:1 "
            f"(named by `ray start --resources`); {e}"
        )
    return None


PS_RESOURCES = Key(
    "angel.ps.resources",
    "str",
    "",
    "Ray custom resources each shard asks for, NAME:AMOUNT[,NAME:AMOUNT...] (e.g. ps:1): "
    "shards go only to nodes started with them (ray start --resources '{\"ps\": 4}').",
    check=_resources_check,
)
WORKER_RESOURCES = Key(
    "angel.worker.resources",
    "str",
    "",
    "Ray custom resources each worker asks for, NAME:AMOUNT[,...] (e.g. worker:1): workers go "
    "only to nodes started with them.",
    check=_resources_check,
)
PLACEMENT = Key(
    "angel.placement.strategy",
    "str",
    "none",
    "How shards and workers are laid out over the nodes: none (each actor where Ray finds "
    "room), pack (one Ray placement group, as few nodes as possible) or spread (one placement "
    "group, as many nodes as possible).",
    choices=("none", "pack", "spread"),
)
FUSED = Key(
    "angel.worker.fused.push.pull",
    "bool",
    True,
    "Send each update's push together with the next batch's pull (one call per shard per "
    "step); false: a push, then a pull.",
)
DENSE_PLACEMENT = Key(
    "angel.dense.placement",
    "str",
    "worker",
    "Where dense (MLP) layers live: worker (replicated, gradients all-reduced over gloo, or "
    "NCCL between CUDA workers with a whole GPU each) or "
    "ps (one PS table per parameter, pulled and pushed every step, as Angel).",
    choices=("worker", "ps"),
)
LOG_PATH = Key(
    "angel.log.path",
    "str",
    "",
    "Root of the runs: each run writes metrics.jsonl, summary.json (and TensorBoard events) to "
    "its own directory <this>/<angel.job.name>-<yyyymmdd-hhmmss>; <this>/latest names the "
    "newest. Empty: runs. Use an absolute path under ray job submit.",
)
TENSORBOARD = Key(
    "angel.log.tensorboard",
    "bool",
    False,
    "Also write TensorBoard event files (train/* and valid/* on the global update, the job's "
    "keys as text) next to metrics.jsonl; "
    "needs the tensorboard package (pip install 'angelps[tensorboard]').",
)
LOG_EVERY = Key(
    "angel.log.every.steps",
    "int",
    50,
    "Updates per progress/metrics record (one JSON step line aggregates this many updates).",
    check=positive,
)
SAVE_PATH = Key(
    "angel.save.model.path",
    "str",
    None,
    "Checkpoint directory, written after every epoch (angel.save.model.every.howmany.epochs: "
    "every N-th) with the PS tables and their optimizer state, worker-side layers, scheduler "
    "state, epoch, RNG; --resume continues from it.",
)
SAVE_EVERY = Key(
    "angel.save.model.every.howmany.epochs",
    "int",
    1,
    "Write the checkpoint after every N-th epoch only (and after the last one, or the one an "
    "early stop ends at): for short epochs whose save costs about what their training does "
    "(a GPU's). Angel's key. A lost worker restarts the job from the last one written (up to "
    "N-1 epochs trained again), and angel.save.model.keep.best keeps the best of the epochs "
    "written.",
    check=positive,
)
LOAD_PATH = Key(
    "angel.load.model.path",
    "str",
    None,
    "A saved model to start training from (weights and optimizer state; the epoch count "
    "and schedule start afresh, as Angel's inctrain).",
)
KEEP_LAST = Key(
    "angel.save.model.keep.last",
    "int",
    1,
    "Checkpoints of the last N epochs to keep: N > 1 also keeps each epoch's as "
    "<angel.save.model.path>.epoch-<n> (hard links on a disk; copies on object storage); 1: only the "
    "latest at angel.save.model.path (and the one before it, <path>.prev).",
    check=positive,
)
KEEP_BEST = Key(
    "angel.save.model.keep.best",
    "bool",
    None,
    "Also keep the checkpoint of the best epoch by ml.early.stop.metric at "
    "<checkpoint>.best (needs validation data). Unset: true when the job has validation "
    "data (ml.data.validate.ratio > 0 or angel.validate.data.path), so the best epoch's "
    "model is never lost.",
)
SAVE_ASYNC = Key(
    "angel.save.model.async",
    "bool",
    True,
    "Write the end-of-epoch checkpoint in the background: the shards and workers copy their "
    "rows (training waits for the copies only) and threads write the files while the next "
    "epoch trains; the checkpoint is committed once every file is written, and the job waits "
    "for it before the next save, a restart and its end. false: training waits for the whole "
    "write.",
)
SAVE_FAILURE = Key(
    "angel.save.failure",
    "str",
    "stop",
    "When a checkpoint cannot be written (disk full, path unwritable): stop (end the job, "
    "naming the last good checkpoint) or continue (warn and train on; the previous "
    "checkpoint stays). Either way the previous checkpoint is kept. A parameter shard lost "
    "while it writes a checkpoint is not such a failure: written inline, the checkpoint is "
    "written again; in the background, that one is lost, said on the console, and training "
    "goes on.",
    choices=("stop", "continue"),
)
SEED = Key("ml.seed", "int", 0, "Seed of shuffling, table initialisation and worker-side layers.")
ACCUM_STEPS = Key(
    "ml.grad.accum.steps",
    "int",
    1,
    "Micro-batches per optimizer update; the loss is divided by this and the schedule "
    "advances once per update.",
    check=positive,
)
CLIP_NORM = Key(
    "ml.grad.clip.norm",
    "float",
    0.0,
    "Clip the gradient's global L2 norm to this before the update (0: no clipping).",
    check=non_negative,
)
AMP = Key(
    "ml.amp",
    "bool",
    False,
    "Mixed precision (autocast + gradient scaling) on CUDA workers; ignored with a warning on CPU.",
)
EARLY_STOP_PATIENCE = Key(
    "ml.early.stop.patience",
    "int",
    0,
    "Stop after this many epochs without improvement of ml.early.stop.metric (0: never).",
    check=non_negative,
)
EARLY_STOP_METRIC = Key(
    "ml.early.stop.metric",
    "str",
    "auto",
    "Validation metric watched by early stopping and ReduceLROnPlateau: auto (valid_auc "
    "for binary, valid_accuracy for multi-class, valid_rmse for regression) or a metric name "
    "such as valid_logloss.",
)
FREEZE_LAYERS = Key(
    "ml.freeze.layers",
    "str_list",
    None,
    "Layers left untouched: PS table names (weight, bias, wide, wide_bias, embedding, "
    "input, input_bias, ...) or worker-side module names (mlp).",
)
MAX_WORKER_RESTARTS = Key(
    "angel.worker.max.restarts",
    "int",
    3,
    "Times a training job restarts itself after one of its workers died (every worker and "
    "shard started again from the last checkpoint in angel.save.model.path (by default the run "
    "folder's), or from the beginning without one; see docs/checkpoints.md); 0: a dead worker "
    "fails the job.",
    check=non_negative,
)

KEYS = [
    EPOCHS,
    MINIBATCH_SIZE,
    UPDATES_PER_EPOCH,
    WORKERS,
    STREAM,
    WORKER_CPUS,
    TORCH_THREADS,
    DEVICE,
    WORKER_GPUS,
    RAY_CONNECT_TIMEOUT,
    PS_RESOURCES,
    WORKER_RESOURCES,
    PLACEMENT,
    FUSED,
    DENSE_PLACEMENT,
    LOG_PATH,
    TENSORBOARD,
    LOG_EVERY,
    SAVE_PATH,
    LOAD_PATH,
    KEEP_LAST,
    SAVE_EVERY,
    KEEP_BEST,
    SAVE_ASYNC,
    SAVE_FAILURE,
    SEED,
    ACCUM_STEPS,
    CLIP_NORM,
    AMP,
    EARLY_STOP_PATIENCE,
    EARLY_STOP_METRIC,
    FREEZE_LAYERS,
    MAX_WORKER_RESTARTS,
]

# Keys other key modules declare that the loop reads (a full Config holds every declared key).
_DECAY_ON_BATCH = "ml.opt.decay.on.batch"


def _is_set(conf: Mapping[str, Any], key: Key) -> bool:
    """True when the job gave ``key`` a value (a plain mapping: when it holds one)."""
    if isinstance(conf, Config):
        return conf.is_set(key.name)
    return key.name in conf and conf[key.name] is not None


def _optional(value: Any) -> Any:
    """A path key's value, None when unset or empty."""
    return value or None


def _runs_root(path: str) -> str:
    return str(path) or "runs"


def _lower_names(names: list[str] | None) -> tuple[str, ...]:
    return tuple(s.lower() for s in (names or []))


@dataclass(frozen=True)
class TrainPlan:
    """What the training loop and every worker need from the job configuration.

    A field whose metadata names a key (``keyed``) holds that key's value, read by
    :meth:`from_config` through the key's own declaration (``angelconf.options.read_keys``); the
    others are derived from several keys, in :meth:`from_config`.
    """

    epochs: int = field(metadata=keyed(EPOCHS))
    #: rows per mini-batch (also the chunk of prediction)
    minibatch_size: int = field(metadata=keyed(MINIBATCH_SIZE))
    #: ml.num.update.per.epoch when the job sets it (Angel's sizing), else None
    updates_per_epoch: int | None
    workers: int = field(metadata=keyed(WORKERS))
    stream: bool = field(metadata=keyed(STREAM))
    worker_cpus: float = field(metadata=keyed(WORKER_CPUS))
    #: GPUs per worker actor: angel.worker.gpus, or 1 when only angel.worker.device=cuda says so
    worker_gpus: float
    torch_threads: int = field(metadata=keyed(TORCH_THREADS))
    #: "cuda" when the workers have GPUs, else "cpu"
    device: str
    fused: bool = field(metadata=keyed(FUSED))
    dense_placement: str = field(metadata=keyed(DENSE_PLACEMENT))
    sparse: SparseOptions
    #: angel.log.path, or "runs" when empty
    log_dir: str = field(metadata=keyed(LOG_PATH, _runs_root))
    tensorboard: bool = field(metadata=keyed(TENSORBOARD))
    log_every: int = field(metadata=keyed(LOG_EVERY))
    save_path: str | None
    load_path: str | None = field(metadata=keyed(LOAD_PATH, _optional))
    seed: int = field(metadata=keyed(SEED))
    accum: int = field(metadata=keyed(ACCUM_STEPS))
    clip: float = field(metadata=keyed(CLIP_NORM))
    amp: bool = field(metadata=keyed(AMP))
    decay_on_batch: bool
    early_stop_patience: int = field(metadata=keyed(EARLY_STOP_PATIENCE))
    early_stop_metric: str = field(metadata=keyed(EARLY_STOP_METRIC))
    #: lower-cased names of frozen PS tables and worker-side modules
    frozen: tuple[str, ...] = field(metadata=keyed(FREEZE_LAYERS, _lower_names))
    #: how long to wait for the address of a Ray cluster to answer (angel.ray.connect.timeout.s)
    ray_connect_timeout_s: float = field(metadata=keyed(RAY_CONNECT_TIMEOUT))
    #: prefetch depth and worker cache (angel.worker.prefetch.*, angel.worker.cache.*)
    feed: FeedOptions
    #: checkpoints kept: the last ``keep_last`` epochs, the best one; a failed write: stop/continue
    keep_last: int = field(metadata=keyed(KEEP_LAST))
    keep_best: bool
    #: a checkpoint after every ``save_every``-th epoch (and the last)
    save_every: int = field(metadata=keyed(SAVE_EVERY))
    save_failure: str = field(metadata=keyed(SAVE_FAILURE))
    #: angel.save.model.async: the end-of-epoch checkpoint written in the background
    save_async: bool = field(metadata=keyed(SAVE_ASYNC))
    #: angel.save.model: save (into save_path, else into the run folder)
    save_model: bool = key_field(SAVE_MODEL)

    @property
    def collective(self) -> str:
        """The dense all-reduce's backend: NCCL between CUDA workers that own a whole GPU each
        (NCCL refuses two ranks on one device), gloo otherwise."""
        return "nccl" if self.device == "cuda" and self.worker_gpus >= 1 else "gloo"

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> TrainPlan:
        """The plan of a job (a :class:`~angelconf.config.Config`, every declared key present):
        the keyed fields from their keys, the rest derived here."""
        gpus = float(WORKER_GPUS.read(conf))
        if gpus == 0 and DEVICE.read(conf) == "cuda":
            gpus = 1.0
        values = read_keys(cls, conf)
        return cls(
            **values,
            updates_per_epoch=(
                int(UPDATES_PER_EPOCH.read(conf)) if _is_set(conf, UPDATES_PER_EPOCH) else None
            ),
            worker_gpus=gpus,
            device="cuda" if gpus > 0 else "cpu",
            sparse=SparseOptions.from_config(conf),
            # angel.save.model=false wins over a job file's path: nothing is saved
            save_path=(SAVE_PATH.read(conf) or None) if values["save_model"] else None,
            decay_on_batch=bool(conf[_DECAY_ON_BATCH]),
            feed=FeedOptions.from_config(conf),
            keep_best=keep_best(KEEP_BEST.read(conf), conf),
        )

    def for_inference(self, dense_placement: str) -> TrainPlan:
        """The plan of a saved model's one CPU worker: no training, no AMP."""
        return replace(
            self,
            workers=1,
            worker_gpus=0.0,
            device="cpu",
            accum=1,
            clip=0.0,
            amp=False,
            decay_on_batch=False,
            frozen=(),
            fused=False,
            dense_placement=dense_placement,
        )
