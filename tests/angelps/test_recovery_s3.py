"""Recovery from backups on object storage (a local moto S3 server) on a real local Ray: a shard
killed in the middle of training is restarted by Ray, restores its latest backup from
``s3://``, the client replays the pushes made since, and the run ends exactly where a run that
was never interrupted ends; shutdown removes the launch's backups and nothing else."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from angelps import fs
from angelps.checkpoint import backups
from tests.angelps.test_recovery import _launch, _train
from tests.learners.store_jobs import local_ray
from tests.object_store import make_bucket, s3_server

# (whole jobs on the S3 emulator: the e2e tier, which CI runs after the default suite)
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ray_s3() -> Iterator[str]:
    """A bucket on a local S3 server, and a local Ray started after its environment is set
    (Ray's workers inherit it); yields the backup path ``s3://backup/shards``."""
    with s3_server() as env, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        make_bucket(env, "backup")
        with local_ray():
            yield "s3://backup/shards"


@pytest.mark.parametrize("background", [False, True])
def test_a_killed_shard_restores_its_s3_backup_and_training_is_unchanged(
    ray_s3: str, tmp_path, capsys, background: bool
) -> None:
    ref = _launch("ref-local", tmp_path)  # the same job, never interrupted, backups on disk
    try:
        want, want_losses = _train(ref)
    finally:
        ref.shutdown()
    fs.write_bytes(f"{ray_s3}/keep.txt", b"not a backup")  # another object beside the launches
    job = f"chaos-s3{background:d}"
    c = _launch(job, ray_s3, background=background)
    try:
        backup_dir = c.options.shard.backup_dir
        assert re.fullmatch(rf"{ray_s3}/{job}-[0-9a-f]{{12}}", backup_dir)
        got, losses = _train(c, kill_at=13, job=job)
        stats = c.stats()
        assert [s["restarted"] for s in stats] == [False, True]
        assert stats[1]["clocks"]["pushed"] == [24]
        # Killed after 13 pushes with a backup every 5 updates written inline: shard 1 came
        # back at clock 10 (read from s3://) and the client replayed the pushes since; in the
        # background, at the clock of the last backup that was in place.
        m = re.fullmatch(
            r"angelps: warning: parameter shard 1 died; Ray restarted it and it restored its "
            r"backup at clock (\d+) of worker 0, which replayed (\d+) push\(es\) since; "
            r"training goes on\n",
            capsys.readouterr().err,
        )
        assert m is not None
        assert background or (m[1] == "10" and m[2] in "45")
        c.backup()  # (after the one being written, if any: then exactly one generation)
        for i in range(2):  # each shard's backup: a pointer and one generation on S3
            version = backups.backup_version(f"{backup_dir}/shard-{i}")
            assert version is not None and version.startswith("gen-")
            names = sorted(n for n, _ in fs.list_dir(f"{backup_dir}/shard-{i}"))
            assert names == ["LATEST.json", version]
    finally:
        c.shutdown()
    # Shutdown removed this launch's prefix, and only it.
    assert [n for n, _ in fs.list_dir(ray_s3)] == ["keep.txt"]
    # Bit-identical to the run that was never interrupted: no update lost or applied twice.
    np.testing.assert_array_equal(got["w"], want["w"])
    np.testing.assert_array_equal(got["b"], want["b"])
    assert losses == want_losses
