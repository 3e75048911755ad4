"""The private local Ray a job starts for itself: bound to 127.0.0.1, in a folder of its own,
without colour codes in files, and ended at once on SIGTERM.

:mod:`learners.job.cluster` starts and stops it; this module holds what only a private Ray needs:
Ray's switch that keeps every socket on the loopback address (:func:`loopback_only`), the
0700 folder of its session (:data:`tmp_dir`, removed by :func:`remove_tmp`), plain
``(Actor pid=...)`` prefixes off a terminal (:func:`plain_prefixes`), and the immediate end of
its processes after a SIGTERM to the whole process group (:func:`kill`, :data:`abandoned`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile

from ray._private import ray_constants
from ray._private import worker as ray_worker

from angelconf.printable import uncoloured

__all__ = [
    "abandoned",
    "kill",
    "loopback_only",
    "new_tmp",
    "plain_prefixes",
    "remove_tmp",
    "tmp_dir",
]

#: Where a private Ray's folder goes (RAY_TMPDIR when set): short, as Ray's Unix socket paths
#: must stay under 107 bytes.
_TMP_ROOT = "/tmp" if os.path.isdir("/tmp") else None
#: The folder of the private Ray this process started (None: none, or a joined cluster).
tmp_dir: str | None = None
#: Set when learners.job.cluster.stop ended a private Ray at once without Ray's shutdown: the
#: process must then end without Ray's exit handler (learners.cli.main.end), which would wait for it.
abandoned = False
#: Ray's cluster switch as it was before a private Ray set it (:func:`loopback_only`).
_saved_cluster_env: tuple[str | None, bool] | None = None


def new_tmp() -> str:
    """A new 0700 folder for the private Ray's session (under RAY_TMPDIR or /tmp: short, as
    Ray's Unix socket paths must stay under 107 bytes); removed by :func:`remove_tmp`."""
    global tmp_dir
    root = os.environ.get("RAY_TMPDIR") or _TMP_ROOT
    tmp_dir = tempfile.mkdtemp(prefix="angelps-ray-", dir=root)
    return tmp_dir


class _Uncoloured(logging.Filter):
    """Ray's log records without colour codes (an "Unhandled error" line quotes a remote
    traceback, whose header Ray colours)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "\x1b" in text:
            record.msg, record.args = uncoloured(text), None
        return True


def plain_prefixes() -> None:
    """No colour codes around Ray's ``(Actor pid=...)`` prefixes, nor in the lines Ray's
    driver-side logger writes, when the output is not a terminal (a log file, a pipe) or
    NO_COLOR is set; a RAY_COLOR_PREFIX of the user wins."""
    tty = all(getattr(f, "isatty", lambda: False)() for f in (sys.stdout, sys.stderr))
    if not tty or os.environ.get("NO_COLOR"):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        for handler in logging.getLogger("ray").handlers:
            if not any(isinstance(f, _Uncoloured) for f in handler.filters):
                handler.addFilter(_Uncoloured())


def loopback_only(on: bool) -> None:
    """A private Ray on 127.0.0.1 only (``on``), or Ray's own choice of address again.

    Ray replaces a node address of 127.0.0.1 by the machine's own (``_node_ip_address`` is
    "resolved for localhost"), and its gRPC servers (GCS, raylet, object manager, every worker
    and driver) then listen on all interfaces. Its switch for machines that run no clusters
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: the node address is the loopback one) makes every
    process of the node, the dashboard agent and the metrics exporters included, listen on
    127.0.0.1 only: set for this process (Ray read it at import: its constant too) and, through
    the environment, for every process the private Ray starts; undone by the stop
    (learners.job.cluster.stop), so that a later join registers the driver at a reachable
    address."""
    global _saved_cluster_env
    if on:
        _saved_cluster_env = (
            os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR),
            ray_constants.ENABLE_RAY_CLUSTER,
        )
        os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
        return
    if _saved_cluster_env is None:
        return
    env, const = _saved_cluster_env
    _saved_cluster_env = None
    if env is None:
        os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
    else:
        os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = env
    ray_constants.ENABLE_RAY_CLUSTER = const


def remove_tmp() -> None:
    """Remove the folder of the private Ray this process started (its session: logs, sockets,
    spilled objects), once that Ray is down."""
    global tmp_dir
    tmp, tmp_dir = tmp_dir, None
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def kill() -> None:
    """SIGKILL every process of the private Ray this driver started (Ray's own record) and the
    workers below its raylet, and reap them: what a SIGTERM to the whole process group leaves
    half-stopped (each of them in its own slow shutdown), so that ray.shutdown does not wait
    seconds for answers that will not come."""
    try:
        started = getattr(ray_worker._global_node, "all_processes", {})
        procs = [info.process for infos in started.values() for info in infos]
    except Exception:
        return
    pids = {p.pid for p in procs}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, below = list(pids), []
    while todo:
        for c in children.get(todo.pop(), []):
            below.append(c)
            todo.append(c)
    for pid in [*below, *pids]:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
