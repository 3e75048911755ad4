"""Start-up benchmark: how long a short job takes next to Ray's own start and stop.

    python bench/startup.py                 # 3 rounds, lr_a9a, 1 epoch
    python bench/startup.py --rounds 5 --json bench/results/startup.json

Each round, in fresh subprocesses:

- ``bare``: ``python -c "import ray; ray.init(num_cpus=2); ray.shutdown()"``, the floor a Ray
  job cannot go below (Ray's defaults: dashboard on);
- ``job``: ``angelps train --conf conf/lr_a9a.properties --set ml.epoch.num=1`` (no checkpoint,
  nothing written), its whole wall time;
- ``phases``: the same job once more, run in-process by this script with timestamps taken
  around Ray's calls (``ray.init``, the workers' first answers, the shard launch, the first
  ``run_steps``, ``ray.shutdown``), so the seconds of each start-up phase work on any version
  of the code: imports, config, ray.init, workers, shards, first step, rest of training,
  shutdown, exit.

Prints one line per round and the medians: the job's wall time, the bare time, their ratio
(the issue's target: at most 1.4) and the seconds from Ray up to the first step (target: 3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
JOB = ["--conf", "conf/lr_a9a.properties", "--set", "ml.epoch.num=1"]
# No checkpoint and no metrics under runs/: a start-up benchmark writes nothing.
QUIET = ["--set", "angel.save.model.path=", "--set", "angel.log.path="]
BARE = "import ray; ray.init(num_cpus=2); ray.shutdown()"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.pop("RAY_ADDRESS", None)
    return env


def _timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return wall, p.stdout + p.stderr


def run_bare() -> float:
    return _timed([sys.executable, "-c", BARE])[0]


def run_job() -> tuple[float, str]:
    return _timed([sys.executable, "-m", "angelps", "train", *JOB, *QUIET])


def run_phases() -> dict[str, float]:
    """The job in a child that timestamps its phases; returns seconds per phase."""
    t0 = time.time()
    wall, out = _timed([sys.executable, __file__, "--child", str(t0)])
    line = next(x for x in out.splitlines() if x.startswith("EVENTS "))
    events = json.loads(line.removeprefix("EVENTS "))
    events["exit"] = t0 + wall
    order = sorted(events.items(), key=lambda kv: kv[1])
    phases, last = {}, t0
    for name, t in order:
        phases[name] = t - last
        last = t
    return phases


# --- the child: the job with timestamps -----------------------------------------------------


def _child(t_parent: float) -> None:
    events: dict[str, float] = {"python": time.time()}
    from learners.cli import main as cli_main  # the CLI's own imports

    events["imports"] = time.time()
    import ray

    from angelps import client as ps_client
    from learners import worker_group

    def wrap(obj: Any, name: str, before: str | None, after: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            if before and before not in events:
                events[before] = time.time()
            out = fn(*a, **kw)
            events.setdefault(after, time.time())
            return out

        setattr(obj, name, timed)

    wrap(ray, "init", "config", "ray.init")
    wrap(ray, "shutdown", "rest of training", "shutdown")
    wrap(ps_client, "launch_shards", None, "shards")
    execute = worker_group.WorkerGroup.execute

    def timed_execute(self: Any, method: str, *a: Any, **kw: Any) -> Any:
        out = execute(self, method, *a, **kw)
        name = {"data_summary": "workers", "run_steps": "first step"}.get(method)
        if name:
            events.setdefault(name, time.time())
        return out

    worker_group.WorkerGroup.execute = timed_execute  # type: ignore[method-assign]
    os.environ.pop("RAY_ADDRESS", None)
    rc = cli_main.main(["train", *JOB, *QUIET])
    if rc != 0:
        raise SystemExit(rc)
    print("EVENTS " + json.dumps(events), flush=True)
    cli_main.end(rc)  # as the `angelps` script ends


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--child", metavar="T0", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(float(args.child))
        return
    print(f"load before: {_load()}")
    rows = []
    for r in range(args.rounds):
        bare = run_bare()
        job, out = run_job()
        phases = run_phases()
        ray_up = sum(v for k, v in phases.items() if k in ("workers", "shards", "first step"))
        rows.append({"bare_s": bare, "job_s": job, "ratio": job / bare, "phases": phases})
        shown = ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
        print(
            f"round {r + 1}: job {job:.2f} s, bare ray.init+shutdown {bare:.2f} s, ratio "
            f"{job / bare:.2f}; Ray up to first step {ray_up:.2f} s; phases: {shown}",
            flush=True,
        )
    print(f"load after: {_load()}")
    med = {k: statistics.median(r[k] for r in rows) for k in ("bare_s", "job_s", "ratio")}
    names = list(rows[0]["phases"])
    med_phases = {n: statistics.median(r["phases"].get(n, 0.0) for r in rows) for n in names}
    print(
        f"median: job {med['job_s']:.2f} s, bare {med['bare_s']:.2f} s, ratio "
        f"{med['ratio']:.2f} (target <= 1.4)"
    )
    print("median phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in med_phases.items()))
    print("last job's console:\n" + out)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"rounds": rows, "median": med, "median_phases": med_phases}, indent=2)
        )


if __name__ == "__main__":
    main()
