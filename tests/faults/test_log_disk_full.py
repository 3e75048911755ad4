"""Fault matrix: a full disk under ``angel.log.path``.

``angelps train`` runs in a private mount namespace (as in ``test_disk_full.py``) where
``angel.log.path`` lies on a tmpfs with 12 KiB, then 28 KiB, of room: the job stops before it
starts anything, exit 1, one line naming the path, the free space and the space it needs, no
traceback, nothing written on that disk. A shard backup that runs out of room leaves no
temporary behind (the previous backup and its pointer untouched).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from angelps.checkpoint import backups
from angelps.server.shard import ParameterShard
from angelps.table import TableSpec
from learners.job.disk_space import LOG_MIN_FREE
from tests.faults.test_disk_full import _run, _train, namespaces  # noqa: F401 (a fixture)


@pytest.mark.namespaces
@pytest.mark.usefixtures("namespaces")
def test_a_full_log_disk_is_one_line_and_nothing_written(tmp_path: Path) -> None:
    log = tmp_path / "disk" / "log"
    job = _train(tmp_path, **{"angel.log.path": log, "angel.save.model.path": tmp_path / "m"})
    runs = _run(tmp_path, [("12k", job), ("28k", job)])
    assert LOG_MIN_FREE == 1 << 20
    for run, free in zip(runs, ("12 KiB", "28 KiB"), strict=True):
        assert run["rc"] == 1, run["err"]
        assert run["err"] == (
            f"angelps: failed: DiskFull: angel.log.path={log}: {free} free on its disk, the job "
            "needs at least 1 MiB there (its run files and shard backups): make room or choose "
            "another angel.log.path; nothing was written\n"
            "angelps: set ANGELPS_DEBUG=1 for the traceback\n"
        )
        assert os.listdir(run["disk"]) == []
    assert not (tmp_path / "m").exists()


def test_a_backup_that_runs_out_of_room_leaves_no_temporary(tmp_path, monkeypatch):
    shard = ParameterShard(0, 1, [TableSpec("w", rows=8, cols=2)])
    shard.push(0, 0, {"w": (np.arange(8), np.ones((8, 2)))}, 0.1)
    first = backups.write_backup(str(tmp_path), shard, {"clock": 0})
    real = backups.write_manifest

    def full(root, manifest):
        if "tmp-" in os.path.basename(root):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(root, manifest)

    monkeypatch.setattr(backups, "write_manifest", full)
    with pytest.raises(OSError, match="No space left on device"):
        backups.write_backup(str(tmp_path), shard, {"clock": 1})
    assert sorted(os.listdir(tmp_path)) == ["LATEST", first]
    assert backups.backup_version(str(tmp_path)) == first


def test_a_full_disk_met_later_names_the_job_s_paths_and_their_room(tmp_path):
    from learners.job.disk_space import DiskFull, explain, free_bytes

    paths = {"angel.log.path": str(tmp_path / "log"), "angel.save.model.path": ""}
    free = free_bytes(str(tmp_path))
    assert free is not None
    # As a shard's error reaches the driver (an actor's death): only its text says what.
    wrapped = RuntimeError("ShardServer.__init__()\nOSError: [Errno 28] No space left on device")
    for exc in (OSError(errno.ENOSPC, "No space left on device"), wrapped):
        full = explain(exc, paths)
        assert isinstance(full, DiskFull)
        assert str(full).startswith(f"no space left on device (angel.log.path={tmp_path / 'log'}: ")
        assert str(full).endswith(" free): make room, then continue with --resume")
    assert explain(ValueError("something else"), paths) is None


def test_a_full_disk_before_any_checkpoint_says_to_train_again(tmp_path):
    """--resume is refused where no checkpoint was written: the hint must not send a user there."""
    from types import SimpleNamespace

    from angelps.checkpoint.errors import FORMAT
    from angelps.checkpoint.local_dir import MANIFEST
    from learners.job.disk_space import explain
    from learners.job.train_loop import TrainingLoop

    paths = {"angel.log.path": str(tmp_path / "log")}
    full = explain(OSError(errno.ENOSPC, "No space left on device"), paths, resumable=False)
    assert full is not None
    assert str(full).endswith(" free): make room, then train again (no checkpoint to resume yet)")
    loop = SimpleNamespace(plan=SimpleNamespace(save_path=tmp_path / "m"))
    assert TrainingLoop._resumable(loop) is False  # type: ignore[arg-type]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / MANIFEST).write_text(f'{{"format": "{FORMAT}"}}')
    assert TrainingLoop._resumable(loop) is True  # type: ignore[arg-type]
    assert TrainingLoop._resumable(SimpleNamespace(plan=SimpleNamespace(save_path=None))) is False  # type: ignore[arg-type]
