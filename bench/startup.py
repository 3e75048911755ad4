"""Start-up benchmark: how long a short job takes next to Ray's own start and stop.

    python bench/startup.py                 # 3 rounds, lr_a9a, 1 epoch
    python bench/startup.py --rounds 5 --json bench/results/startup.json

Each round, in fresh subprocesses:

- ``bare``: ``python -c "import ray; ray.init(num_cpus=2); ray.shutdown()"``, the floor a Ray
  job cannot go below (Ray's defaults: dashboard on);
- ``job``: ``angelps train --conf conf/lr_a9a.properties --set ml.epoch.num=1`` (no checkpoint,
  nothing written), its whole wall time;
- ``phases``: the same job once more, run in-process by this script with timestamps taken
  around Ray's calls (``ray.init``, the first ``run_steps``, ``ray.shutdown``) and at the end of
  each of the job's start-up lines: imports, config, ray.init, ray up (what the driver waits
  for after ``ray.init``), workers (their data; the shards when they start alongside), shards,
  model, first step, rest of training, shutdown, exit.

Prints one line per round and the medians: the job's wall time, the bare time, their ratio
(the issue's target: at most 1.4) and the seconds from Ray up to the first step (target: 3).

    python bench/startup.py --join          # the same job joining a running cluster

``--join`` starts a head once (``scripts/ray-cluster start --num-cpus 2``, token authentication,
its own process group and state folder), then each round runs the timed job with ``--address``
to it and the whole job once more; it prints the seconds to the first step counted from the
command's start and from the join's start (target: 4), and stops the head at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
JOB = ["--conf", "conf/lr_a9a.properties", "--set", "ml.epoch.num=1"]
# No checkpoint, and the run's metrics in a temporary folder: nothing written into the repo.
QUIET = [
    *("--set", "angel.save.model.path="),
    *("--set", f"angel.log.path={os.path.join(tempfile.gettempdir(), 'angelps-bench-startup')}"),
]
BARE = "import ray; ray.init(num_cpus=2); ray.shutdown()"


#: Set by --join: the environment that reaches the head (token) and the job's --address.
HEAD_ENV: dict[str, str] = {}
ADDRESS: list[str] = []


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # (the repo first, then what this process imports through: Ray may come from a PYTHONPATH)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("RAY_ADDRESS", None)
    # As a user's installation runs: the project's modules compiled once, not at every start
    # (0.1-0.3 s per process where the environment turns bytecode caching off).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(HEAD_ENV)
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
    return _timed([sys.executable, "-m", "angelps", "train", *JOB, *QUIET, *ADDRESS])


def run_phases() -> dict[str, float]:
    """The job in a child that timestamps its phases; returns seconds per phase."""
    t0 = time.time()
    wall, out = _timed([sys.executable, __file__, "--child", str(t0), *ADDRESS])
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

#: The job's start-up lines (their first words) and the phase each ends.
_PHASES = (
    ("starting", "ray up"),  # ray.init, and whatever the driver waits for after it
    ("joining", "ray up"),
    ("reserving", "placement"),
    ("loading data", "workers"),
    ("launching", "shards"),
    ("building", "model"),
)


def _child(t_parent: float, address: list[str]) -> None:
    events: dict[str, float] = {"python": time.time()}
    from learners.cli import main as cli_main  # the CLI's own imports

    events["imports"] = time.time()
    import ray

    from learners.job import startup
    from learners.worker import group as worker_group

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
    # The job's own start-up lines (learners.job.startup.Phases) end the phases after ray.init.
    done = startup.Phases.done

    def timed_done(self: Any, label: str, seconds: float) -> None:
        for prefix, name in _PHASES:
            if label.startswith(prefix):
                events.setdefault(name, time.time())
        done(self, label, seconds)

    startup.Phases.done = timed_done  # type: ignore[method-assign]
    execute = worker_group.WorkerGroup.execute

    def timed_execute(self: Any, method: str, *a: Any, **kw: Any) -> Any:
        out = execute(self, method, *a, **kw)
        if method == "run_steps":
            events.setdefault("first step", time.time())
        return out

    worker_group.WorkerGroup.execute = timed_execute  # type: ignore[method-assign]
    os.environ.pop("RAY_ADDRESS", None)
    rc = cli_main.main(["train", *JOB, *QUIET, *address])
    if rc != 0:
        raise SystemExit(rc)
    print("EVENTS " + json.dumps(events), flush=True)
    cli_main.end(rc)  # as the `angelps` script ends


def start_head() -> Path:
    """A head of its own (scripts/ray-cluster): its state folder, after HEAD_ENV and ADDRESS
    are set to join it."""
    state = Path(tempfile.mkdtemp(prefix="angelps-b-"))  # short: Ray's Unix sockets live here
    env = {k: v for k, v in _env().items() if not k.startswith("RAY_")}
    env.update(ANGELPS_RAY_DIR=str(state), ANGELPS_VENV=str(Path(sys.executable).parent.parent))
    script = str(REPO / "scripts" / "ray-cluster")
    p = subprocess.run(
        [script, "start", "--num-cpus", "2", "--dashboard-port", _free_port()],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        raise SystemExit(f"the head did not start:\n{p.stdout}{p.stderr}")
    HEAD_ENV.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(state / "auth_token"))
    ADDRESS[:] = ["--address", (state / "gcs_address").read_text().strip()]
    return state


def stop_head(state: Path) -> None:
    env = {k: v for k, v in _env().items() if not k.startswith("RAY_")}
    env["ANGELPS_RAY_DIR"] = str(state)
    subprocess.run([str(REPO / "scripts" / "ray-cluster"), "stop"], env=env, capture_output=True)
    shutil.rmtree(state, ignore_errors=True)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--join", action="store_true", help="join a running cluster (--address)")
    p.add_argument("--child", metavar="T0", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args()
    if args.child:
        _child(float(args.child), rest)
        return
    if args.join:
        state = start_head()
        try:
            join_rounds(args)
        finally:
            stop_head(state)
        return
    print(f"load before: {_load()}")
    rows = []
    for r in range(args.rounds):
        bare = run_bare()
        job, out = run_job()
        phases = run_phases()
        names = list(phases)
        ray_up = sum(
            phases[k] for k in names[names.index("ray.init") + 1 : names.index("first step") + 1]
        )
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


def join_rounds(args: argparse.Namespace) -> None:
    """Rounds of the job joining the head: seconds to the first step from the command's start
    and from the join's start (the phases after config), and the whole job's wall time."""
    print(f"load before: {_load()}")
    rows = []
    for r in range(args.rounds):
        phases = run_phases()
        job, out = run_job()
        names = list(phases)
        upto = names[: names.index("first step") + 1]
        from_cmd = sum(phases[k] for k in upto)
        from_join = sum(phases[k] for k in upto[upto.index("ray.init") :])
        rows.append(
            {"job_s": job, "from_command_s": from_cmd, "from_join_s": from_join, "phases": phases}
        )
        shown = ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
        print(
            f"round {r + 1}: first step {from_cmd:.2f} s after the command, {from_join:.2f} s "
            f"after the join started; whole job {job:.2f} s; phases: {shown}",
            flush=True,
        )
    print(f"load after: {_load()}")
    med = {
        k: statistics.median(r[k] for r in rows) for k in ("job_s", "from_command_s", "from_join_s")
    }
    print(
        f"median: first step {med['from_command_s']:.2f} s after the command, "
        f"{med['from_join_s']:.2f} s after the join started (target < 4); job {med['job_s']:.2f} s"
    )
    print("last job's console:\n" + out)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rounds": rows, "median": med}, indent=2))


if __name__ == "__main__":
    main()
