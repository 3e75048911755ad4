"""Runs: each training run's own directory under the log root, and finding runs again.

A run writes to ``<angel.log.path>/<job>-<yyyymmdd-hhmmss>/`` (``metrics.jsonl``,
``summary.json``, TensorBoard events), so runs of one job never append into each other. The file
``<angel.log.path>/latest`` holds the name of the newest run (a plain file, replaced atomically:
unlike a symlink it survives copies, object stores and Windows). :func:`find_run` turns what a
user types (a run name, a run directory, a log root, a metrics.jsonl path) into that run's
metrics file.

An ``angel.log.path`` on object storage (``s3://...``) cannot be appended to: the run is written
into a local staging root (:func:`log_root`, private to the user) and :func:`upload_run` copies
the run directory and ``latest`` to the URL, whole files replacing whole objects (the learner
does it after every epoch and when the run ends, also on failure); the run is then named by its
URL, :func:`run_url`. :func:`find_run` finds runs there too, the same way, through
:func:`angelps.file_store.files_for` (pyarrow: loaded only for a URL, so that plotting a local
run stays light).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from angelps.file_store import FileStore, LocalFiles, files_for
from learners.runs.log_store import BACKUP_DIR, LATEST, run_logs_for, run_url

__all__ = [
    "BACKUP_DIR",
    "LATEST",
    "METRICS",
    "SUMMARY",
    "RunRef",
    "find_run",
    "latest_run",
    "log_root",
    "new_run_dir",
    "relative_under_ray_job",
    "run_url",
    "upload_run",
]

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
TIME_FORMAT = "%Y%m%d-%H%M%S"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# Set by Ray's job supervisor for the entry point of a `ray job submit` (its runtime env).
_RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


@dataclass(frozen=True)
class RunRef:
    """A run as ``angelps plot`` names it: its name (the legend) and its metrics file (a URL
    stays a string: pathlib would fold its ``//``)."""

    name: str
    metrics: Path | str


def run_name(job: str, when: float | None = None) -> str:
    """``<job>-<yyyymmdd-hhmmss>`` in local time, the job name made safe for a file name."""
    stamp = time.strftime(TIME_FORMAT, time.localtime(time.time() if when is None else when))
    return f"{_UNSAFE.sub('_', job).strip('._') or 'run'}-{stamp}"


def new_run_dir(root: str | os.PathLike[str], job: str, when: float | None = None) -> Path:
    """Create the directory of a new run under ``root`` and point ``root/latest`` at it.

    Two runs started in the same second get ``-2``, ``-3``... (``mkdir`` without exist_ok
    decides, so two processes never share a directory)."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    name = run_name(job, when)
    for i in range(1, 1000):
        candidate = base / (name if i == 1 else f"{name}-{i}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        _point_latest(base, candidate.name)
        return candidate
    raise FileExistsError(f"{base}: 999 runs named {name}-* already exist")


def drop_unstarted_run(run_dir: Path) -> bool:
    """Remove the folder of a run that ended before its first step or epoch record (bad data
    found by the workers, an interrupted start-up) and point ``latest`` back at the newest run
    left: an empty run would become the one ``angelps plot`` draws by default, and fail there.
    A run holding a record of training, or anything of a checkpoint, stays. Whether removed."""
    try:
        lines = (run_dir / METRICS).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = []
    except OSError:
        return False
    for line in lines:
        try:
            if json.loads(line).get("kind") in ("step", "epoch"):
                return False
        except (ValueError, AttributeError):
            return False  # (not ours to judge: kept)
    if any(p.name.startswith("model") for p in run_dir.iterdir()):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    root = run_dir.parent
    if latest_run(root) is None:  # (it pointed at the run removed)
        left = [p for p in root.iterdir() if p.is_dir() and (p / METRICS).is_file()]
        if left:
            _point_latest(root, max(left, key=lambda p: (p / METRICS).stat().st_mtime).name)
        else:
            (root / LATEST).unlink(missing_ok=True)
    return True


def log_root(path: str) -> str:
    """Where a run under ``angel.log.path`` is written: the path itself, or for a URL a local
    staging root of its own (the same for the same URL and user; mode 0700)."""
    return run_logs_for(path).staging_root()


def upload_run(run_dir: Path, url: str) -> None:
    """Copy the run directory (every file, whole) to ``<url>/<run name>/``, then ``latest``."""
    from angelps import fs  # pyarrow: only for a log path on object storage (plot stays light)

    for file in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = file.relative_to(run_dir).as_posix()
        fs.write_bytes(posixpath.join(run_url(url, run_dir.name), rel), file.read_bytes())
    fs.write_bytes(fs.join(url, LATEST), (run_dir.name + "\n").encode())


def _point_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.{os.getpid()}"
    tmp.write_text(name + "\n", encoding="utf-8")
    os.replace(tmp, root / LATEST)


def latest_run(root: str | os.PathLike[str]) -> Path | None:
    """The run ``root/latest`` names (a local log root), or None when there is none (or it is
    gone)."""
    try:
        name = _latest(LocalFiles(), str(root))
    except OSError:
        return None
    return Path(root) / name if name else None


def _pointed(text: str) -> str | None:
    """The run name a ``latest`` file holds; a name, never a path: a pointer file cannot lead
    outside its root."""
    name = text.strip()
    return None if not name or "/" in name or "\\" in name or name in (".", "..") else name


def _latest(store: FileStore, root: str) -> str | None:
    """The run ``<root>/latest`` names, or None (no pointer, or no such run)."""
    try:
        name = _pointed(store.read_bytes(store.join(root, LATEST)).decode("utf-8"))
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return name if name and store.is_dir(store.join(root, name)) else None


def find_run(arg: str | None, root: str | os.PathLike[str] = "runs") -> RunRef:
    """The run that ``arg`` names: a metrics.jsonl file, a run directory, a log root (its
    latest run), or a run name under ``root``; ``None``: the latest run under ``root``. Any of
    them may be a URL (``s3://...``), read through :func:`angelps.file_store.files_for`.
    ValueError saying what was looked for when there is no such run, or why the store cannot be
    read."""
    root = str(root)
    at_root = files_for(root)
    # Where to look, in order: a path on the disk first, then a run's name under the root.
    on_disk = arg is not None and files_for(arg).disk_path(arg) is not None
    places = [root] if arg is None else [arg, at_root.join(root, arg)] if on_disk else [arg]
    for place in dict.fromkeys(places):
        store = files_for(place)
        # The store, the bucket and the credentials first, in a few seconds: a clear line, no hang.
        why = store.probe(place, must_exist=False)
        if why:
            raise ValueError(f"{place}: {why}")
        try:
            ref = _run_at(store, place, latest_only=arg is None)
        except OSError as e:
            raise ValueError(f"{place}: {' '.join(str(e).split())}") from None
        if ref is not None:
            return ref
    shown = at_root.canonical(root)
    if arg is None:
        raise ValueError(_no_runs(shown, at_root.join(shown, LATEST)))
    try:  # the runs under the root as a hint, for a name looked for there
        known = _runs_under(at_root, root) if on_disk else []
    except OSError as e:
        raise ValueError(f"{places[-1]}: {' '.join(str(e).split())}") from None
    raise ValueError(_no_such_run(arg, shown, known))


def _run_at(store: FileStore, place: str, latest_only: bool) -> RunRef | None:
    """The run at ``place``: a metrics file, a run's folder, or a log root's latest run."""

    def ref(name: str, metrics: str) -> RunRef:
        return RunRef(name, store.disk_path(metrics) or metrics)

    if not latest_only:
        if store.is_file(place):
            base = posixpath.basename(place.rstrip("/"))
            parent = posixpath.basename(posixpath.dirname(place.rstrip("/")))
            return ref(parent if base == METRICS and parent else Path(base).stem, place)
        if store.is_file(store.join(place, METRICS)):
            name = posixpath.basename(store.canonical(place).rstrip("/"))
            return ref(name, store.join(place, METRICS))
    run = _latest(store, place)
    return None if run is None else ref(run, store.join(place, run, METRICS))


def _runs_under(store: FileStore, root: str) -> list[str]:
    """The runs (folders holding a metrics file) directly under the log root ``root``."""
    if not store.is_dir(root):
        return []
    return [n for n, d in store.list_dir(root) if d and store.is_file(store.join(root, n, METRICS))]


def _no_runs(root: str, pointer: str) -> str:
    return (
        f"no runs under {root} (no {pointer}): name a run, a run directory or a "
        "metrics.jsonl file, or point --log-dir at angel.log.path"
    )


def _no_such_run(arg: str, root: str, known: list[str]) -> str:
    known = sorted(known)  # (a run's name ends in its start time: the newest of a job last)
    cut = f" (the last 5 of {len(known)} by name)" if len(known) > 5 else ""
    hint = f"; runs under {root}{cut}: {', '.join(known[-5:])}" if known else ""
    return f"{arg}: no such run, run directory or metrics file{hint}"


def relative_under_ray_job(paths: dict[str, str | None]) -> str | None:
    """A note when this is a ``ray job submit`` entry point and an output path (key -> value)
    is relative: it would land in Ray's working directory for the job, deleted with it."""
    if _RAY_JOB_ENV not in os.environ:
        return None
    rel = [f"{k}={v}" for k, v in paths.items() if v and not files_for(v).is_absolute(v)]
    if not rel:
        return None
    return (
        f"angelps: note: {', '.join(rel)} {'is' if len(rel) == 1 else 'are'} relative to "
        f"{os.getcwd()}, the working directory Ray "
        "made for this job, which Ray deletes with it: give absolute paths to keep the outputs"
    )
