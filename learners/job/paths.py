"""The path keys of a job, made absolute on the driver before any actor sees them.

A worker or a shard runs in a directory of Ray's choosing (on another node, inside the job's
unpacked working directory under ``ray job submit``, or wherever the raylet runs), so a path
such as ``data/a9a/a9a_123d_train.libsvm`` means what the user meant only in the directory of
the command. :func:`absolute_paths` resolves every path key against that directory (under
``ray job submit`` the driver runs in the job's working directory, so the same rule holds
there) and keeps where each value came from, for error messages.

Standard library only: the command line calls it before torch and Ray load.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from angelconf.config import Config, ConfigError
from angelps.file_store import files_for
from learners.keys import all_keys

__all__ = [
    "PATH_KEYS",
    "READ_KEYS",
    "absolute",
    "absolute_paths",
    "cannot_write",
    "check_out_folder",
    "check_url",
    "relative_notes",
]

#: Every key whose value is a file or directory read or written by the job.
PATH_KEYS = (
    "angel.train.data.path",
    "angel.validate.data.path",
    "angel.predict.data.path",
    "angel.predict.out.path",
    "angel.save.model.path",
    "angel.load.model.path",
    "angel.log.path",
    "angel.ps.backup.path",
)


#: The path keys a job reads: on object storage they must exist before the job starts.
READ_KEYS = (
    "angel.train.data.path",
    "angel.validate.data.path",
    "angel.predict.data.path",
    "angel.load.model.path",
)


def check_url(conf: Config, key: str) -> bool:
    """For a path key whose value is a URL: ConfigError (one line naming the key and the path)
    when the store cannot be reached in a few seconds, the credentials are refused, the bucket
    does not exist, or a path the job reads is absent; nothing is written. False when the
    value is a local path (the caller checks it on the disk), True when the URL was checked."""
    value = conf[key] if key in conf else None
    if not (isinstance(value, str) and value):
        return False
    store = files_for(value)
    why = store.probe(value, must_exist=key in READ_KEYS)
    if why is not None:
        raise ConfigError(f"{key}={value} ({conf.source(key)}): {why}")
    return store.disk_path(value) is None


def absolute(path: str, base: str | None = None) -> str:
    """``path`` against ``base`` (default: the current directory); ``~`` expanded; a URL
    (``scheme://...``, read through pyarrow.fs) is left as it is, but ``file://`` is a local
    path."""
    return files_for(path).absolute(path, base)


def absolute_paths(conf: Config, base: str | None = None) -> Config:
    """``conf`` with every non-empty relative path key made absolute against ``base``
    (default: the current directory). Each value keeps its source."""
    changed = {
        k: absolute(v, base)
        for k in PATH_KEYS
        if k in conf and isinstance(v := conf[k], str) and v and absolute(v, base) != v
    }
    if not changed:
        return conf
    values = {k: changed.get(k, conf[k]) for k in conf}
    sources = {k: conf.source(k) for k in conf if conf.is_set(k)}
    return Config(values, sources, all_keys())


def relative_notes(conf: Config, address: str | None) -> list[str]:
    """One note per path key whose value is relative, when the job runs on a Ray cluster
    (``--address``, ``RAY_ADDRESS`` or ``ray job submit``): such a path means this machine's
    directory (under ``ray job submit``, the job's working directory, deleted with it),
    which the actors on other nodes do not see. Empty on a private local Ray."""
    in_job = "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ
    if not (address or os.environ.get("RAY_ADDRESS") or in_job):
        return []
    where = (
        f"{os.getcwd()}, the working directory Ray made for this job (deleted with it)"
        if in_job
        else f"{os.getcwd()} on this machine"
    )
    notes = []
    for key in PATH_KEYS:
        value = conf[key] if key in conf else None
        shown = f"{key}={value} ({conf.source(key)})"
        if key == "angel.log.path" and not value and not in_job:
            shown = f"{key} (unset: runs)"  # (under ray job submit the run log says so)
        elif not (isinstance(value, str) and value) or files_for(value).is_absolute(value):
            continue
        notes.append(
            f"angelps: note: {shown} is relative to {where}; actors on other nodes do not "
            "see it: give an absolute path on a shared file system, or a URL"
        )
    return notes


def check_out_folder(shown: str, parent: Path) -> None:
    """ConfigError, naming ``shown`` (the option or key and its value), unless ``parent``, the
    folder an output file goes to, is an existing directory this process can write in (it is
    not created: as every verb's output)."""
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"{shown}: {parent} is a file, not a directory")
    if not parent.is_dir():
        raise ConfigError(f"{shown}: the directory {parent} does not exist")
    why = cannot_write(parent)
    if why is not None:
        raise ConfigError(f"{shown}: cannot write there ({why}); choose a folder you can write to")


def cannot_write(folder: str | os.PathLike[str]) -> str | None:
    """Why files cannot be written in ``folder`` or in folders made under it (its nearest
    existing ancestor is tried: a folder is made there and removed), or None where they can.
    A real attempt, not ``os.access``: root passes that check where /proc, /sys or a
    read-only mount still refuse the write, which then failed after the job's work."""
    here = Path(folder)
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{here} is a file, not a folder"
    try:
        probe = tempfile.mkdtemp(prefix=".angelps-probe-", dir=here)
    except OSError as e:
        if e.errno == errno.ENOENT:  # (/proc: the folder is there, but takes no new entries)
            return f"{here}: it takes no new folders ({e.strerror})"
        return f"{here}: {e.strerror or e}"
    shutil.rmtree(probe, ignore_errors=True)
    return None
