"""A learner on disk: checkpoints written during training, resumed, or loaded for prediction.

A saved model is a PS checkpoint (``angelps.checkpoint.files``: the tables with their optimizer
state, renamed into place whole) whose manifest carries a ``learner`` section in its ``extra``:
the epoch, scheduler state, history, early-stopping state, the model's shape and table specs,
the job's explicitly set keys, every worker's RNG stream, and the SHA-256 of
``dense.safetensors``: the worker-side state (dense layers, their optimizer state), a
safetensors file beside the Parquet tables that ``safetensors.torch.load_file`` reads.
Invariant: the dense file is written inside the PS checkpoint's temporary directory, before the
manifest and the atomic rename, so a reader never sees a new PS half with an old worker half.
Checkpoints written before the dense file (an ``.npz`` in base64 inside the manifest) are still
read.

Nothing damaged is used: the manifest, every table file and the dense file are checked against
their SHA-256
(``angelps.checkpoint.files``) whenever they are read. :func:`resume_point` checks the whole checkpoint
before anything starts; when the latest is damaged or has no manifest and ``<path>.prev`` (the
previous good checkpoint, kept by every save) is sound, it moves the damaged one aside to
``<path>.damaged-<id>`` and the previous one back to ``<path>``, says so on stderr, and the job
resumes from the previous one. Every other reader (evaluate, predict, export, load) refuses a
checkpoint without its manifest with an error naming it (``angelps.checkpoint.local_dir.resolve``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from angelconf.config import Config, ConfigError
from angelps import PSClient, TableSpec, fs
from angelps.checkpoint import files as checkpoint
from angelps.checkpoint.files import CheckpointDamaged
from angelps.checkpoint.store import store_for
from angelps.client.pending_save import PendingSave
from angelps.client.recovery import SHARD_LOST
from learners.data.problems import printable
from learners.models.angel_json import check_saved_graph
from learners.models.registry import model_name
from learners.worker.group import WorkerGroup

_LOAD = "angel.load.model.path"
#: The worker-side (dense) layers' file beside the tables: safetensors.
DENSE_FILE = "dense.safetensors"
_MODEL = "ml.model.class.name"

__all__ = [
    "DENSE_FILE",
    "check_tables",
    "dense_blob",
    "inference_conf",
    "load_dense",
    "read_extra",
    "replaced_note",
    "restore",
    "resume_point",
    "save",
]


class _HeldFiles:
    """The tables the workers hold, written by every worker into a checkpoint's temporary
    directory (one file per worker and table, as the shards write theirs)."""

    tables: Sequence[TableSpec]

    def __init__(self, tables: Sequence[TableSpec], workers: WorkerGroup) -> None:
        self.tables = list(tables)
        self.owners = len(workers)
        self.workers = workers

    def start(self, root: str, background: bool) -> Callable[[], Mapping[str, Any]]:
        parts = self.workers.execute("save_held", root, background)
        if not background:
            return lambda: _merged(parts)
        return self._written

    def _written(self) -> dict[str, Any]:
        """Every worker's files, once written. A worker serves one call at a time: asking
        whether its files are written waits for its current call (a chunk of training, a
        quarter of a second), while a call that waited for the files would hold up the
        chunks queued behind it; so ask, and ask again."""
        parts: list[Any] = [None] * self.owners
        while True:
            todo = [i for i, p in enumerate(parts) if p is None]
            if not todo:
                return _merged(parts)
            for i, part in zip(todo, self.workers.execute_some(todo, "held_saved"), strict=True):
                parts[i] = part
            if any(p is None for p in parts):
                time.sleep(_POLL_S)


#: Seconds between two asks of an idle worker whether its checkpoint files are written.
_POLL_S = 0.02


def _merged(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    files: dict[str, Any] = {}
    for part in parts:
        files.update(part)
    return files


def save(
    path: str,
    ps: PSClient,
    workers: WorkerGroup,
    section: Mapping[str, Any],
    held: Sequence[TableSpec] = (),
    background: bool = False,
) -> PendingSave | None:
    """Checkpoint the PS tables and the workers' state, with ``section`` as the learner's part
    of the manifest (JSON-safe); ``held``: the tables the workers hold (their files go into
    the same checkpoint, in the shards' format). ``background``: return once every table is
    copied, its files being written meanwhile; the result's ``result()`` commits
    (angelps.client.pending_save)."""
    info = dict(section)
    # A device tier's rows go back to the shards first: the shards' files hold whole tables;
    # so do the pushes a shard restarted since the last step lacks (it refuses a save before).
    workers.execute("before_save")
    # The worker-side layers go to dense.safetensors beside the tables, inside the PS
    # checkpoint's atomic commit; its SHA-256 is in the manifest, which checks itself.
    blob = workers.execute_single(0, "dense_state")
    info["dense"] = {"file": DENSE_FILE, "sha256": hashlib.sha256(blob).hexdigest()}
    rngs = workers.execute("rng_state")
    info["worker_rng_b64"] = [base64.b64encode(r).decode("ascii") for r in rngs]
    how = ps.save_async if background else ps.save
    files = {DENSE_FILE: blob}
    try:
        return how(path, {"learner": info}, files, _HeldFiles(held, workers) if held else None)
    except SHARD_LOST as e:
        # A shard died (or Ray restarted one) since the workers caught up: nothing was
        # committed, and training has not moved on (it waits for the rows' copies), so the
        # workers catch up again (replaying what the restarted shard lacks) and the same
        # checkpoint is written once more; a second failure is the save's error.
        print(
            f"angelps: warning: a parameter shard failed while the checkpoint was written "
            f"({type(e).__name__}); the workers replay their pushes to it and it is written "
            "again",
            file=sys.stderr,
            flush=True,
        )
    workers.execute("before_save")
    return how(path, {"learner": info}, files, _HeldFiles(held, workers) if held else None)


def restore(
    path: str, ps: PSClient, workers: WorkerGroup, held: Sequence[TableSpec] = ()
) -> dict[str, Any]:
    """Load a checkpoint into the PS and the workers (to resume it, or to start from its
    weights and optimizer state: ``angel.load.model.path``); the learner section of its
    manifest. ``held``: the tables the workers hold, which each reads its rows of (from
    files the shards or workers wrote, any number of them)."""
    read_extra(path)  # a clear error before the shards are touched
    info: dict[str, Any] = ps.load(path, held)["learner"]
    workers.execute("reset_tiers")  # (the device tiers refill from the restored shards)
    if held:
        manifest = checkpoint.read_manifest(path)
        workers.execute("load_held", manifest["root"], manifest)
    load_dense(info, workers, path)
    # Clocks restart at 0 after a load: hand the workers fresh clients.
    workers.attach_ps(ps)
    return info


def dense_blob(info: Mapping[str, Any], where: str) -> bytes:
    """The worker-side layers of the checkpoint at ``where`` (learner section ``info``),
    checked against their SHA-256: ``dense.safetensors``, or the base64 ``.npz`` inside the
    manifest of checkpoints written before it (still read)."""
    entry = info.get("dense")
    if entry is None:
        try:
            return base64.b64decode(info["dense_npz_b64"], validate=True)
        except (KeyError, TypeError, binascii.Error) as e:
            raise CheckpointDamaged(
                f"checkpoint {where}: the worker-side layers in its manifest are damaged ({e})"
            ) from None
    file = checkpoint.member(checkpoint.read_manifest(where)["root"], str(entry["file"]))
    try:
        blob = fs.read_bytes(file)  # a local file, or an object (s3://...)
    except OSError as e:
        raise CheckpointDamaged(f"checkpoint file {file} is missing ({e.strerror or e})") from None
    if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
        raise CheckpointDamaged(
            f"checkpoint file {file} is damaged: its SHA-256 does not match the manifest"
        )
    return blob


def load_dense(info: Mapping[str, Any], workers: WorkerGroup, where: str = "checkpoint") -> None:
    """The worker-side layers of the checkpoint at ``where`` into every worker (and, when the
    number of workers is the one that saved it, every worker's own RNG stream)."""
    blob = dense_blob(info, where)
    try:
        rngs = [base64.b64decode(r, validate=True) for r in info.get("worker_rng_b64") or []]
    except (TypeError, binascii.Error) as e:
        raise CheckpointDamaged(
            f"checkpoint {where}: the worker RNG states in its manifest are damaged ({e})"
        ) from None
    workers.execute("load_dense_state", blob)
    if len(rngs) == len(workers):
        # Every worker continues its own dropout stream (resuming with the same W).
        workers.execute_each("set_rng_state", [(r,) for r in rngs])


def resume_point(path: str) -> dict[str, Any]:
    """The ``extra`` of the checkpoint ``--resume`` continues from, every file checked; before
    any actor starts. The documented fallback, said on the console: when the latest checkpoint
    is missing its manifest (a save that stopped between its renames) or is damaged, and
    ``<path>.prev`` is sound, the latest (if any) is moved aside to ``<path>.damaged-<id>`` and
    the previous one back to ``<path>``, where the restore reads it; damaged without a sound
    previous one, it is a CheckpointDamaged naming the file."""
    store = store_for(path)
    restored = store.restore_interrupted(path)
    if restored is not None:
        root, aside = restored
        kept = f"; what was at {os.path.abspath(path)} is kept as {aside}" if aside else ""
        print(
            printable(
                f"angelps: note: resuming from {root} (the latest save did not complete){kept}"
            ),
            file=sys.stderr,
        )
    try:
        _verify(path)
    except CheckpointDamaged as damaged:
        prev = checkpoint.previous(path)
        if prev is None or not store.holds_latest(path):
            raise
        try:
            _verify(prev)
        except CheckpointDamaged as e:
            raise CheckpointDamaged(
                f"{damaged}; the previous checkpoint is damaged too: {e}"
            ) from None
        aside = store.roll_back(path, prev)
        print(
            printable(
                f"angelps: warning: {damaged}; resuming from the previous checkpoint {prev} "
                f"(the damaged one is kept as {aside})"
            ),
            file=sys.stderr,
        )
    except checkpoint.CheckpointError:
        pass  # not a checkpoint at all: read_extra below says so
    return read_extra(path)


def replaced_note(path: str, model: str) -> str | None:
    """A note when the checkpoint at ``path`` is of another model than ``model`` (Angel's class
    name): a job that trains there afresh replaces it at its first save (Angel's
    ``angel.output.path.deleteonexist``, true by default), keeping it only as ``<path>.prev``
    until the save after, and its ``.best`` goes at once. None where the path holds no
    checkpoint, one of the same model, or one that cannot be read (the save says so)."""
    try:
        learner = checkpoint.read_manifest(path).get("extra", {}).get("learner", {})
    except Exception:  # (a note only: what cannot be read is said by the save)
        return None
    old = learner.get("model")
    if not old or old == model:
        return None
    epoch = learner.get("epoch")
    shown = f" (epoch {epoch + 1})" if isinstance(epoch, int) else ""  # (1-based, as said)
    return (
        f"angelps: note: {path} holds a {old} checkpoint{shown}; "
        f"this {model} job replaces it at its first save (kept as {path}.prev until the save "
        f"after; its best epoch's, {path}.best, is replaced too). To keep it, stop and set "
        "angel.save.model.path to another folder, or angel.output.path.deleteonexist=false"
    )


def _verify(path: str) -> dict[str, Any]:
    """The manifest of ``path`` after checking every table file and the dense file."""
    manifest = checkpoint.verify(path)
    learner = manifest.get("extra", {}).get("learner")
    if learner is not None:
        dense_blob(learner, path)
    return manifest


def read_extra(path: str | Path) -> dict[str, Any]:
    """The ``extra`` of a saved model's manifest; ConfigError when ``path`` holds none,
    CheckpointDamaged (naming the file) when its manifest is damaged."""
    try:
        manifest = checkpoint.read_manifest(str(path))
    except (CheckpointDamaged, checkpoint.NoCheckpoint):
        raise  # their messages name the path (and an older checkpoint beside it)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not a saved angelps model: {e}") from None
    extra = dict(manifest.get("extra", {}))
    if "learner" not in extra:
        raise ConfigError(f"{path} is a PS checkpoint without a model (no learner section)")
    return extra


def inference_conf(conf: Config, info: Mapping[str, Any], where: str) -> Config:
    """The job ``conf`` as the saved model of ``where`` (learner section ``info``) runs it: the
    model's own ``ml.*`` settings (data format, label transform, shape) where the job does not
    set them, one worker. A job that names another model is a ConfigError."""
    saved = str(info["model"])
    if conf.is_set(_MODEL) and model_name(str(conf[_MODEL])).lower() != saved.lower():
        raise ConfigError(
            f"{_LOAD}={where} holds a {saved} model, but {_MODEL}={conf[_MODEL]} "
            f"({conf.source(_MODEL)}): load a {conf[_MODEL]} model or set {_MODEL}={saved}"
        )
    check_saved_graph(conf, info, where)  # an AngelModel: the job's JSON layers, if it names one
    own = {
        k: v
        for k, v in dict(info.get("conf", {})).items()
        if k.startswith("ml.") and not conf.is_set(k) and k in conf
    }
    return conf.with_overrides({**own, "angel.workergroup.number": 1, _MODEL: saved})


def _shape(t: TableSpec | Mapping[str, Any]) -> str:
    d = t.to_dict() if isinstance(t, TableSpec) else t
    return f"{'sparse' if d.get('sparse') else 'dense'} {d['rows']} x {d['cols']}"


def check_tables(built: list[TableSpec], info: Mapping[str, Any], conf: Config, where: str) -> None:
    """ConfigError when the tables of the job's model (``built``) are not the saved ones:
    names, rows and columns; the message names the path and the job's keys that differ."""
    saved = {str(d["name"]): _shape(d) for d in info["tables"]}
    wanted = {t.name: _shape(t) for t in built}
    if saved == wanted:
        return
    diff = [
        f"{name}: {saved.get(name, 'absent')} there, {wanted.get(name, 'absent')} here"
        for name in sorted(set(saved) | set(wanted))
        if saved.get(name) != wanted.get(name)
    ]
    own, props = dict(info.get("conf", {})), conf.to_properties()
    keys = [
        f"{k}={props.get(k, '')} ({conf.source(k)})"
        for k in conf
        if k.startswith("ml.")
        and conf.is_set(k)
        and conf.source(k) != "program"
        and str(own.get(k, "")) != props.get(k, "")
    ]
    because = f"; the job sets {', '.join(keys)}" if keys else ""
    raise ConfigError(
        f"{_LOAD}={where}: the saved {info['model']} model's tables do not match the job's "
        f"model ({'; '.join(diff)}){because}"
    )
