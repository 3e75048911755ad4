"""End-to-end training benchmark: angelps against what its users would otherwise pick.

    python bench/train_throughput.py --quick          # a few minutes
    python bench/train_throughput.py                  # the full matrix (tens of minutes)
    python bench/train_throughput.py --suite census --systems torch,angelps-bsp-w1s1 --batches 2048
    python bench/train_throughput.py --suite feed                  # FM, DeepFM at B=8192
    python bench/train_throughput.py --suite feed --device cuda    # the same on a GPU

Four suites:

- ``census``: data/census (13 fields, 148 ids, every 10th row validates), FM rank 8 and DeepFM
  (FM + MLP 104-400-400-1), SGD momentum 0.9, lr 0.1, constant.
- ``synthetic``: power-law click data (bench/synthetic.py: 26 fields, 10^5..10^7 ids, Zipf 1.1,
  labels from a teacher FM whose AUC on the validation rows is the best reachable), FM.
- ``feed``: the synthetic data at 10^6 ids (500,000 training rows), FM and DeepFM
  (MLP 208-400-400-1) at batch 8192: plain PyTorch in one process (the table in memory, on the
  GPU with ``--device cuda``) against angelps with 1 worker and 1 shard, with and without the
  worker cache (``-cache``), BSP and staleness 2 (``ssp``), and with the sparse tables held by
  the workers (``-held``: angel.sparse.placement=worker; 1 and 2 workers). Sized for a minute
  or two a run on two cores. Each run reports the ms of a step's phases (pull, compute, push,
  wait) from its step records.
- ``table``: angelps FM while the sparse table grows from 64 MB to 1 GB (weights and momentum
  state, 72 bytes an id): every id is touched in each epoch, samples/s of the later epochs.

Systems: ``torch`` (plain PyTorch, one process, nn.Embedding), ``torch_sparse`` (one process, the
PS math without Ray), ``ray_train`` (TorchTrainer, 2 workers, DDP/gloo), ``ray_ps`` (Ray's docs
parameter-server example), and angelps as ``angelps-{bsp|ssp}-w{workers}s{shards}``. Each run is
a fresh subprocess. Reported per run: steady-state samples/s (median over the epochs after the
first), validation AUC per epoch, training seconds to reach 0.99 of the best AUC (best: the
teacher's for synthetic data, the best any run reached for census), and start-up seconds.

Prints a table and writes JSON (bench/results/train_throughput[_quick].json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

CENSUS = REPO / "data" / "census" / "census_148d_train.dummy"
CACHE = REPO / "runs" / "bench-data"
ROW_BYTES = 72  # FM rank 8: (1 weight + 8 factors) x 4 bytes x (value + momentum)
MB = 2**20

ANGELPS = {
    "angelps-bsp-w1s1": (0, 1, 1),
    "angelps-bsp-w1s2": (0, 1, 2),
    "angelps-bsp-w1s4": (0, 1, 4),
    "angelps-bsp-w2s1": (0, 2, 1),
    "angelps-bsp-w2s2": (0, 2, 2),
    "angelps-ssp-w2s1": (2, 2, 1),
    "angelps-ssp-w2s2": (2, 2, 2),
    "angelps-ssp-w1s1": (2, 1, 1),
}
#: Extra keys of the systems named ``<angelps system>-<variant>``.
VARIANTS: dict[str, list[str]] = {
    "cache": ["angel.worker.cache.enable=true", "angel.worker.cache.capacity=262144"],
    # the sparse tables held by the workers (angel.sparse.placement=worker): no shard holds them
    "held": ["angel.sparse.placement=worker"],
    # the same with the batch's ids deduplicated by torch.unique (on a CUDA worker ``held``
    # does so already: angel.worker.dedup=auto); on the CPU it measures that choice
    "helddev": ["angel.sparse.placement=worker", "angel.worker.dedup=device"],
    # a device tier holding 10% of the feed suite's 10^6 ids a table (the rest on the shard),
    # evicting by recency or by frequency, and admitting ids seen twice
    "tier10": ["angel.sparse.placement=worker", "angel.worker.table.capacity=100000"],
    "tier10lfu": [
        "angel.sparse.placement=worker",
        "angel.worker.table.capacity=100000",
        "angel.worker.table.eviction=lfu",
    ],
    "tier10admit": [
        "angel.sparse.placement=worker",
        "angel.worker.table.capacity=100000",
        "angel.worker.table.admit.count=2",
    ],
    # a checkpoint every 5 epochs (and after the last) instead of after each: the job's wall
    # time (summary elapsed_s) against the same system without it
    "save5": ["angel.save.model.every.howmany.epochs=5"],
    # the checkpoint after each epoch written before training goes on (the default writes it
    # in the background while the next epoch trains): the job's wall time against the default
    "saveinline": ["angel.save.model.async=false"],
    # shard backups every 50 updates (the default is 500: more than the feed suite's 310
    # updates), written in the background and inline on the shard's event loop
    "bk50": ["angel.ps.backup.interval=50"],
    "bk50inline": ["angel.ps.backup.interval=50", "angel.ps.backup.async=false"],
    # torch's profiler over 40 updates of the worker's training thread (after 60): its
    # operators and CUDA runtime calls per update go into the result (``worker_profile``)
    "prof": ["angel.worker.profile.updates=40", "angel.worker.profile.skip=60"],
}
# the backups every 50 updates under a device tier at 10% (the shard backs up the tier's whole
# table), in the background and inline
VARIANTS["tier10bk50"] = [*VARIANTS["tier10"], *VARIANTS["bk50"]]
VARIANTS["tier10bk50inline"] = [*VARIANTS["tier10"], *VARIANTS["bk50inline"]]
# the tier with its swaps' row work at the shard on 1, 2 or 4 threads (angel.ps.swap.threads;
# the default, 0, takes a quarter of the shard's node's cores)
for _n in (1, 2, 4):
    VARIANTS[f"tier10t{_n}"] = [*VARIANTS["tier10"], f"angel.ps.swap.threads={_n}"]
BASELINE_SYSTEMS = ("torch", "torch_sparse", "ray_train", "ray_ps")


# --- data --------------------------------------------------------------------------------------


def synthetic_paths(
    num_ids: int, rows: int, valid_rows: int, cover_rows: int = 0
) -> dict[str, Any]:
    """Generate (once, cached under runs/bench-data) the synthetic train/valid sets."""
    from synthetic import SyntheticSpec, generate, write_parquet

    spec = SyntheticSpec(num_ids=num_ids)
    key = f"syn_{num_ids}_{rows}_{valid_rows}_{cover_rows}_s{spec.seed}"
    d = CACHE / key
    meta = d / "meta.json"
    if meta.exists():
        return json.loads(meta.read_text())
    d.mkdir(parents=True, exist_ok=True)
    train = generate(spec, rows, seed=1, cover_rows=cover_rows)
    valid = generate(spec, valid_rows, seed=2)
    write_parquet(d / "train.parquet", train)
    write_parquet(d / "valid.parquet", valid)
    import numpy as np

    np.savez(
        d / "arrays.npz",
        train_ids=train.ids,
        train_y=train.labels,
        valid_ids=valid.ids,
        valid_y=valid.labels,
    )
    info = {
        "dir": str(d.relative_to(REPO)),  # relative: results files name no machine paths
        "num_ids": num_ids,
        "fields": spec.fields,
        "train_rows": len(train),
        "valid_rows": len(valid),
        "cover_rows": cover_rows,
        "best_auc": valid.best_auc(),
        "distinct_train_ids": len(np.unique(train.ids)),
        "spec": spec.__dict__,
    }
    meta.write_text(json.dumps(info, indent=1))
    return info


def load_data(case: dict[str, Any]) -> Any:
    from baselines import Data, load_dummy

    if case["suite"] == "census":
        return load_dummy(CENSUS, ratio=0.1)
    import numpy as np

    z = np.load(REPO / case["data"]["dir"] / "arrays.npz")
    return Data(z["train_ids"], z["train_y"], z["valid_ids"], z["valid_y"], case["data"]["num_ids"])


# --- one run (in a subprocess) -----------------------------------------------------------------


def _hidden(model: str) -> list[int]:
    return [400, 400] if model == "DeepFM" else []


def run_angelps(case: dict[str, Any]) -> dict[str, Any]:
    from angelconf.config import load_config
    from learners.job.learner import GraphLearner
    from learners.keys import all_keys

    base, variants = _system(case["system"])
    staleness, workers, shards = ANGELPS[base]
    threads = case["threads"] if workers == 1 else 1
    log_dir = tempfile.mkdtemp(prefix="bench-angelps-")
    sets = [
        f"ml.model.class.name={ {'FM': 'FactorizationMachines'}.get(case['model'], case['model']) }",
        "ml.fm.rank=8",
        f"ml.minibatch.size={case['batch'] // workers}",
        f"angel.workergroup.number={workers}",
        f"angel.ps.number={shards}",
        f"angel.staleness={staleness}",
        f"angel.worker.torch.threads={threads}",
        f"ml.epoch.num={case['epochs']}",
        f"ml.learn.rate={case['lr']}",
        "ml.opt.decay.class.name=StandardDecay",
        "ml.opt.decay.alpha=0",  # a constant step size, as the baselines
        "ml.inputlayer.optimizer=Momentum",
        "ml.embedding.optimizer=Momentum",
        "ml.fclayer.optimizer=Momentum",
        "ml.opt.momentum.momentum=0.9",
        "ml.embedding.init.std=0.01",
        "ml.inputlayer.init.std=0",
        "ml.data.use.shuffle=false",
        f"angel.log.path={log_dir}",
        # feed: a step record every 10 updates (the phase breakdown of a step)
        f"angel.log.every.steps={10 if case['suite'] == 'feed' else 100000}",
        f"angel.job.name=bench{os.getpid()}",
    ]
    if case["model"] == "DeepFM":
        sets.append("ml.model.hidden.layers=400,400")
    if case["suite"] == "census":
        sets += [
            f"angel.train.data.path={CENSUS}",
            "ml.data.type=dummy",
            "ml.data.validate.ratio=0.1",
            "ml.feature.index.range=148",
            "ml.fm.field.num=13",
        ]
    else:
        d = case["data"]
        sets += [
            f"angel.train.data.path={(REPO / d['dir']) / 'train.parquet'}",
            f"angel.validate.data.path={(REPO / d['dir']) / 'valid.parquet'}",
            "ml.data.type=parquet",
            f"ml.feature.index.range={d['num_ids']}",
            f"ml.fm.field.num={d['fields']}",
        ]
    if case.get("device", "cpu") != "cpu":
        sets += [f"angel.worker.device={case['device']}", "angel.worker.gpus=1"]
    for v in variants:
        sets += VARIANTS[v]
    if staleness > 0 and case["suite"] == "feed":
        # SSP: keep as many batches in flight as the staleness allows
        sets.append(f"angel.worker.prefetch.depth={staleness}")
    sets += case.get("extra_sets", [])
    t0 = time.time()
    try:
        learner = GraphLearner(load_config(None, sets, all_keys()))
        try:
            t_train = time.time()
            result = learner.train()
            served = [st.get("served", {}) for st in learner.actors.ps.stats()]
        finally:
            learner.shutdown()
        feed = _feed_metrics(Path(result.summary["run_dir"]) / "metrics.jsonl", served)
        prof = Path(log_dir) / "profile-worker0.json"
        if prof.exists():  # (with the table's first 80 lines: the costliest entries)
            feed["worker_profile"] = json.loads(prof.read_text())
            table = prof.with_suffix(".txt").read_text().splitlines()[:80]
            feed["worker_profile"]["table"] = table
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    # (the run's directory was a temporary one, removed above: not reported)
    s = {k: v for k, v in result.summary.items() if k != "run_dir"}
    # Rows trained per epoch (angelps also trains the last, partial batch).
    if case["suite"] == "census":
        total = sum(1 for line in CENSUS.read_text().splitlines() if line.strip())
        per_epoch = total - int(s["valid_rows"])
    else:
        per_epoch = int(case["data"]["train_rows"])
    epochs = []
    for i, row in enumerate(result.history):
        sps = float(row["train_samples_per_s"])
        epochs.append(
            {
                "epoch": i,
                "train_s": per_epoch / sps,
                "samples": per_epoch,
                "valid_auc": row.get("valid_auc"),
                "wall_s": (t_train - t0) + float(row["elapsed_s"]),
            }
        )
    startup = epochs[0]["wall_s"] - epochs[0]["train_s"] if epochs else math.nan
    return {"epochs": epochs, "startup_s": startup, "summary": s, **feed}


def _system(name: str) -> tuple[str, list[str]]:
    """An angelps system's base (a key of ANGELPS) and its variants (keys of VARIANTS)."""
    parts = name.split("-")
    return "-".join(parts[:3]), parts[3:]


def _feed_metrics(path: Path, served: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Mean bytes per step, cache hit rate and ms per update of each phase (worker 0: pull,
    compute, push, wait and the whole step) of the step records after the first epoch; with
    ``served`` (each shard's ``stats()["served"]``), the shards' own work per update over the
    whole run (every worker's updates: ``shard_step_ms`` for step calls, ``shard_swap_ms``
    for a device tier's swaps; summed over the shards)."""
    steps = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    steps = [x for x in steps if x.get("kind") == "step"]
    out: dict[str, Any] = {}
    total = sum(x["updates"] for x in steps)
    if served and total:
        for k in ("step", "swap"):
            out[f"shard_{k}_ms"] = 1000 * sum(s.get(f"{k}_s", 0.0) for s in served) / total
    later = [x for x in steps if x["epoch"] > 0] or steps
    if later:
        out["bytes_per_step"] = statistics.mean(x.get("bytes_per_step", 0) for x in later)
        rates = [x["cache_hit_rate"] for x in later if x.get("cache_hit_rate") is not None]
        if rates:
            out["cache_hit_rate"] = statistics.mean(rates)
        tier = [x["tier_hit_rate"] for x in later if x.get("tier_hit_rate") is not None]
        if tier:
            out["tier_hit_rate"] = statistics.mean(tier)
            out["tier_misses_per_step"] = statistics.mean(x["tier_misses_per_step"] for x in later)
            out["tier_writebacks_per_step"] = statistics.mean(
                x["tier_writebacks_per_step"] for x in later
            )
        updates = sum(x["updates"] for x in later)
        if tier and all("tier_wait_s" in x for x in later):
            # ms a step the training thread waited for the tier's work elsewhere
            out["tier_wait_ms"] = 1000 * sum(x["tier_wait_s"] for x in later) / max(updates, 1)
            # (its parts, and the wait for the update thread's queue, where recorded)
            for k in ("tier_wait_shards_s", "tier_ahead_wait_s", "tier_wait_update_s"):
                if all(k in x for x in later):
                    out[k[:-2] + "_ms"] = 1000 * sum(x[k] for x in later) / max(updates, 1)
        out["phase_ms"] = {
            k: 1000 * sum(x[k] for x in later) / max(updates, 1)
            for k in ("pull_s", "compute_s", "push_s", "wait_s", "elapsed_s")
        }
    return out


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    if case["system"].startswith("angelps"):
        return run_angelps(case)
    from baselines import run_baseline

    data = load_data(case)
    cfg = {
        "rank": 8,
        "hidden": _hidden(case["model"]),
        "lr": case["lr"],
        "batch": case["batch"],
        "epochs": case["epochs"],
        "threads": case["threads"] if case["system"] in ("torch", "torch_sparse") else 1,
        "seed": 0,
        "device": case.get("device", "cpu"),
    }
    return run_baseline(case["system"], data, cfg)


def run_in_subprocess(case: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH), str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("RAY_DEDUP_LOGS", "0")
    # The benchmark's own Ray instances never join a cluster named by the environment.
    env.pop("RAY_ADDRESS", None)
    t = time.time()
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(case)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "elapsed_s": time.time() - t}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT ") :])
            out["elapsed_s"] = time.time() - t
            return out
    tail = (proc.stdout + proc.stderr)[-1500:]
    return {"error": f"exit code {proc.returncode}: {tail}", "elapsed_s": time.time() - t}


# --- the matrix --------------------------------------------------------------------------------


def build_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    quick = args.quick
    systems = args.systems.split(",") if args.systems else None
    suites = args.suite.split(",")
    cases: list[dict[str, Any]] = []

    def want(system: str, default: bool) -> bool:
        return system in systems if systems else default

    if "census" in suites:
        batches = (
            [int(b) for b in args.batches.split(",")]
            if args.batches
            else ([2048] if quick else [256, 2048, 4096])
        )
        epochs = args.epochs or (4 if quick else 10)
        for model in ("FM", "DeepFM"):
            for b in batches:
                for system in (*BASELINE_SYSTEMS, *ANGELPS):
                    default = (
                        system
                        in (
                            "torch",
                            "torch_sparse",
                            "ray_train",
                            "ray_ps",
                            "angelps-bsp-w1s1",
                        )
                        if quick
                        # The other angelps layouts at one batch size: the table is long enough.
                        else system in (*BASELINE_SYSTEMS, "angelps-bsp-w1s1") or b == 2048
                    )
                    if (
                        quick
                        and model == "DeepFM"
                        and system in ("ray_train", "ray_ps", "torch_sparse")
                    ):
                        default = False
                    if want(system, default):
                        cases.append(
                            {
                                "suite": "census",
                                "model": model,
                                "batch": b,
                                "system": system,
                                "epochs": epochs,
                                "lr": 0.1,
                                "threads": args.threads,
                            }
                        )
    if "synthetic" in suites:
        sizes = [10**5] if quick else [10**5, 10**6, 10**7]
        rows = 100_000 if quick else 1_000_000
        batches = [int(b) for b in args.batches.split(",")] if args.batches else [2048]
        for n in sizes:
            data = synthetic_paths(n, rows, rows // 10)
            for b in batches:
                for system in (*BASELINE_SYSTEMS, *ANGELPS):
                    default = system in ("torch_sparse", "angelps-bsp-w1s1") or (
                        system == "angelps-ssp-w2s2" and not quick
                    )
                    if n == 10**5:
                        default = default or (
                            system in ("torch", "ray_train", "ray_ps") and not quick
                        )
                    if want(system, default):
                        cases.append(
                            {
                                "suite": "synthetic",
                                "model": "FM",
                                "batch": b,
                                "system": system,
                                "epochs": args.epochs or (2 if quick else 3),
                                "lr": 0.1,
                                "threads": 1,
                                "data": data,
                                "num_ids": n,
                            }
                        )
    if "table" in suites:
        mbs = [64] if quick else [64, 256, 1024]
        zipf_rows = 100_000 if quick else 300_000
        for mb in mbs:
            n = mb * MB // ROW_BYTES
            # The same number of cover rows at every size (enough to walk the largest table's
            # fields once; smaller tables are walked several times): every size then sees the
            # same rows per batch with the same count of distinct ids, only the table differs.
            cover_rows = max(mbs) * MB // ROW_BYTES // 26
            data = synthetic_paths(n, zipf_rows, 20_000, cover_rows=cover_rows)
            for system in ("angelps-bsp-w1s1", "torch_sparse"):
                if want(system, True):
                    cases.append(
                        {
                            "suite": "table",
                            "model": "FM",
                            "batch": 2048,
                            "system": system,
                            "epochs": args.epochs or 3,
                            "lr": 0.1,
                            "threads": 1,
                            "data": data,
                            "num_ids": n,
                            "table_mb": mb,
                        }
                    )
    if "feed" in suites:
        cases += _feed_cases(args, want)
    # The suites the targets depend on first, so that a cut-short run still answers them.
    order = {"census": 0, "feed": 1, "table": 2, "synthetic": 3}
    cases.sort(key=lambda c: order[c["suite"]])
    return cases


FEED_SYSTEMS = (
    "torch",
    "angelps-bsp-w1s1",
    "angelps-bsp-w1s1-cache",
    "angelps-ssp-w1s1-cache",
    "angelps-bsp-w1s1-held",
    "angelps-bsp-w2s1-held",
)


def _feed_cases(args: argparse.Namespace, want: Any) -> list[dict[str, Any]]:
    """FM and DeepFM on the synthetic data (10^6 ids) at B=8192 (the issue's GPU matrix)."""
    data = synthetic_paths(10**6, 500_000, 50_000)
    batches = [int(b) for b in args.batches.split(",")] if args.batches else [8192]
    cases = []
    for model in args.models.split(","):
        for b in batches:
            held = [
                f"{a}-{v}"
                for v in (*VARIANTS, "held-save5", "held-saveinline")
                for a in ANGELPS
                if a.startswith("angelps-bsp")
            ]
            held += [f"{h}-prof" for h in held if not h.endswith("-prof")]  # (profiled)
            for system in dict.fromkeys((*FEED_SYSTEMS, *ANGELPS, *held)):
                if want(system, system in FEED_SYSTEMS):
                    cases.append(
                        {
                            "suite": "feed",
                            "model": model,
                            "batch": b,
                            "system": system,
                            "epochs": args.epochs or 3,
                            "lr": 0.1,
                            "threads": args.threads,
                            "data": data,
                            "num_ids": 10**6,
                            "device": args.device,
                        }
                    )
    return cases


# --- reporting ---------------------------------------------------------------------------------


def steady_sps(epochs: list[dict[str, Any]]) -> float:
    """Samples/s over the epochs after the first (warm-up, table growth): their samples over
    their training seconds (census epochs are ~10 steps, too short to take a median of)."""
    rows = epochs[1:] if len(epochs) > 1 else epochs
    secs = sum(e["train_s"] for e in rows)
    return sum(e["samples"] for e in rows) / secs if secs > 0 else math.nan


def time_to(epochs: list[dict[str, Any]], target: float) -> float | None:
    spent = 0.0
    for e in epochs:
        spent += e["train_s"]
        if e.get("valid_auc") is not None and e["valid_auc"] >= target:
            return spent
    return None


def summarise(results: list[dict[str, Any]]) -> None:
    """Fill steady samples/s, best AUC, target and time-to-target into each result."""
    best: dict[tuple[str, str, int], float] = {}
    seen: dict[tuple[str, str, int], float] = {}  # the best AUC any run reached
    for r in results:
        if "error" in r:
            continue
        key = (r["case"]["suite"], r["case"]["model"], r["case"].get("num_ids", 0))
        aucs = [e["valid_auc"] for e in r["epochs"] if e.get("valid_auc") is not None]
        if aucs:
            seen[key] = max(seen.get(key, 0.0), max(aucs))
        if r["case"]["suite"] != "census":
            best[key] = r["case"]["data"]["best_auc"]
        elif aucs:
            best[key] = max(best.get(key, 0.0), max(aucs))
    for r in results:
        if "error" in r:
            continue
        key = (r["case"]["suite"], r["case"]["model"], r["case"].get("num_ids", 0))
        r["steady_samples_per_s"] = steady_sps(r["epochs"])
        r["best_auc"] = best.get(key)
        r["final_auc"] = r["epochs"][-1].get("valid_auc") if r["epochs"] else None
        if r["best_auc"]:
            r["target_auc"] = 0.99 * r["best_auc"]
            r["train_s_to_target"] = time_to(r["epochs"], r["target_auc"])
        if key in seen:
            r["best_seen_auc"] = seen[key]
            r["train_s_to_seen"] = time_to(r["epochs"], 0.99 * seen[key])
    # Repeats of one case (--repeat): the median samples/s is what the tables show.
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if "error" not in r:
            groups.setdefault(_case_key(r["case"]), []).append(r)
    for runs in groups.values():
        med = statistics.median(r["steady_samples_per_s"] for r in runs)
        for r in runs:
            r["median_samples_per_s"] = med
            r["repeats"] = len(runs)


def _case_key(case: dict[str, Any]) -> str:
    return json.dumps(
        {k: v for k, v in case.items() if k not in ("data", "repeat")}, sort_keys=True
    )


def print_table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'suite':<9} {'model':<6} {'ids':>9} {'batch':>5} {'system':<18} {'samples/s':>10} "
        f"{'AUC':>6} {'best':>6} {'t->0.99':>8} {'startup':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        c = r["case"]
        ids = c.get("num_ids", 148)
        label = f"{c['suite']:<9} {c['model']:<6} {ids:>9} {c['batch']:>5} {c['system']:<18}"
        if c["suite"] == "table":
            label = f"{'table':<9} {c['model']:<6} {str(c['table_mb']) + 'MB':>9} {c['batch']:>5} {c['system']:<18}"
        if "error" in r:
            lines.append(f"{label} ERROR {r['error'].splitlines()[-1][:60] if r['error'] else ''}")
            continue
        ttt = r.get("train_s_to_target")
        lines.append(
            f"{label} {r['steady_samples_per_s']:>10,.0f} {r['final_auc'] or math.nan:>6.4f} "
            f"{r.get('best_auc') or math.nan:>6.4f} {f'{ttt:.2f}s' if ttt is not None else '-':>8} "
            f"{r.get('startup_s', math.nan):>6.1f}s"
        )
    text = "\n".join(lines)
    print(text)
    return text


def _ok(r: dict[str, Any]) -> bool:
    return "error" not in r and not math.isnan(r.get("steady_samples_per_s", math.nan))


def _fmt_sps(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x / 1000:,.0f}k"


def markdown(report: dict[str, Any]) -> str:
    """The results as the Markdown tables of docs/benchmarks-train.md."""
    results = [r for r in report["results"] if _ok(r)]
    failed = [r for r in report["results"] if not _ok(r)]
    out: list[str] = []
    m = report["machine"]
    out.append(
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['mem_mib'] / 1024:.0f} GiB, "
        f"{'GPU' if m['gpu'] else 'no GPU'}; Python {m['python']}, torch {m['torch']}, "
        f"Ray {m['ray']}. Started {report['started']}; load average "
        f"{report['load_before'][0]:.1f} before, {report.get('load_after', [math.nan])[0]:.1f} after "
        f"(per run: {min(r['load_at_start'] for r in report['results']):.1f} to "
        f"{max(r['load_at_start'] for r in report['results']):.1f})."
    )

    def find(**kw: Any) -> dict[str, Any] | None:
        for r in results:
            if all(r["case"].get(k) == v for k, v in kw.items()):
                return r
        return None

    reps = max((r.get("repeats", 1) for r in results), default=1)
    if reps > 1:
        out.append(
            f"\nEach case ran {reps} times, interleaved (all cases, then all again); samples/s "
            "is the median of the repeats, AUC and times are from every run."
        )

    systems = [*BASELINE_SYSTEMS, *ANGELPS]
    for model in ("FM", "DeepFM"):
        rows = [
            r for r in results if r["case"]["suite"] == "census" and r["case"]["model"] == model
        ]
        if not rows:
            continue
        batches = sorted({r["case"]["batch"] for r in rows})
        out.append(f"\n### census, {model}: steady-state samples/s (ratio to plain PyTorch)\n")
        out.append("| system | " + " | ".join(f"B={b}" for b in batches) + " |")
        out.append("|---|" + "---:|" * len(batches))
        for sysname in systems:
            cells = []
            for b in batches:
                r = find(suite="census", model=model, batch=b, system=sysname)
                base = find(suite="census", model=model, batch=b, system="torch")
                if r is None:
                    cells.append("")
                    continue
                ratio = (
                    f" ({r['median_samples_per_s'] / base['median_samples_per_s']:.2f})"
                    if base
                    else ""
                )
                cells.append(_fmt_sps(r["median_samples_per_s"]) + ratio)
            if any(cells):
                out.append(f"| {sysname} | " + " | ".join(cells) + " |")
        out.append(
            f"\n### census, {model}: validation AUC after the last epoch; training seconds "
            "to 0.99 of the best AUC; start-up seconds\n"
        )
        out.append("| system | batch | epochs | AUC | best | s to 0.99·best | start-up s |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            ttt = r.get("train_s_to_target")
            out.append(
                f"| {r['case']['system']} | {r['case']['batch']} | {len(r['epochs'])} | "
                f"{r['final_auc']:.4f} | {r['best_auc']:.4f} | "
                f"{'-' if ttt is None else format(ttt, '.2f')} | {r.get('startup_s', math.nan):.1f} |"
            )
    out += _feed_markdown(results)
    syn = [r for r in results if r["case"]["suite"] == "synthetic"]
    if syn:
        out.append("\n### synthetic power-law data, FM: samples/s, AUC against the teacher's\n")
        out.append(
            "| ids | batch | system | samples/s | AUC | teacher AUC | s to 0.99·teacher | "
            "best AUC of any run | s to 0.99·that | start-up s |"
        )
        out.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in syn:
            c = r["case"]
            ttt = r.get("train_s_to_target")
            out.append(
                f"| {c['num_ids']:,} | {c['batch']} | {c['system']} | "
                f"{_fmt_sps(r['steady_samples_per_s'])} | {r['final_auc']:.4f} | "
                f"{r['best_auc']:.4f} | {'-' if ttt is None else format(ttt, '.1f')} | "
                f"{r['best_seen_auc']:.4f} | "
                f"{'-' if r.get('train_s_to_seen') is None else format(r['train_s_to_seen'], '.1f')} | "
                f"{r.get('startup_s', math.nan):.1f} |"
            )
    tab = [r for r in results if r["case"]["suite"] == "table"]
    if tab:
        out.append("\n### table growth, FM, B=2048: samples/s after the first epoch\n")
        out.append("| table (weights + momentum) | ids | system | samples/s | vs 64 MB |")
        out.append("|---:|---:|---|---:|---:|")
        tab = list({_case_key(r["case"]): r for r in tab}.values())
        for r in sorted(tab, key=lambda r: (r["case"]["system"], r["case"]["table_mb"])):
            c = r["case"]
            first = find(suite="table", system=c["system"], table_mb=64)
            rel = (
                f"{r['median_samples_per_s'] / first['median_samples_per_s'] - 1:+.0%}"
                if first
                else "-"
            )
            out.append(
                f"| {c['table_mb']} MB | {c['num_ids']:,} | {c['system']} | "
                f"{_fmt_sps(r['median_samples_per_s'])} | {rel} |"
            )
    if failed:
        out.append("\n### runs that failed\n")
        for r in failed:
            c = r["case"]
            why = (r.get("error") or "no epochs").strip().splitlines()[-1][:160]
            out.append(f"- {c['suite']} {c['model']} B={c['batch']} {c['system']}: {why}")
    return "\n".join(out) + "\n"


def _feed_markdown(results: list[dict[str, Any]]) -> list[str]:
    """The feed suite: samples/s, ratio to plain PyTorch on the same device, AUC."""
    feed = [r for r in results if r["case"]["suite"] == "feed"]
    if not feed:
        return []
    out = [
        "\n### synthetic data (10^6 ids), B=8192: samples/s (ratio to plain PyTorch), AUC\n",
        "| model | device | system | samples/s | ratio | AUC after the last epoch "
        "| MB per step | cache hit rate | ms a step: pull / compute / push / wait / all |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in feed:
        c = r["case"]
        base = next(
            (
                b
                for b in feed
                if b["case"]["system"] == "torch"
                and b["case"]["model"] == c["model"]
                and b["case"]["batch"] == c["batch"]
                and b["case"].get("device") == c.get("device")
            ),
            None,
        )
        ratio = f"{r['median_samples_per_s'] / base['median_samples_per_s']:.2f}" if base else "-"
        mb = f"{r['bytes_per_step'] / 1e6:.2f}" if "bytes_per_step" in r else "-"
        hit = f"{r['cache_hit_rate']:.2f}" if "cache_hit_rate" in r else "-"
        if "tier_hit_rate" in r:  # (a device tier's, where the worker cache is off)
            hit = f"tier {r['tier_hit_rate']:.2f}"
        ph = r.get("phase_ms")
        phases = (
            " / ".join(f"{ph[k]:.1f}" for k in ("pull_s", "compute_s", "push_s", "wait_s"))
            + f" / {ph['elapsed_s']:.1f}"
            if ph
            else "-"
        )
        out.append(
            f"| {c['model']} | {c.get('device', 'cpu')} | {c['system']} | "
            f"{_fmt_sps(r['median_samples_per_s'])} | {ratio} | {r['final_auc']:.4f} | {mb} | "
            f"{hit} | {phases} |"
        )
    return out


def machine() -> dict[str, Any]:
    import numpy
    import ray
    import torch

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "mem_mib": mem,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "numpy": numpy.__version__,
        "gpu": torch.cuda.is_available(),
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a few minutes: fewer cases, epochs, rows")
    p.add_argument("--suite", default="census,synthetic,table", help="census,synthetic,table")
    p.add_argument("--systems", default=None, help="comma-separated systems (default: per suite)")
    p.add_argument("--batches", default=None, help="comma-separated global batch sizes")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the one-process baselines and of a lone angelps worker (default 1: "
        "on a busy 2-core machine a second OpenMP thread spins and slows DeepFM down 5-10x)",
    )
    p.add_argument("--models", default="FM,DeepFM", help="feed suite: FM,DeepFM")
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="feed suite: where plain PyTorch keeps its table and angelps workers compute",
    )
    p.add_argument("--timeout", type=float, default=None, help="seconds per run")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole list N times, interleaved; tables show the median samples/s",
    )
    p.add_argument("--out", default=None, help="JSON output (default bench/results/...)")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--markdown",
        metavar="JSON",
        default=None,
        help="print the tables of a results file as Markdown and exit",
    )
    args = p.parse_args()

    if args.markdown:
        report = json.loads(Path(args.markdown).read_text())
        summarise(report["results"])
        sys.stdout.write(markdown(report))
        return 0

    if args.case:
        case = json.loads(args.case)
        out = run_case(case)
        print("RESULT " + json.dumps(out))
        return 0

    out_path = (
        Path(args.out)
        if args.out
        else BENCH
        / "results"
        / ("train_throughput_quick.json" if args.quick else "train_throughput.json")
    )
    built = build_cases(args)
    unknown = set(args.systems.split(",") if args.systems else ()) - {c["system"] for c in built}
    if unknown:  # a misspelt system would otherwise be a run silently left out
        p.error(f"--systems: no {', '.join(sorted(unknown))} in the suites {args.suite}")
    cases = [
        {**c, "repeat": i} if args.repeat > 1 else c for i in range(args.repeat) for c in built
    ]
    timeout = args.timeout or (300 if args.quick else 900)
    report: dict[str, Any] = {
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_before": os.getloadavg(),
        "argv": sys.argv[1:],
        "results": [],
    }
    print(
        f"{len(cases)} runs; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    for i, case in enumerate(cases, 1):
        load = os.getloadavg()[0]
        r = run_in_subprocess(case, timeout)
        r["case"] = {k: v for k, v in case.items() if k != "data"} | (
            {"data": {k: v for k, v in case["data"].items() if k != "spec"}}
            if "data" in case
            else {}
        )
        r["load_at_start"] = load
        report["results"].append(r)
        status = (
            r.get("error", "").splitlines()[-1][:80]
            if "error" in r
            else (
                f"{steady_sps(r['epochs']):,.0f} samples/s, AUC {r['epochs'][-1].get('valid_auc') or math.nan:.4f}"
            )
        )
        print(
            f"[{i}/{len(cases)}] {case['suite']} {case['model']} b{case['batch']} "
            f"{case.get('num_ids', '')} {case['system']}: {status} ({r['elapsed_s']:.0f} s)",
            flush=True,
        )
        summarise(report["results"])
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(report, indent=1, default=str))
    report["load_after"] = os.getloadavg()
    summarise(report["results"])
    report["table"] = print_table(report["results"])
    out_path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
