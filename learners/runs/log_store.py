"""Where a job's runs are logged (``angel.log.path``): a local folder, or object storage.

A local log path is written in place: each run's folder under it, ``latest`` beside them, the
shard backups in ``ps-backup`` (:class:`LocalRunLogs`). Object storage cannot be appended to:
the runs are written into a local staging root private to the user and copied to the URL
whole (:class:`ObjectRunLogs`; :func:`learners.runs.folders.upload_run`). :func:`run_logs_for`
is the one place that looks at the path to choose (by :func:`angelps.file_store.is_url`, the
test the readers choose by). Standard library only, so that the light commands (``angelps
plot``, ``conf``) load no pyarrow for it.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
from pathlib import Path
from typing import Protocol

from angelps.file_store import is_url

__all__ = [
    "BACKUP_DIR",
    "LATEST",
    "LocalRunLogs",
    "ObjectRunLogs",
    "RunLogStore",
    "run_logs_for",
    "run_url",
]

LATEST = "latest"
#: The folder under the log path that holds a job's shard backups (learners.job.failover).
BACKUP_DIR = "ps-backup"


def run_url(url: str, name: str) -> str:
    """Where :func:`learners.runs.folders.upload_run` puts the run ``name`` of the log URL."""
    return posixpath.join(url, name)


class RunLogStore(Protocol):
    """The runs of one log path: where they are written, where they are found, what the job
    writes there by itself."""

    #: the URL a run is copied to after it is written locally (None: written in place)
    upload_to: str | None

    def staging_root(self) -> str:
        """The local folder the runs are written into."""
        ...

    def home(self, run_dir: Path) -> str:
        """Where the run written into ``run_dir`` is found (its folder, or its URL)."""
        ...

    def own_folders(self) -> list[tuple[str, str]]:
        """(folder, what it is) of the local folders the job writes and removes by itself."""
        ...


class LocalRunLogs:
    """Runs in a local folder, written in place."""

    upload_to: str | None = None

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def staging_root(self) -> str:
        return self.log_dir

    def home(self, run_dir: Path) -> str:
        return str(run_dir)

    def own_folders(self) -> list[tuple[str, str]]:
        return [
            (
                os.path.join(self.log_dir, BACKUP_DIR),
                f"the shard backups' folder (angel.log.path/{BACKUP_DIR})",
            ),
            (os.path.join(self.log_dir, LATEST), f"the latest run's pointer ({LATEST})"),
        ]


class ObjectRunLogs:
    """Runs on object storage: staged locally, copied whole to the URL."""

    def __init__(self, url: str) -> None:
        self.upload_to: str | None = url
        self.url = url

    def staging_root(self) -> str:
        # The same root for the same URL and user (mode 0700): a run resumed finds its files.
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        root = os.path.join(tempfile.gettempdir(), f"angelps-{os.getuid()}", "log-staging", digest)
        os.makedirs(root, mode=0o700, exist_ok=True)
        return root

    def home(self, run_dir: Path) -> str:
        return run_url(self.url, run_dir.name)

    def own_folders(self) -> list[tuple[str, str]]:
        return []  # nothing local: the staging root is the job's own, outside the log path


def run_logs_for(log_dir: str) -> RunLogStore:
    """The runs of ``log_dir``: on object storage for a URL, else in a local folder."""
    return ObjectRunLogs(log_dir) if is_url(log_dir) else LocalRunLogs(log_dir)
