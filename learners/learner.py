"""GraphLearner: the one visible training loop of angelps.

    start or join Ray → workers load their data parts → PS tables launched → for each epoch:
        workers run updates in chunks (pull, forward, backward, push with lr; see worker.py)
        → validate (metrics over all workers' predictions) → advance the per-epoch schedule
        (ReduceLROnPlateau gets the validation metric) → checkpoint → stop early?

The scheduler lives here (per-epoch decay) or is copied to the workers for the epoch
(``ml.opt.decay.on.batch=true``), where it advances once per applied optimizer update: never per
micro-batch and never for a skipped update. Metrics go to ``<angel.log.path>/metrics.jsonl``.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from angelps.config import Config, ConfigError, Key, at_least, load_config, non_negative, positive

__all__ = ["KEYS", "GraphLearner", "TrainResult", "table_specs"]

KEYS = [
    Key("ml.epoch.num", "int", 30, "Training epochs (Angel's default 30).", check=at_least(1)),
    Key(
        "ml.minibatch.size",
        "int",
        128,
        "Rows per mini-batch on each worker (the global batch is this × workers × "
        "ml.grad.accum.steps); also the chunk size of prediction.",
        check=positive,
    ),
    Key(
        "ml.num.update.per.epoch",
        "int",
        10,
        "Angel's way to size batches: when set explicitly, each worker's batch is "
        "ceil(local rows / (this × ml.grad.accum.steps)) and ml.minibatch.size only sizes prediction.",
        check=positive,
    ),
    Key("angel.workergroup.number", "int", 1, "Number of training workers.", check=positive),
    Key(
        "ml.data.stream",
        "bool",
        False,
        "Read the training rows from disk during every epoch, one ml.data.chunk.rows chunk at "
        "a time (inputs larger than memory; shuffling within a chunk); false: hold them in memory.",
    ),
    Key(
        "angel.worker.cpus",
        "float",
        1.0,
        "CPUs Ray reserves for each worker actor.",
        check=positive,
    ),
    Key(
        "angel.worker.torch.threads",
        "int",
        1,
        "torch intra-op threads per worker: one is fastest for small models (LR, FM); give "
        "MLP models (DeepFM, DNN) as many as angel.worker.cpus (docs/benchmarks-train.md).",
        check=positive,
    ),
    Key(
        "angel.worker.device",
        "str",
        "cpu",
        "Where workers compute: cpu, or cuda (one GPU per worker; needs ml.amp for mixed precision).",
        choices=("cpu", "cuda"),
    ),
    Key(
        "angel.worker.gpus",
        "float",
        0.0,
        "GPUs Ray reserves for each worker actor (fractions share a device with other workers "
        "or shards); > 0 makes the workers compute on CUDA, as angel.worker.device=cuda does.",
        check=non_negative,
    ),
    Key(
        "angel.worker.fused.push.pull",
        "bool",
        True,
        "Send each update's push together with the next batch's pull (one call per shard per "
        "step); false: a push, then a pull.",
    ),
    Key(
        "angel.dense.placement",
        "str",
        "worker",
        "Where dense (MLP) layers live: worker (replicated, gradients all-reduced over gloo) or "
        "ps (one PS table per parameter, pulled and pushed every step, as Angel).",
        choices=("worker", "ps"),
    ),
    Key(
        "angel.log.path",
        "str",
        "",
        "Directory of metrics.jsonl (per-step and per-epoch metrics); empty: runs/<job name>.",
    ),
    Key(
        "angel.log.tensorboard",
        "bool",
        False,
        "Also write TensorBoard event files (step and epoch scalars) next to metrics.jsonl; "
        "needs the tensorboard package (pip install 'angelps[tensorboard]').",
    ),
    Key(
        "angel.log.every.steps",
        "int",
        50,
        "Updates per progress/metrics record (one JSON step line aggregates this many updates).",
        check=positive,
    ),
    Key(
        "angel.save.model.path",
        "str",
        None,
        "Checkpoint directory, written after every epoch (PS tables with optimizer state, "
        "worker-side layers, scheduler state, epoch, RNG); --resume continues from it.",
    ),
    Key(
        "angel.load.model.path",
        "str",
        None,
        "A saved model to start training from (weights and optimizer state; the epoch count "
        "and schedule start afresh, as Angel's inctrain).",
    ),
    Key("ml.seed", "int", 0, "Seed of shuffling, table initialisation and worker-side layers."),
    Key(
        "ml.grad.accum.steps",
        "int",
        1,
        "Micro-batches per optimizer update; the loss is divided by this and the schedule "
        "advances once per update.",
        check=positive,
    ),
    Key(
        "ml.grad.clip.norm",
        "float",
        0.0,
        "Clip the gradient's global L2 norm to this before the update (0: no clipping).",
        check=non_negative,
    ),
    Key(
        "ml.amp",
        "bool",
        False,
        "Mixed precision (autocast + gradient scaling) on CUDA workers; ignored with a warning on CPU.",
    ),
    Key(
        "ml.early.stop.patience",
        "int",
        0,
        "Stop after this many epochs without improvement of ml.early.stop.metric (0: never).",
        check=non_negative,
    ),
    Key(
        "ml.early.stop.metric",
        "str",
        "auto",
        "Validation metric watched by early stopping and ReduceLROnPlateau: auto (valid_auc "
        "for binary, valid_accuracy for multi-class, valid_rmse for regression) or a metric name "
        "such as valid_logloss.",
    ),
    Key(
        "ml.freeze.layers",
        "str_list",
        None,
        "Layers left untouched: PS table names (weight, bias, wide, wide_bias, embedding, "
        "input, input_bias, ...) or worker-side module names (mlp).",
    ),
]

_LOWER_IS_BETTER = ("loss", "logloss", "mse", "rmse", "mae")


@dataclass
class TrainResult:
    """What ``train()`` returns: one dict per epoch and the final summary."""

    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _all_keys() -> Sequence[Any]:
    from learners.keys import all_keys

    return all_keys()


class _Log:
    """Progress on a terminal (tqdm), plain lines otherwise, and the metrics.jsonl file."""

    def __init__(self, path: Path | None, quiet: bool = False, tensorboard: bool = False) -> None:
        self.tty = sys.stdout.isatty() and not quiet
        self.quiet = quiet
        self.file = None
        self.tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError(
                    "angel.log.tensorboard=true needs the tensorboard package: "
                    "pip install 'angelps[tensorboard]'"
                ) from None
            self.tb = SummaryWriter(log_dir=str(path if path is not None else "runs"))
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
            self.file = open(path / "metrics.jsonl", "a", buffering=1)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def record(self, obj: Mapping[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(_jsonable(obj)) + "\n")
        if self.tb is not None and obj.get("kind") in ("step", "epoch"):
            # Step scalars on the update axis, epoch scalars on the epoch axis, as the plot verb.
            kind = str(obj["kind"])
            at = int(obj.get("step", 0) if kind == "step" else obj.get("epoch", 0))
            for name, value in obj.items():
                if name in ("kind", "step", "epoch") or isinstance(value, bool):
                    continue
                if isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(
                    value
                ):
                    self.tb.add_scalar(f"{kind}/{name}", float(value), at)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


class GraphLearner:
    """Train, evaluate and predict one model on the parameter server.

    ``GraphLearner(conf)`` takes a loaded :class:`~angelps.config.Config`;
    :meth:`from_properties` loads one from a ``.properties`` file plus overrides.
    """

    def __init__(
        self, conf: Config | Mapping[str, Any], address: str | None = None, quiet: bool = False
    ) -> None:
        if not isinstance(conf, Config):
            conf = load_config(None, dict(conf), _all_keys())
        self.conf = conf
        self.address = address
        self.quiet = quiet
        self._ray_started = False
        self._ps: Any = None
        self._workers: list[Any] = []
        self._tables: list[Any] = []
        self._setup: dict[str, Any] = {}
        self.sched: Any = None
        self.epoch = 0

    @classmethod
    def from_properties(
        cls,
        path: str | os.PathLike[str] | None,
        overrides: Mapping[str, Any] | Sequence[str] = (),
        **kw: Any,
    ) -> GraphLearner:
        """Load ``path`` (a .properties file, or None for defaults) with overrides and build a learner."""
        return cls(load_config(path, overrides, _all_keys()), **kw)

    # --- Ray and the PS ----------------------------------------------------------------------

    def _start_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if address:
            ray.init(address=address, namespace="angelps", log_to_driver=True)
        else:
            ray.init(
                num_cpus=os.cpu_count() or 1,
                include_dashboard=False,
                namespace="angelps",
                log_to_driver=True,
                configure_logging=False,
            )
        self._ray_started = True

    def _start_workers(self, conf: Config) -> dict[str, Any]:
        """Create the worker actors (each loads its part of the data) and size the job."""
        import ray

        from learners.models import model_class
        from learners.worker import remote_worker_class

        w = int(conf["angel.workergroup.number"])
        gpus = float(conf["angel.worker.gpus"])
        if gpus == 0 and conf["angel.worker.device"] == "cuda":
            gpus = 1.0
        device = "cuda" if gpus > 0 else "cpu"
        have = float(ray.cluster_resources().get("GPU", 0))
        if gpus and have < w * gpus:
            # A worker asking for a GPU the cluster lacks would wait forever: say so now.
            raise ConfigError(
                f"angel.worker.gpus={gpus:g} with {w} worker(s) needs {w * gpus:g} GPU(s) but the "
                f"Ray cluster has {have:g}; set angel.worker.gpus=0 (and angel.worker.device=cpu)"
            )
        cls = remote_worker_class(float(conf["angel.worker.cpus"]), gpus)
        base = {"torch_threads": int(conf["angel.worker.torch.threads"])}
        plain = dict(conf.items())
        self._workers = [cls.remote(plain, i, w, base) for i in range(w)]
        summaries = ray.get([a.data_summary.remote() for a in self._workers])
        model_cls = model_class(str(conf["ml.model.class.name"]))
        range_ = int(conf["ml.feature.index.range"])
        max_id = max(s[p]["max_id"] for s in summaries for p in ("train", "valid"))
        num_features = range_ if range_ > 0 else max_id + 1
        fields = int(conf["ml.fm.field.num"])
        num_fields = fields if fields > 0 else None
        train_rows = [s["train"]["rows"] for s in summaries]
        if min(train_rows) == 0:
            raise ValueError(
                f"worker {train_rows.index(0)} has no training rows: the input has "
                f"{sum(train_rows)} rows for {w} workers (lower angel.workergroup.number)"
            )
        accum = int(conf["ml.grad.accum.steps"])
        if conf.is_set("ml.num.update.per.epoch"):
            n_up = int(conf["ml.num.update.per.epoch"])
            batch = max(1, math.ceil(min(train_rows) / (n_up * accum)))
        else:
            batch = int(conf["ml.minibatch.size"])
        # Lock-step: every worker makes the same number of updates per epoch (BSP); the
        # smallest part sets it, so no worker waits for a push that never comes.
        updates = max(1, math.ceil(min(train_rows) / batch) // accum)
        clip = float(conf["ml.grad.clip.norm"])
        frozen = [s.lower() for s in (conf["ml.freeze.layers"] or [])]
        from angelps.table import OptimizerSpec

        fc = OptimizerSpec.from_conf(conf, "ml.fclayer.optimizer")
        setup = {
            "num_features": num_features,
            "num_fields": num_fields,
            "batch_size": batch,
            "accum_steps": accum,
            "updates_per_epoch": updates,
            "seed": int(conf["ml.seed"]),
            "shuffle": bool(conf["ml.data.use.shuffle"]),
            "clip_norm": clip,
            "decay_on_batch": bool(conf["ml.opt.decay.on.batch"]),
            "frozen": frozen,
            "dense_optimizer": fc.to_dict(),
            "amp": bool(conf["ml.amp"]),
            "dense_placement": str(conf["angel.dense.placement"]),
            "fused": bool(conf["angel.worker.fused.push.pull"]),
            "device": device,
            "train_rows": train_rows,
            "valid_rows": [s["valid"]["rows"] for s in summaries],
            "skipped_lines": sum(s.get("skipped_lines", 0) for s in summaries),
            "model": model_cls.angel_name,
        }
        decls = ray.get([a.setup_model.remote(setup) for a in self._workers])[0]
        if w > 1:
            addr, port = ray.get(self._workers[0].free_port.remote())
            ray.get([a.setup_dist.remote(addr, port) for a in self._workers])
        self._decls = decls
        return setup

    def _launch_ps(self, conf: Config) -> None:
        import ray

        from angelps.client import PSClient

        self._tables = table_specs(conf, self._decls)
        w = len(self._workers)
        self._ps = PSClient.launch(self._tables, conf, num_workers=w)
        ray.get([a.set_ps.remote(self._ps.for_worker(i)) for i, a in enumerate(self._workers)])

    # --- the screen at start -----------------------------------------------------------------

    def _banner(self, conf: Config, setup: Mapping[str, Any], total_updates: int) -> str:
        w = len(self._workers)
        b, k = setup["batch_size"], setup["accum_steps"]
        lines = [
            f"angelps train: {setup['model']}  ({conf.source('ml.model.class.name')})",
            f"  data     {conf['angel.train.data.path']}: {sum(setup['train_rows'])} train rows, "
            f"{sum(setup['valid_rows'])} validation rows, {setup['num_features']} features"
            + (f", {setup['num_fields']} fields" if setup["num_fields"] else "")
            + (f", {setup['skipped_lines']} bad lines skipped" if setup["skipped_lines"] else ""),
            f"  tables   on {int(conf.get('angel.ps.number', 1) or 1)} shard(s), sparse keys "
            f"{conf.get('angel.ps.partitioner', 'hash')}-partitioned, "
            f"staleness {conf.get('angel.staleness', 0)}:",
        ]
        for t in self._tables:
            kind = "sparse" if t.sparse else "dense"
            lines.append(
                f"    {t.name:<20} {kind:<6} {t.rows} x {t.cols}  {t.optimizer.name}"
                f"  init {t.init}{'' if t.init == 'zeros' else f'({t.init_std:g})'}"
            )
        dense = setup.get("dense_params", 0)
        if dense and setup.get("dense_placement") == "ps":
            lines.append(f"  dense    {dense} parameters in dense.* tables on the PS")
        elif dense:
            lines.append(
                f"  dense    {dense} parameters on the workers ({setup['dense_optimizer']['name']}"
                + (", all-reduced over gloo)" if w > 1 else ")")
            )
        if setup.get("amp") and setup.get("device") != "cuda":
            lines.append(
                "  amp      ml.amp=true ignored: mixed precision needs angel.worker.device=cuda"
            )
        elif setup.get("amp"):
            lines.append("  amp      fp16 autocast with a dynamic loss scale (starts at 65536)")
        lines += [
            f"  workers  {w}; effective batch = {b} x {w} workers x {k} accum = {b * w * k}",
            f"  updates  {setup['updates_per_epoch']} per epoch x {conf['ml.epoch.num']} epochs "
            f"= {total_updates}",
        ]
        if self.sched is not None:
            per = "update" if setup["decay_on_batch"] else "epoch"
            first = ", ".join(f"{self.sched.lr_at(i):.4g}" for i in range(4))
            lines.append(f"  decay    {self.sched.describe()} per {per}: {first}, ...")
        return "\n".join(lines)

    # --- training ----------------------------------------------------------------------------

    def _log_dir(self, conf: Config) -> Path:
        p = conf["angel.log.path"]
        if p:
            return Path(p)
        name = conf.get("angel.job.name") or str(conf["ml.model.class.name"]).lower()
        return Path("runs") / str(name)

    def train(self, resume: bool = False) -> TrainResult:
        """Train ``ml.epoch.num`` epochs (continuing from ``angel.save.model.path`` if ``resume``)."""
        import ray

        from decay import from_conf

        conf = self.conf
        t_start = time.perf_counter()
        self._check_conf(conf, resume)
        self._check_plateau(conf)
        if resume:
            _read_extra(Path(conf["angel.save.model.path"]))  # fail before any actor starts
        self._start_ray()
        log = _Log(self._log_dir(conf), self.quiet, bool(conf["angel.log.tensorboard"]))
        try:
            setup = self._start_workers(conf)
            self._setup = setup
            self._launch_ps(conf)
            setup["dense_params"] = ray.get(self._workers[0].dense_param_count.remote())
            epochs = int(conf["ml.epoch.num"])
            updates = int(setup["updates_per_epoch"])
            on_batch = bool(setup["decay_on_batch"])
            total = updates * epochs if on_batch else epochs
            self.sched = from_conf(conf, total_steps=total)
            history: list[dict[str, Any]] = []
            start_epoch = 0
            best: float | None = None
            since_best = 0
            if resume:
                start_epoch, history, best, since_best = self._restore(
                    conf["angel.save.model.path"]
                )
            elif conf["angel.load.model.path"]:
                self._load_weights(conf["angel.load.model.path"])
            log.say(self._banner(conf, setup, updates * epochs))
            metric_name = self._watch_metric(conf)
            log_every = int(conf["angel.log.every.steps"])
            train_samples = 0
            train_time = 0.0
            stopped_early = False
            for epoch in range(start_epoch, epochs):
                self.epoch = epoch
                ray.get([a.begin_epoch.remote(epoch, self.sched) for a in self._workers])
                epoch_lr = None if on_batch else float(self.sched.peek())
                bar = self._bar(epoch, epochs, updates)
                done = 0
                loss_sum, samples, skipped = 0.0, 0, 0
                last_lr = float(self.sched.peek())
                t_epoch = time.perf_counter()
                while done < updates:
                    n = min(log_every, updates - done)
                    # Another chunk follows (of this epoch or the next): the workers fetch its
                    # first batch's rows with this chunk's last push (one round trip, not two).
                    end = done + n >= updates
                    more = not end or epoch + 1 < epochs
                    nxt = epoch + 1 if end else None
                    outs = ray.get(
                        [a.run_steps.remote(n, epoch_lr, more, nxt) for a in self._workers]
                    )
                    done += n
                    chunk_samples = sum(o["samples"] for o in outs)
                    chunk_loss = sum(o["loss_sum"] for o in outs)
                    o0 = outs[0]
                    loss_sum += chunk_loss
                    samples += chunk_samples
                    skipped += o0["skipped"]
                    if o0["updates"]:
                        last_lr = o0["last_lr"]
                    step_line = {
                        "kind": "step",
                        "epoch": epoch,
                        "step": epoch * updates + done,
                        "updates": n,
                        "lr": o0["last_lr"],
                        "loss": chunk_loss / max(chunk_samples, 1),
                        "samples_per_s": chunk_samples
                        / max(max(o["elapsed_s"] for o in outs), 1e-9),
                        "pull_s": o0["pull_s"],
                        "compute_s": o0["compute_s"],
                        "push_s": o0["push_s"],
                        # waiting for the rows of a fused push_pull already in flight
                        "wait_s": o0["wait_s"],
                        "elapsed_s": o0["elapsed_s"],
                        "skipped": o0["skipped"],
                    }
                    log.record(step_line)
                    if bar is not None:
                        bar.update(n)
                        bar.set_postfix(
                            loss=f"{step_line['loss']:.4f}", lr=f"{step_line['lr']:.3g}"
                        )
                    if on_batch:
                        self.sched.load_state_dict(o0["sched_state"])
                train_s = time.perf_counter() - t_epoch
                if bar is not None:
                    bar.close()
                train_samples += samples
                train_time += train_s
                metrics = self._validate()
                row: dict[str, Any] = {
                    "kind": "epoch",
                    "epoch": epoch,
                    # per-update decay: the step size of the epoch's last update
                    "lr": epoch_lr if epoch_lr is not None else last_lr,
                    "train_loss": loss_sum / max(samples, 1),
                    "train_samples_per_s": samples / max(train_s, 1e-9),
                    "skipped_updates": skipped,
                    **metrics,
                }
                watched = metrics.get(metric_name)
                if (
                    metrics
                    and metric_name not in metrics
                    and (int(conf["ml.early.stop.patience"]) > 0 or _is_plateau(self.sched))
                ):
                    names = ", ".join(sorted(k for k in metrics if k.startswith("valid_")))
                    raise ConfigError(
                        f"ml.early.stop.metric={conf['ml.early.stop.metric']}: this model reports "
                        f"no {metric_name}; valid names: {names}"
                    )
                if not on_batch:
                    self._advance_epoch_schedule(watched)
                elif _is_plateau(self.sched):
                    self._plateau_step(watched)
                improved = False
                if watched is not None and math.isfinite(watched):
                    sign = -1.0 if metric_name.endswith(_LOWER_IS_BETTER) else 1.0
                    improved = best is None or sign * watched > sign * best
                    if improved:
                        best, since_best = watched, 0
                    else:
                        since_best += 1
                row["elapsed_s"] = time.perf_counter() - t_start
                history.append(row)
                log.record(row)
                log.say(self._epoch_line(row, epochs))
                if conf["angel.save.model.path"]:
                    self._checkpoint(
                        conf["angel.save.model.path"], epoch, history, best, since_best
                    )
                patience = int(conf["ml.early.stop.patience"])
                if patience > 0 and since_best >= patience:
                    log.say(
                        f"early stop: {metric_name} has not improved for {since_best} epochs "
                        f"(best {best:.6g})"
                    )
                    stopped_early = True
                    break
            last = history[-1] if history else {}
            summary = {
                "model": setup["model"],
                "epochs": len(history),
                "workers": len(self._workers),
                "global_batch": setup["batch_size"] * len(self._workers) * setup["accum_steps"],
                "updates_per_epoch": updates,
                **{k: v for k, v in last.items() if k.startswith("valid_")},
                "train_loss": last.get("train_loss"),
                "train_samples_per_s": train_samples / max(train_time, 1e-9),
                "elapsed_s": time.perf_counter() - t_start,
                "stopped_early": stopped_early,
                "skipped_lines": setup["skipped_lines"],
            }
            for k in ("valid_auc", "valid_logloss", "valid_accuracy"):
                summary.setdefault(k, None)
            log.record({"kind": "summary", **summary})
            return TrainResult(history=history, summary=_jsonable(summary))
        finally:
            log.close()

    def _check_conf(self, conf: Config, resume: bool) -> None:
        if not conf["angel.train.data.path"]:
            raise ConfigError(
                "angel.train.data.path is not set: expected the path of the training data"
            )
        if not Path(str(conf["angel.train.data.path"])).exists():
            raise ConfigError(
                f"angel.train.data.path={conf['angel.train.data.path']} "
                f"({conf.source('angel.train.data.path')}) does not exist"
            )
        from learners.models import model_class

        cls = model_class(str(conf["ml.model.class.name"]))  # unknown names fail here, first
        if cls.needs_fields and int(conf["ml.fm.field.num"]) < 1:
            raise ConfigError(
                f"{cls.angel_name} needs ml.fm.field.num (the number of fields, one id per field "
                "in every sample; census: 13)"
            )
        if resume and not conf["angel.save.model.path"]:
            raise ConfigError("--resume needs angel.save.model.path (the checkpoint directory)")

    def _watch_metric(self, conf: Config) -> str:
        name = str(conf["ml.early.stop.metric"]).lower()
        if name != "auto":
            return name if name.startswith("valid_") else f"valid_{name}"
        from learners.models import model_class

        task = model_class(str(conf["ml.model.class.name"])).task
        return {"binary": "valid_auc", "multiclass": "valid_accuracy"}.get(task, "valid_rmse")

    def _advance_epoch_schedule(self, metric: float | None) -> None:
        if _is_plateau(self.sched):
            # ReduceLROnPlateau: fed the global validation metric, decided once, here.
            self._plateau_step(metric)
        self.sched.advance()

    def _plateau_step(self, metric: float | None) -> None:
        if metric is None:
            raise ConfigError(
                "ReduceLROnPlateau needs a validation metric: set ml.data.validate.ratio > 0 "
                "or angel.validate.data.path"
            )
        self.sched.step(metric)

    def _check_plateau(self, conf: Config) -> None:
        """The plateau's mode must match the direction of the metric it is fed."""
        if str(conf["ml.opt.decay.class.name"]).lower() != "reducelronplateau":
            return
        metric_name = self._watch_metric(conf)
        want = "min" if metric_name.endswith(_LOWER_IS_BETTER) else "max"
        mode = str(conf["ml.opt.decay.mode"] or "min").lower()
        if mode != want:
            raise ConfigError(
                f"ReduceLROnPlateau is fed {metric_name} (ml.early.stop.metric), where "
                f"{'lower' if want == 'min' else 'higher'} is better, but "
                f"ml.opt.decay.mode={mode}: set ml.opt.decay.mode={want}"
            )

    def _bar(self, epoch: int, epochs: int, updates: int) -> Any:
        if self.quiet or not sys.stdout.isatty():
            return None
        from tqdm import tqdm

        return tqdm(total=updates, desc=f"epoch {epoch + 1}/{epochs}", unit="upd", leave=False)

    @staticmethod
    def _epoch_line(row: Mapping[str, Any], epochs: int) -> str:
        parts = [
            f"epoch {row['epoch'] + 1}/{epochs}",
            f"lr {row['lr']:.4g}",
            f"train_loss {row['train_loss']:.4f}",
        ]
        for k in ("valid_logloss", "valid_auc", "valid_accuracy", "valid_rmse", "valid_r2"):
            if row.get(k) is not None:
                parts.append(f"{k} {row[k]:.4f}")
        parts.append(f"{row['train_samples_per_s']:.0f} samples/s")
        return "  ".join(parts)

    # --- validation and prediction ------------------------------------------------------------

    def _validate(self) -> dict[str, Any]:
        import ray

        outs = ray.get([a.evaluate_part.remote("valid") for a in self._workers])
        rows = sum(o["rows"] for o in outs)
        if rows == 0:
            return {}
        return _metrics(self._setup_task(), outs)

    def _setup_task(self) -> str:
        from learners.models import model_class

        return model_class(str(self.conf["ml.model.class.name"])).task

    # --- checkpoints ---------------------------------------------------------------------------

    def _checkpoint(
        self,
        path: str,
        epoch: int,
        history: list[dict[str, Any]],
        best: float | None,
        since_best: int,
    ) -> None:
        import ray

        extra = {
            "learner": {
                "epoch": epoch,
                "next_epoch": epoch + 1,
                "scheduler": self.sched.state_dict() if self.sched is not None else None,
                "dense_placement": self._setup.get("dense_placement", "worker"),
                "conf": {k: v for k, v in self.conf.to_properties().items() if self.conf.is_set(k)},
                "history": _jsonable(history),
                "best": best,
                "since_best": since_best,
                "model": self._setup.get("model"),
                "num_features": self._setup.get("num_features"),
                "num_fields": self._setup.get("num_fields"),
                "tables": [t.to_dict() for t in self._tables],
                # Shuffling is a pure function of (ml.seed, epoch): the data position is the epoch.
                "data_position": {"epoch": epoch + 1, "row": 0},
            }
        }
        # The worker-side layers travel inside the manifest (an .npz, base64), so the PS
        # checkpoint's atomic rename covers them too: no window with mismatched halves.
        blob = ray.get(self._workers[0].dense_state.remote())
        extra["learner"]["dense_npz_b64"] = base64.b64encode(blob).decode("ascii")
        rngs = ray.get([a.rng_state.remote() for a in self._workers])
        extra["learner"]["worker_rng_b64"] = [base64.b64encode(r).decode("ascii") for r in rngs]
        self._ps.save(path, extra)

    def _restore(self, path: str) -> tuple[int, list[dict[str, Any]], float | None, int]:
        import ray

        _read_extra(Path(path))  # a clear error before the shards are touched
        extra = self._ps.load(path)
        info = extra["learner"]
        self.sched.load_state_dict(info["scheduler"])
        self._load_dense(info)
        # Clocks restart at 0 after a load: hand the workers fresh clients.
        ray.get([a.set_ps.remote(self._ps.for_worker(i)) for i, a in enumerate(self._workers)])
        return int(info["next_epoch"]), list(info["history"]), info["best"], int(info["since_best"])

    def _load_dense(self, info: Mapping[str, Any]) -> None:
        import ray

        blob = base64.b64decode(info["dense_npz_b64"])
        ray.get([a.load_dense_state.remote(blob) for a in self._workers])
        rngs = info.get("worker_rng_b64") or []
        if len(rngs) == len(self._workers):
            # Every worker continues its own dropout stream (resuming with the same W).
            ray.get(
                [
                    a.set_rng_state.remote(base64.b64decode(r))
                    for a, r in zip(self._workers, rngs, strict=True)
                ]
            )

    def _load_weights(self, path: str) -> None:
        import ray

        _read_extra(Path(path))
        info = self._ps.load(path)["learner"]
        self._load_dense(info)
        ray.get([a.set_ps.remote(self._ps.for_worker(i)) for i, a in enumerate(self._workers)])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the trained model (PS tables, worker-side layers, scheduler) to ``path``."""
        if self._ps is None:
            raise RuntimeError("save(): nothing trained or loaded yet")
        hist: list[dict[str, Any]] = []
        self._checkpoint(str(path), self.epoch, hist, None, 0)

    def load(self, path: str | os.PathLike[str]) -> GraphLearner:
        """Load a saved model for evaluation or prediction (starts Ray, one worker and the PS)."""
        import ray

        from angelps.client import PSClient
        from angelps.table import TableSpec

        p = Path(path)
        manifest = _read_extra(p)
        info = manifest["learner"]
        # The model's own settings (ml.*: data format, label transform, model shape) apply
        # unless this configuration sets them, so `predict --model DIR` needs no --conf.
        saved = {
            k: v
            for k, v in dict(info.get("conf", {})).items()
            if k.startswith("ml.") and not self.conf.is_set(k) and k in self.conf
        }
        conf = self.conf.with_overrides(
            {**saved, "angel.workergroup.number": 1, "ml.model.class.name": info["model"]}
        )
        self.conf = conf
        self._start_ray()
        from learners.worker import remote_worker_class

        cls = remote_worker_class(float(conf["angel.worker.cpus"]), 0)
        plain = dict(conf.items())
        plain["angel.train.data.path"] = None
        self._workers = [
            cls.remote(
                plain,
                0,
                1,
                {"torch_threads": int(conf["angel.worker.torch.threads"]), "no_data": True},
            )
        ]
        setup = {
            "num_features": info["num_features"],
            "num_fields": info["num_fields"],
            "batch_size": int(conf["ml.minibatch.size"]),
            "accum_steps": 1,
            "seed": int(conf["ml.seed"]),
            "shuffle": False,
            "clip_norm": 0.0,
            "decay_on_batch": False,
            "frozen": [],
            "model": info["model"],
            "dense_placement": info.get("dense_placement", "worker"),
            "fused": False,
        }
        self._setup = setup
        self._decls = ray.get(self._workers[0].setup_model.remote(setup))
        self._tables = [TableSpec.from_dict(d) for d in info["tables"]]
        self._ps = PSClient.launch(self._tables, conf, num_workers=1)
        self._ps.load(str(p))
        ray.get(self._workers[0].set_ps.remote(self._ps.for_worker(0)))
        self._load_dense(info)
        return self

    def evaluate(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Metrics of the current model on a labelled file."""
        import ray

        if not self._workers:
            raise RuntimeError("evaluate(): train() or load() first")
        outs = ray.get([a.predict_file.remote(str(path)) for a in self._workers])
        if any(o["labels"] is None for o in outs):
            raise ConfigError(f"{path}: evaluation needs labels (ml.data.has.label=true)")
        return {k.removeprefix("valid_"): v for k, v in _metrics(self._setup_task(), outs).items()}

    def predict(self, path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
        """One prediction per input row, in input order: ``pred`` (and ``label`` if present)."""
        import ray

        if not self._workers:
            raise RuntimeError("predict(): train() or load() first")
        outs = ray.get([a.predict_file.remote(str(path)) for a in self._workers])
        row_index = np.concatenate([o["row_index"] for o in outs])
        order = np.argsort(row_index, kind="stable")
        out = {"pred": np.concatenate([o["pred"] for o in outs])[order]}
        labels = [o["labels"] for o in outs]
        if all(lab is not None for lab in labels) and not np.isnan(np.concatenate(labels)).all():
            out["label"] = np.concatenate(labels)[order]
        return out

    def shutdown(self) -> None:
        """Stop the workers and the PS; stop Ray only if this learner started it."""
        import ray

        for a in self._workers:
            try:
                ray.get(a.shutdown.remote())
                ray.kill(a)
            except Exception:
                pass
        self._workers = []
        if self._ps is not None:
            self._ps.shutdown()
            self._ps = None
        if self._ray_started and ray.is_initialized():
            ray.shutdown()
            self._ray_started = False

    def __enter__(self) -> GraphLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _is_plateau(sched: Any) -> bool:
    return getattr(sched, "composable", True) is False and hasattr(sched, "step")


def table_specs(conf: Mapping[str, Any], decls: Sequence[Any]) -> list[Any]:
    """PS table specs for a model's declared tables, with the optimizers named by the conf.

    Sparse tables take their role's optimizer (``ml.inputlayer.optimizer`` or
    ``ml.embedding.optimizer``) with ``ml.reg.*``; bias tables the same optimizer without
    regularisation (Angel never regularises biases). With ``angel.dense.placement=ps`` the MLP's
    parameters are dense tables with ``ml.fclayer.optimizer``.
    """
    from angelps.table import OptimizerSpec, TableSpec

    specs: list[Any] = []
    for d in decls:
        opt = OptimizerSpec.from_conf(conf, f"ml.{d.role}.optimizer")
        if not d.sparse and d.name.endswith("bias"):
            opt = OptimizerSpec(**{**opt.to_dict(), "l1": 0.0, "l2": 0.0})
        specs.append(
            TableSpec(
                name=d.name,
                rows=int(d.rows),
                cols=int(d.dim),
                sparse=bool(d.sparse),
                init=d.init if d.init_std > 0 else "zeros",
                init_std=float(d.init_std),
                seed=int(conf["ml.seed"]) * 1000 + len(specs),
                optimizer=opt,
            )
        )
    return specs


def _read_extra(path: Path) -> dict[str, Any]:
    """The ``extra`` of a saved model's manifest; ConfigError when ``path`` holds none."""
    from angelps import checkpoint

    try:
        manifest = checkpoint.read_manifest(str(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not a saved angelps model: {e}") from None
    extra = dict(manifest.get("extra", {}))
    if "learner" not in extra:
        raise ConfigError(f"{path} is a PS checkpoint without a model (no learner section)")
    return extra


def _metrics(task: str, outs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Global validation metrics over every worker's predictions."""
    from learners import metrics as M

    key = "prob" if task == "multiclass" else "pred"
    pred = np.concatenate([o[key] for o in outs])
    labels = np.concatenate([o["labels"] for o in outs])
    rows = sum(o["rows"] for o in outs)
    loss = sum(o["loss_sum"] for o in outs) / max(rows, 1)
    if task == "binary":
        m = M.binary_metrics(labels, pred)
    elif task == "multiclass":
        m = M.multiclass_metrics(labels, pred)
    else:
        m = M.regression_metrics(labels, pred)
    out = {f"valid_{k}": v for k, v in dict(m).items()}
    out["valid_loss"] = loss
    out["valid_rows"] = rows
    return _jsonable(out)
