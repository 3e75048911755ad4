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
URL, :func:`run_url`. :func:`find_run` finds runs there too, through :mod:`angelps.fs` (pyarrow:
imported only for a URL, so that plotting a local run stays light).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from learners.runs.log_store import BACKUP_DIR, LATEST, is_url, run_logs_for, run_url

__all__ = [
    "BACKUP_DIR",
    "LATEST",
    "METRICS",
    "SUMMARY",
    "RunRef",
    "find_run",
    "is_url",
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
    """The run ``root/latest`` names, or None when there is none (or it is gone)."""
    try:
        name = _pointed(Path(root, LATEST).read_text(encoding="utf-8"))
    except OSError:
        return None
    run = Path(root) / name if name else None
    return run if run is not None and run.is_dir() else None


def _pointed(text: str) -> str | None:
    """The run name a ``latest`` file holds; a name, never a path: a pointer file cannot lead
    outside its root."""
    name = text.strip()
    return None if not name or "/" in name or "\\" in name or name in (".", "..") else name


def find_run(arg: str | None, root: str | os.PathLike[str] = "runs") -> RunRef:
    """The run that ``arg`` names: a metrics.jsonl file, a run directory, a log root (its
    latest run), or a run name under ``root``; ``None``: the latest run under ``root``. Any of
    them may be a URL (``s3://...``): read through :mod:`angelps.fs`. ValueError saying what
    was looked for when there is no such run, or why the store cannot be read."""
    if is_url(arg or "") or (arg is None and is_url(str(root))):
        return _find_url(arg, str(root))
    if arg is None:
        run = latest_run(root)
        if run is None:
            raise ValueError(_no_runs(str(Path(root)), str(Path(root, LATEST))))
        return RunRef(run.name, run / METRICS)
    p = Path(arg)
    if p.is_file():
        name = p.parent.name if p.name == METRICS and p.parent.name else p.stem
        return RunRef(name, p)
    # A local directory first, as without a URL; then a run's name under a URL log root.
    for d in (p,) if is_url(str(root)) else (p, Path(root) / arg):
        if (d / METRICS).is_file():
            return RunRef(d.name, d / METRICS)
        run = latest_run(d) if d.is_dir() else None
        if run is not None:
            return RunRef(run.name, run / METRICS)
    if is_url(str(root)):
        return _find_url(arg, str(root))
    root = Path(root)
    known = (
        sorted(d.name for d in root.iterdir() if (d / METRICS).is_file()) if root.is_dir() else []
    )
    raise ValueError(_no_such_run(arg, str(root), known))


def _no_runs(root: str, pointer: str) -> str:
    return (
        f"no runs under {root} (no {pointer}): name a run, a run directory or a "
        "metrics.jsonl file, or point --log-dir at angel.log.path"
    )


def _no_such_run(arg: str, root: str, known: list[str]) -> str:
    hint = f"; runs under {root}: {', '.join(known[-5:])}" if known else ""
    return f"{arg}: no such run, run directory or metrics file{hint}"


def _find_url(arg: str | None, root: str) -> RunRef:
    """:func:`find_run` on object storage: ``arg`` a URL, a run's name under the URL ``root``,
    or None (the latest run under ``root``)."""
    from angelps import fs  # pyarrow: only for a URL

    target = root if arg is None else arg if is_url(arg) else posixpath.join(root, arg)
    # The store, the bucket and the credentials first, in a few seconds: a clear line, no hang.
    why = fs.probe(target, must_exist=False)
    if why:
        raise ValueError(f"{target}: {why}")
    try:
        if arg is None:
            run = _latest_url(root)
            if run is None:
                raise ValueError(_no_runs(root, posixpath.join(root, LATEST)))
            return RunRef(run, posixpath.join(root, run, METRICS))
        if fs.is_file(target):
            base = posixpath.basename(target.rstrip("/"))
            parent = posixpath.basename(posixpath.dirname(target.rstrip("/")))
            return RunRef(parent if base == METRICS and parent else Path(base).stem, target)
        if fs.is_file(posixpath.join(target, METRICS)):
            return RunRef(posixpath.basename(target.rstrip("/")), posixpath.join(target, METRICS))
        run = _latest_url(target)
        if run is not None:
            return RunRef(run, posixpath.join(target, run, METRICS))
        # A name under the root: the runs there as a hint (any folder of a log root is one).
        known = [] if is_url(arg) else [n for n, d in fs.list_dir(root) if d]
    except OSError as e:
        raise ValueError(f"{target}: {' '.join(str(e).split())}") from None
    raise ValueError(_no_such_run(arg, root, known))


def _latest_url(root: str) -> str | None:
    """The run ``<root>/latest`` names on object storage, or None (no pointer, or no run)."""
    from angelps import fs

    try:
        name = _pointed(fs.read_bytes(posixpath.join(root, LATEST)).decode("utf-8"))
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return name if name and fs.is_dir(posixpath.join(root, name)) else None


def relative_under_ray_job(paths: dict[str, str | None]) -> str | None:
    """A note when this is a ``ray job submit`` entry point and an output path (key -> value)
    is relative: it would land in Ray's working directory for the job, deleted with it."""
    if _RAY_JOB_ENV not in os.environ:
        return None
    rel = [f"{k}={v}" for k, v in paths.items() if v and not os.path.isabs(v) and "://" not in v]
    if not rel:
        return None
    return (
        f"angelps: note: {', '.join(rel)} {'is' if len(rel) == 1 else 'are'} relative to "
        f"{os.getcwd()}, the working directory Ray "
        "made for this job, which Ray deletes with it: give absolute paths to keep the outputs"
    )
