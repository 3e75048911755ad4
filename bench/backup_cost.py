"""Cost of shard backups (``angel.ps.backup.interval``) in a real training job.

    python bench/backup_cost.py [--epochs 3] [--repeat 3] [--intervals 0,10,50,100,200]
                                [--targets local,s3] [--modes background,inline]

Trains conf/lr_a9a.properties (LogisticRegression, Adam) and conf/fm_census.properties
(FactorizationMachines rank 8, Adam) on one private local Ray (2 CPUs), BSP, one worker and one
shard, ``ml.seed=0``, no checkpoints, once per backup interval (0: backups off), the intervals
interleaved and the whole round repeated ``--repeat`` times. The backups go to a directory on
the same local disk as the job's log directory (where the default puts them); with ``--targets
local,s3`` each interval also runs with ``angel.ps.backup.path`` on ``s3://`` of a local moto
S3 server on 127.0.0.1 (the test extra's ``moto[server]``): the cost of the object store's
protocol and requests (a generation, a pointer, a listing and deletes per backup), without a
real network's latency. ``--modes``: backups written in the background from a copy
(``angel.ps.backup.async=true``, the default) and inline (``false``); the shard's calls wait
for the whole backup inline, for the copy only in the background.

Training time is the time of the epochs' updates only (``TrainingLoop.run_epoch``: start-up,
validation and shutdown excluded). Prints, per job and interval, the median training seconds,
their range and the cost against backups off; and, from the shard's own account (``stats()``:
the backups it wrote during training and the seconds they took; not the one it writes at
start-up), the seconds per backup, the milliseconds per
update without them and the backups' share of the training time. On a loaded machine the
accounted share is the steadier figure: the cost of interval N is about
``s/backup / (N x ms/update)``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

JOBS = {"lr_a9a": "conf/lr_a9a.properties", "fm_census": "conf/fm_census.properties"}
BUCKET = "bench-backup"


def _train(
    job: str, interval: int, epochs: int, root: str, target: str, mode: str
) -> dict[str, Any]:
    """One job's summary with backups every ``interval`` updates (0: off) to ``target``
    (``local``: a directory beside the log; ``s3``: the bench's bucket), written ``mode``
    (``background`` or ``inline``)."""
    from learners.job.learner import GraphLearner

    d = tempfile.mkdtemp(dir=root)
    backup = os.path.join(d, "backup") if target == "local" else f"s3://{BUCKET}/{Path(d).name}"
    sets: dict[str, Any] = {
        "ml.epoch.num": epochs,
        "ml.seed": 0,
        "angel.save.model.path": "",
        "angel.log.path": os.path.join(d, "log"),
        "angel.job.name": f"bench-{job}-{interval}",
        "angel.ps.backup.interval": interval,
        "angel.ps.backup.path": backup,
        "angel.ps.backup.async": mode == "background",
    }
    learner = GraphLearner.from_properties(REPO / JOBS[job], sets, quiet=True)
    epoch_s: list[float] = []
    run_epoch = learner.loop.run_epoch

    def timed(*a: Any, **kw: Any) -> dict[str, Any]:
        t = time.perf_counter()
        row = run_epoch(*a, **kw)
        epoch_s.append(time.perf_counter() - t)
        return row

    learner.loop.run_epoch = timed  # type: ignore[method-assign]
    try:
        result = learner.train()
        assert learner.actors.size is not None and learner.actors.ps is not None
        updates = learner.actors.size.updates_per_epoch * epochs
        backups = learner.actors.ps.stats()[0]["backups"]
    finally:
        learner.shutdown()
    assert len(epoch_s) == epochs
    return {
        "train_s": sum(epoch_s),
        "updates": updates,
        "auc": result.summary["valid_auc"],
        "backups": backups["count"],
        "backup_s": backups["seconds"],
        # what the shard's calls waited for: the whole backups inline, the copies otherwise
        "blocked_s": backups["copy_s"] if mode == "background" else backups["seconds"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--intervals", default="0,10,50,100,200")
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--targets", default="local", help="local, s3 (a local moto server)")
    ap.add_argument("--modes", default="background,inline", help="background, inline")
    args = ap.parse_args()
    intervals = [int(x) for x in args.intervals.split(",")]
    jobs = args.jobs.split(",")
    targets = args.targets.split(",")
    modes = args.modes.split(",")
    # Backups off (interval 0) are the same run whatever the target and mode: once.
    rounds = [
        (t, m, n)
        for n in intervals
        for t in (["local"] if n == 0 else targets)
        for m in (["-"] if n == 0 else modes)
    ]

    import ray

    os.chdir(REPO)
    with tempfile.TemporaryDirectory(prefix="bc-") as root, ExitStack() as stack:
        if "s3" in targets:
            # Before Ray starts: its workers (the shards) inherit the server's environment.
            from tests.object_store import make_bucket, s3_server

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
            env = stack.enter_context(s3_server())
            os.environ.update(env)
            make_bucket(env, BUCKET)
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            namespace="angelps",
            log_to_driver=False,
            _temp_dir=os.path.join(root, "ray"),
        )
        try:
            runs: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
            for _ in range(args.repeat):
                for job in jobs:
                    for t, m, n in rounds:
                        run = _train(job, n, args.epochs, root, t, m)
                        runs.setdefault((job, t, m, n), []).append(run)
        finally:
            ray.shutdown()
    print(
        f"{args.epochs} epochs, BSP, 1 worker, 1 shard, seed 0; median of {args.repeat} "
        "(range); cost: against backups off; s/backup: from its start to its pointer in "
        "place; accounted: the seconds the shard's calls waited for backups over the rest of "
        "the training time"
    )
    print(
        f"{'job':10} {'target':6} {'mode':10} {'interval':>8} {'train s':>8} {'range':>15} "
        f"{'cost':>7} {'backups':>7} {'s/backup':>8} {'ms/update':>9} {'accounted':>9}"
    )
    for job in jobs:
        base = (
            statistics.median(r["train_s"] for r in runs[(job, "local", "-", 0)])
            if 0 in intervals
            else 0
        )
        for t, m, n in rounds:
            rs = runs[(job, t, m, n)]
            ts = [r["train_s"] for r in rs]
            med = statistics.median(ts)
            cost = f"{(med / base - 1) * 100:+.1f}%" if base else "-"
            count = statistics.median(r["backups"] for r in rs)
            per = statistics.median(r["backup_s"] / max(r["backups"], 1) for r in rs)
            step_ms = statistics.median(
                (r["train_s"] - r["blocked_s"]) / r["updates"] * 1e3 for r in rs
            )
            share = statistics.median(r["blocked_s"] / (r["train_s"] - r["blocked_s"]) for r in rs)
            print(
                f"{job:10} {t:6} {m:10} {n:>8} {med:8.3f} {min(ts):7.3f}-{max(ts):<7.3f} {cost:>7} "
                f"{count:>7g} {per:8.4f} {step_ms:9.2f} {share * 100:8.1f}%"
            )


if __name__ == "__main__":
    main()
