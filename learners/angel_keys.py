"""Angel's own job keys, so that an Angel job runs as pasted (docs/angel-migration.md).

Angel's documented submit commands and its system configuration name keys that mean
something else here, or nothing at all. Every one of them is declared, in one of three kinds:

* mapped: its value sets one of our keys (``angel.ps.memory.mb`` sets ``angel.ps.memory``);
  our own key, when also set, must agree;
* no effect: accepted, with one line saying why it does nothing here (YARN deployment, JVM
  options, Netty buffers: Ray and angelps decide those);
* refused unless at Angel's default: a key that would change training and is not implemented
  (``ml.data.posneg.ratio``) is an error naming it, never silently ignored.

:func:`resolve` applies them to a loaded Config; it is idempotent. A key module: standard
library and ``angelconf.config`` only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from angelconf.config import Config, ConfigError, Key, at_least, format_value, non_negative
from angelps.file_store import files_for

__all__ = ["KEYS", "MODEL_TYPES", "angel_notes", "check_output_policy", "resolve"]

#: Angel's ml.model.type values (RowType names of the model's matrices).
MODEL_TYPES = (
    "T_DOUBLE_DENSE",
    "T_FLOAT_DENSE",
    "T_DOUBLE_SPARSE",
    "T_FLOAT_SPARSE",
    "T_DOUBLE_SPARSE_LONGKEY",
    "T_FLOAT_SPARSE_LONGKEY",
    "T_DOUBLE_SPARSE_COMPONENT",
    "T_FLOAT_SPARSE_COMPONENT",
    "T_DOUBLE_SPARSE_LONGKEY_COMPONENT",
    "T_FLOAT_SPARSE_LONGKEY_COMPONENT",
)
#: The source of a value set by an Angel key (what `angelps conf` shows beside it).
_SOURCE = "Angel's key"
_STORAGE_LEVELS = ("memory", "memory_disk", "disk")


@dataclass(frozen=True)
class _Mapped:
    """An Angel key whose value sets ``target`` (``convert`` turns it into the target's value)."""

    key: Key
    target: str
    convert: Callable[[Any], Any]
    #: only when ``target`` is not set itself (then it is a bound, checked in resolve)
    fill_only: bool = False


def _mapped(
    name: str,
    type_: str,
    target: str,
    doc: str,
    convert: Callable[[Any], Any] = lambda v: v,
    fill_only: bool = False,
    **kw: Any,
) -> _Mapped:
    return _Mapped(Key(name, type_, None, f"Angel's key: {doc}", **kw), target, convert, fill_only)


def _gib_to_mib(v: float) -> int:
    return round(float(v) * 1024)


def _partitioner(model_type: str) -> str:
    # Angel keeps a dense model as contiguous column ranges per PS; sparse ones are keyed.
    return "range" if model_type.endswith("_DENSE") else "hash"


def _stream(level: str) -> bool:
    return level == "disk"


_MAPPED = [
    _mapped(
        "angel.ps.memory.mb",
        "int",
        "angel.ps.memory",
        "memory of each PS in MB; sets angel.ps.memory (MiB Ray reserves for each shard).",
        check=non_negative,
    ),
    _mapped(
        "angel.ps.memory.gb",
        "float",
        "angel.ps.memory",
        "memory of each PS in GB; sets angel.ps.memory to 1024 × this (MiB).",
        _gib_to_mib,
        check=non_negative,
    ),
    _mapped(
        "angel.worker.task.number",
        "int",
        "angel.workergroup.number",
        "tasks per worker; each task here is a worker actor, so angel.workergroup.number "
        "becomes (groups × tasks).",
        check=at_least(1, "an integer"),
    ),
    _mapped(
        "angel.ps.cpu.vcores",
        "int",
        "angel.ps.cpus",
        "vcores of each PS; sets angel.ps.cpus.",
        float,
        check=non_negative,
    ),
    _mapped(
        "angel.worker.cpu.vcores",
        "int",
        "angel.worker.cpus",
        "vcores of each worker; sets angel.worker.cpus.",
        float,
        check=at_least(1, "an integer"),
    ),
    _mapped(
        "angel.worker.max-attempts",
        "int",
        "angel.worker.max.restarts",
        "attempts of a worker (the first included); sets angel.worker.max.restarts to this - 1.",
        lambda v: max(int(v) - 1, 0),
        check=at_least(1, "an integer"),
    ),
    _mapped(
        "angel.ps.backup.auto.enable",
        "bool",
        "angel.ps.backup.interval",
        "false turns shard backups off (angel.ps.backup.interval=0); true keeps them on.",
        lambda v: None if v else 0,
    ),
    _mapped(
        "ml.model.size",
        "int",
        "ml.feature.index.range",
        "the number of valid feature indices; when ml.feature.index.range is not set it "
        "sizes the model as that key does (Angel's shipped data: the two are equal); when "
        "it is set, this must not exceed it.",
        fill_only=True,
        check=at_least(1, "an integer"),
    ),
    _mapped(
        "ml.feature.num",
        "int",
        "ml.feature.index.range",
        "Angel's older name of ml.feature.index.range.",
    ),
    _mapped(
        "ml.model.type",
        "str",
        "angel.ps.partitioner",
        "the model's row type; a *_DENSE type keeps each table as contiguous key ranges "
        "(angel.ps.partitioner=range), a sparse one spreads keys by hash "
        "(angel.ps.partitioner=hash). Values are float32 here whatever the type says.",
        _partitioner,
        choices=MODEL_TYPES,
    ),
    _mapped(
        "ml.lr.model.type",
        "str",
        "angel.ps.partitioner",
        "LR's older name of ml.model.type.",
        _partitioner,
        choices=MODEL_TYPES,
    ),
    _mapped("ml.lr.reg.l1", "float", "ml.reg.l1", "LR's older name of ml.reg.l1."),
    _mapped("ml.lr.reg.l2", "float", "ml.reg.l2", "LR's older name of ml.reg.l2."),
    _mapped(
        "ml.validate.ratio", "float", "ml.data.validate.ratio", "older ml.data.validate.ratio."
    ),
    _mapped("ml.batch.num", "int", "ml.num.update.per.epoch", "older ml.num.update.per.epoch."),
    _mapped(
        "ml.sparseinputlayer.optimizer",
        "str",
        "ml.inputlayer.optimizer",
        "older name of ml.inputlayer.optimizer.",
    ),
    _mapped(
        "ml.worker.thread.num",
        "int",
        "angel.worker.torch.threads",
        "compute threads per worker; sets angel.worker.torch.threads.",
        check=at_least(1, "an integer"),
    ),
    _mapped(
        "angel.task.data.storage.level",
        "str",
        "ml.data.stream",
        "where a task keeps its training rows: disk reads them from disk every epoch "
        "(ml.data.stream=true); memory and memory_disk hold them in memory.",
        _stream,
        choices=_STORAGE_LEVELS,
    ),
]

OUTPUT_DELETE = Key(
    "angel.output.path.deleteonexist",
    "bool",
    True,
    "Angel's output-path policy: true replaces an existing checkpoint in "
    "angel.save.model.path and an existing angel.predict.out.path file (never a directory of "
    "other files); false refuses to start when either already exists (Angel's own default).",
)

#: Accepted, with one line saying why they do nothing here: (key, why).
_NO_EFFECT = {
    "angel.app.submit.class": "angelps chooses what runs from action.type and ml.model.class.name",
    "angel.deploy.mode": "Ray decides where actors run (--address or RAY_ADDRESS; none: a "
    "local Ray)",
    "angel.running.mode": "angelps always runs its own shards and workers",
    "angel.job.libjars": "angelps runs Python; ship code with Ray's runtime environment",
    "angel.inputformat": "the input format is ml.data.type",
    "angel.task.user.task.class": "the model class decides the worker's computation",
    "angel.app.config.file": "a job file is given with --conf",
    "queue": "Ray has no YARN queues",
    "angel.queue": "Ray has no YARN queues",
    "angel.worker.env": "set the workers' environment with Ray's runtime environment "
    "(ray job submit --runtime-env-json)",
    "angel.ps.env": "set the shards' environment with Ray's runtime environment",
    "angel.am.env": "there is no application master; the driver is this process",
    "angel.worker.memory.mb": "workers reserve no memory here (angel.worker.cpus and "
    "angel.worker.resources place them); shard memory is angel.ps.memory",
    "angel.worker.memory.gb": "workers reserve no memory here (angel.worker.cpus and "
    "angel.worker.resources place them); shard memory is angel.ps.memory",
    "angel.task.memorystorage.max.mb": "rows are held in memory or streamed "
    "(ml.data.stream, ml.data.chunk.rows)",
    "angel.task.memorystorage.max.gb": "rows are held in memory or streamed "
    "(ml.data.stream, ml.data.chunk.rows)",
    "angel.am.memory.mb": "there is no application master; the driver is this process",
    "angel.am.memory.gb": "there is no application master; the driver is this process",
    "angel.am.cpu.vcores": "there is no application master; the driver is this process",
    "angel.am.resource.cpu-vcores": "there is no application master",
    "angel.am.java.opts": "no JVM runs here",
    "angel.worker.java.opts": "no JVM runs here",
    "angel.ps.java.opts": "no JVM runs here",
    "angel.am.max-attempts": "there is no application master to restart",
    "angel.am.heartbeat.interval.ms": "Ray watches its actors",
    "angel.worker.heartbeat.interval.ms": "Ray watches its actors",
    "angel.ps.heartbeat.interval.ms": "Ray watches its actors",
    "angel.worker.heartbeat.timeout.ms": "Ray watches its actors",
    "angel.ps.heartbeat.timeout.ms": "Ray watches its actors",
    "angel.am.appstate.timeout.ms": "there is no application master",
    "angel.am.wait.matrix.timeout.ms": "tables are created by the driver before training",
    "angel.am.write.state.interval.ms": "the run's state is metrics.jsonl in its run folder",
    "angel.am.log.level": "no master log; the driver prints one line per event",
    "angel.worker.log.level": "worker errors come back to the driver as one line",
    "angel.ps.log.level": "shard errors come back to the driver as one line",
    "angel.ps.backup.interval.ms": "shard backups are counted in updates "
    "(angel.ps.backup.interval)",
    "angel.ps.checkpoint.max.num": "a shard keeps one backup",
    "angel.tmp.output.path": "shard backups go to angel.ps.backup.path",
    "angel.netty.matrixtransfer.client.sndbuf": "no Netty: rows travel over angelps's own "
    "transport",
    "angel.netty.matrixtransfer.client.rcvbuf": "no Netty here",
    "angel.netty.matrixtransfer.client.eventgroup.threadnum": "no Netty here",
    "angel.netty.matrixtransfer.client.usedirectbuffer": "no Netty here",
    "angel.netty.matrixtransfer.server.sndbuf": "no Netty here",
    "angel.netty.matrixtransfer.server.rcvbuf": "no Netty here",
    "angel.netty.matrixtransfer.server.eventgroup.threadnum": "no Netty here",
    "angel.netty.matrixtransfer.server.usedirectbuffer": "no Netty here",
    "angel.netty.matrixtransfer.max.message.size": "messages are split per shard and step",
    "angel.matrixtransfer.max.requestnum.perserver": "a worker sends one request per shard "
    "and step",
    "angel.matrixtransfer.max.requestnum": "a worker sends one request per shard and step",
    "angel.matrixtransfer.retry.interval.ms": "a failed request fails the step "
    "(angel.matrixtransfer.request.timeout.ms bounds it)",
    "angel.psagent.cache.sync.timeinterval.ms": "the worker row cache is angel.worker.cache.enable",
    "angel.psagent.sync.policy.class": "the worker row cache is angel.worker.cache.enable",
    "angel.model.partitioner.partition.size": "shards split tables by angel.ps.partitioner",
    "angel.model.partitioner.max.partition.number": "one partition per shard here",
    "angel.model.partitioner.partition.number.perserver": "one partition per shard here",
    "angel.save.model.epoch.trigger.enable": "a checkpoint is written after every epoch, or "
    "every angel.save.model.every.howmany.epochs (angel.save.model.keep.last, "
    "angel.save.model.keep.best)",
    "ml.block.size": "rows travel per shard and step, not in blocks",
    "ml.optimizer.json.provider": "optimizers come from the ml.*.optimizer keys",
    "ml.data.is.classification": "the model class decides the task",
    "ml.model.is.classification": "the model class decides the task",
    "ml.batch.sample.ratio": "every epoch visits every training row once (batches are sized "
    "by ml.num.update.per.epoch)",
}

#: Keys that change training and are not implemented: fine at Angel's default, else an error.
_REFUSED = {
    "ml.data.posneg.ratio": (
        Key(
            "ml.data.posneg.ratio",
            "float",
            -1.0,
            "Angel's key: resampling of positives to negatives; only -1 (off) is accepted "
            "here (resampling is not implemented: resample the input file instead).",
        ),
        -1.0,
    ),
}

KEYS: list[Key] = [
    *(m.key for m in _MAPPED),
    OUTPUT_DELETE,
    *(
        Key(name, "str", None, f"Angel's key, accepted with no effect: {why}.")
        for name, why in _NO_EFFECT.items()
    ),
    *(k for k, _ in _REFUSED.values()),
]


def _shown(conf: Config, name: str) -> str:
    return f"{name}={format_value(conf[name])} ({conf.source(name)})"


def resolve(conf: Config) -> Config:
    """``conf`` with every set Angel key applied to the key it maps to (idempotent).

    ConfigError when an Angel key and our own key both set disagree, or when a refused key
    is set to anything but Angel's default."""
    for name, (_, default) in _REFUSED.items():
        if name in conf and conf.is_set(name) and conf[name] != default:
            raise ConfigError(f"{_shown(conf, name)}: {conf.declaration(name).doc}")  # type: ignore[union-attr]
    values: dict[str, Any] = {}
    groups: dict[str, list[str]] = {}
    for m in sorted(_MAPPED, key=lambda m: m.fill_only):  # a bound fills in last
        name = m.key.name
        if name not in conf or not conf.is_set(name) or conf[name] is None:
            continue
        groups.setdefault(m.target, []).append(name)
        value = m.convert(conf[name])
        if conf.source(m.target) == _SOURCE:
            continue  # applied by an earlier resolve (it is idempotent)
        if m.fill_only and (conf.is_set(m.target) or m.target in values):
            continue
        if m.target == "angel.workergroup.number":
            value = int(conf[m.target]) * int(value)
        if value is None:
            continue
        if m.target in values and values[m.target] != value:
            first = groups[m.target][0]
            raise ConfigError(
                f"{_shown(conf, first)} and {_shown(conf, name)} disagree: both set "
                f"{m.target}; keep one"
            )
        values[m.target] = value
    for target, value in list(values.items()):
        if target not in conf or not conf.is_set(target) or target == "angel.workergroup.number":
            continue
        if conf[target] == value:
            del values[target]  # the same value: nothing to apply
            continue
        raise ConfigError(
            f"{_shown(conf, groups[target][0])} sets {target}={format_value(value)}, but "
            f"{_shown(conf, target)}: keep one"
        )
    if "ml.model.size" in conf and conf.is_set("ml.model.size"):
        size = conf["ml.model.size"]
        limit = values.get("ml.feature.index.range", conf["ml.feature.index.range"])
        if limit is not None and int(limit) > 0 and int(size) > int(limit):
            raise ConfigError(
                f"{_shown(conf, 'ml.model.size')} is larger than the feature index range "
                f"{limit}: the model size counts the valid indices below it"
            )
    return conf.with_overrides(values, _SOURCE) if values else conf


def angel_notes(conf: Config) -> list[str]:
    """One line per Angel key set in ``conf``: what it sets here, or why it does nothing."""
    notes = []
    for m in _MAPPED:
        if m.key.name in conf and conf.is_set(m.key.name):
            if m.fill_only and m.target in conf and conf.is_set(m.target):
                # (it only fills the target: set too, the target stands and this is checked)
                notes.append(
                    f"note: {_shown(conf, m.key.name)} is checked against "
                    f"{_shown(conf, m.target)}, which sets the size (Angel's key)"
                )
                continue
            notes.append(f"note: {_shown(conf, m.key.name)} sets {m.target} (Angel's key)")
    for name, why in _NO_EFFECT.items():
        if name in conf and conf.is_set(name):
            notes.append(f"note: {_shown(conf, name)} has no effect here: {why}")
    return notes


def check_output_policy(conf: Config, key: str) -> None:
    """With ``angel.output.path.deleteonexist=false``, refuse an output path (``key``) that
    already exists, as Angel does: ConfigError naming both keys."""
    if OUTPUT_DELETE.read(conf) or key not in conf or not conf[key]:
        return
    path = str(conf[key])
    disk = files_for(path).disk_path(path)
    if disk is None or not os.path.lexists(disk):
        return  # (object storage: its checkpoints are replaced whole, as the docs say)
    raise ConfigError(
        f"{_shown(conf, key)} already exists and {_shown(conf, OUTPUT_DELETE.name)}: remove "
        f"it, choose another path, or set {OUTPUT_DELETE.name}=true"
    )
