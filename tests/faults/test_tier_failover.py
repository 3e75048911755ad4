"""A shard killed under a device tier (angel.sparse.placement=worker with a capacity below the
table): the shard comes back from its backup, which may predate rows the tier wrote back to
it, so the tier refuses to go on and the job restarts from its last checkpoint, ending as the
uninterrupted run (same seed, BSP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.test_failover import _metrics, _run, _sets, _shard_killer

pytestmark = pytest.mark.usefixtures("ray_local")

# a9a: 123 ids; a batch of 64 rows reads at most about 80 of them
TIER = {
    "angel.sparse.placement": "worker",
    "angel.worker.table.capacity": "95",
    "ml.minibatch.size": 64,
}


@pytest.mark.slow
def test_a_killed_shard_under_a_device_tier_restarts_the_job_from_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref_dir = tmp_path / "ref"
    ref, _, _ = _run(ref_dir, {**_sets(ref_dir, "tier-ref", 1, 3), **TIER}, None)
    job, seen = "tier-kill", {}
    sets = {**_sets(tmp_path, job, 1, 3), **TIER}
    history, _, killer = _run(tmp_path, sets, _shard_killer(job, "sigkill", seen))
    assert killer is not None and killer.killed
    err = capsys.readouterr().err
    # the shard died during an exchange, or came back before the tier's next one
    assert (
        "angelps: warning: worker 0 died (a shard died during a device tier's exchange" in err
        or "angelps: warning: worker 0 died (shard 0 restarted and may have lost rows" in err
    ), err
    assert "restarting the workers and parameter shards from the checkpoint" in err
    assert "\\x1b" not in err and "\x1b" not in err
    assert _metrics(history) == _metrics(ref)
