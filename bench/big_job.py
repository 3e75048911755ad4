"""A job over a table of about 10^8 rows, end to end: train, save, resume, predict, evaluate.

    python bench/big_job.py --json bench/results/big_job.json            # 10^8 ids (the issue)
    python bench/big_job.py --ids 2000000 --json /tmp/big.json           # a smaller table

The data (bench/synthetic.py, ``spread``): ``--fields`` fields, ``--ids`` distinct ids over the
whole non-negative int64 range ``[0, 2^63)`` (the data readers take 0-based ids; negative keys
are covered by the shard tests and bench/ps_scale.py), so the tables are unbounded (``ml.feature.index.range=-1``,
the shards' hash index). The training file walks every id once (``ids / fields`` rows, written a
chunk at a time), then ``--zipf-rows`` power-law rows; validation is ``--valid-rows`` power-law
rows. The job: ``--model`` (FM of rank ``--rank``: a weight table of 1 column and an embedding
table of ``rank`` columns, Momentum) with 1 worker and ``--shards`` shard actors, every row on
a device tier of ``--tier-rows`` rows a table on the worker (``angel.sparse.placement=worker``
with ``angel.worker.table.capacity``; the shards hold every row, the worker the rows it reads
most recently; ``--tier-rows 0``: every row on the shards only, ``"device_tier": null``).
Phases, each timed and marked ok or not:

* train: one epoch (its end-of-epoch checkpoint included); then the shards' own account of
  their rows and bytes (``rows_held``, ``bytes_per_row_shards``);
* save: ``GraphLearner.save`` to a second folder (``checkpoint_bytes``: its size on disk);
* resume: a new job resumes the first one's checkpoint for a second epoch (over the same ids)
  and checks that the shards hold the same rows after it;
* predict and evaluate: ``GraphLearner.load`` of the saved model, on the validation file.

``peak_rss_mib_total`` is the peak over the run of the resident memory of this process and all
its descendants (Ray's processes, the workers and shards), sampled from /proc every
``--sample-s`` seconds (each phase's own peak in ``phases``); ``peak_pss_mib_total`` counts
shared pages once (smaps_rollup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import SyntheticSpec, cover_chunk, generate, write_parquet, write_parquet_chunks

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20


# --- memory of the job's processes ---------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def memory(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) bytes summed over ``pids`` (processes gone meanwhile count 0)."""
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", encoding="ascii") as f:
                rss += int(f.read().split()[1]) * PAGE
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return rss, pss


class Sampler(threading.Thread):
    """Peak RSS and PSS of this process's tree, sampled every ``every`` seconds."""

    def __init__(self, every: float) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.peak_rss = self.peak_pss = 0
        self.peak_procs = 0
        self.phase_rss = 0  # peak RSS since the last reset (one phase's)
        self._halt = threading.Event()

    def sample(self) -> None:
        pids = tree(os.getpid())
        rss, pss = memory(pids)
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.phase_rss = max(self.phase_rss, rss)
        self.peak_procs = max(self.peak_procs, len(pids))

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()


# --- data -------------------------------------------------------------------------------------


def write_data(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    spec = SyntheticSpec(num_ids=args.ids, fields=args.fields, spread=True)
    cover = spec.ids_per_field
    t = time.perf_counter()

    def chunks() -> Iterator[Any]:
        for a in range(0, cover, args.chunk_rows):
            yield cover_chunk(spec, a, min(a + args.chunk_rows, cover))
        for a in range(0, args.zipf_rows, args.chunk_rows):
            yield generate(spec, min(args.chunk_rows, args.zipf_rows - a), seed=1 + a)

    _, rows = write_parquet_chunks(folder / "train.parquet", chunks())
    write_parquet(folder / "valid.parquet", generate(spec, args.valid_rows, seed=-1 % 2**32))
    return {
        "distinct_ids": cover * spec.fields,
        "train_rows": rows,
        "valid_rows": args.valid_rows,
        "fields": spec.fields,
        "seconds": time.perf_counter() - t,
        "bytes": sum(p.stat().st_size for p in folder.glob("*.parquet")),
    }


# --- the job ----------------------------------------------------------------------------------


def job_keys(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    return {
        "ml.model.class.name": args.model,
        "ml.fm.rank": args.rank,
        "ml.fm.field.num": args.fields,
        "ml.feature.index.range": -1,  # any int64 id: unbounded tables
        "ml.data.type": "parquet",
        "angel.train.data.path": str(folder / "train.parquet"),
        "angel.validate.data.path": str(folder / "valid.parquet"),
        "ml.minibatch.size": args.batch,
        "ml.epoch.num": 1,
        "ml.learn.rate": 0.05,
        "ml.inputlayer.optimizer": "Momentum",
        "ml.embedding.optimizer": "Momentum",
        "ml.embedding.init.std": 0.01,
        "ml.data.use.shuffle": "false",
        "angel.workergroup.number": 1,
        "angel.ps.number": args.shards,
        **(
            {
                "angel.sparse.placement": "worker",
                "angel.worker.table.capacity": str(args.tier_rows),
            }
            if args.tier_rows
            else {"angel.sparse.placement": "ps"}
        ),
        "angel.log.path": str(folder / "logs"),
        "angel.save.model.path": str(folder / "model"),
        "angel.job.name": f"bigjob{os.getpid()}",
        **dict(kv.split("=", 1) for kv in args.set),
    }


def shard_account(learner: Any) -> dict[str, Any]:
    """Rows and bytes the shards report, per table and in total."""
    # The PS client of the learner (a bench reads it; users see these in the step records).
    stats = learner.actors.ps.stats()
    rows: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for s in stats:
        for t, n in s["rows"].items():
            rows[t] = rows.get(t, 0) + int(n)
            nbytes[t] = nbytes.get(t, 0) + int(s["bytes"][t])
    total_rows, total_bytes = sum(rows.values()), sum(nbytes.values())
    return {
        "rows": rows,
        "bytes": nbytes,
        "bytes_per_row": {t: nbytes[t] / max(rows[t], 1) for t in rows},
        "rows_total": total_rows,
        "bytes_total": total_bytes,
        "index": sorted({k for s in stats for k in s["index"].values()}),
    }


def tier_account(folder: Path, rows: int) -> dict[str, Any] | None:
    """The device tier's figures from the training job's step records (None without one)."""
    if not rows:
        return None
    steps = []
    for metrics in (folder / "logs").glob("*/metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "step" and rec.get("tier_hit_rate") is not None:
                steps.append(rec)
    if not steps:
        return {"rows_per_table": rows}
    n = sum(r["updates"] for r in steps)
    return {
        "rows_per_table": rows,
        "hit_rate": sum(r["tier_hit_rate"] * r["updates"] for r in steps) / n,
        "misses_per_step": sum(r["tier_misses_per_step"] * r["updates"] for r in steps) / n,
        "writebacks_per_step": sum(r["tier_writebacks_per_step"] * r["updates"] for r in steps) / n,
    }


def phase(phases: dict[str, Any], name: str, fn: Any, sampler: Sampler) -> Any:
    """Run one phase: ok or not, its seconds and its peak RSS (all processes) in ``phases``."""
    t = time.perf_counter()
    sampler.phase_rss = 0
    try:
        out = fn()
        phases[name] = {"ok": True, "seconds": round(time.perf_counter() - t, 3)}
        return out
    except Exception as e:  # a failed phase is reported, the others still run
        phases[name] = {
            "ok": False,
            "seconds": round(time.perf_counter() - t, 3),
            "error": f"{type(e).__name__}: {e}"[:500],
        }
        print(f"big_job: {name} failed: {e}", file=sys.stderr, flush=True)
        return None
    finally:
        sampler.sample()
        phases[name]["peak_rss_mib"] = round(sampler.phase_rss / MIB, 1)


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from learners.job import cluster
    from learners.job.learner import GraphLearner

    sampler = Sampler(args.sample_s)
    sampler.start()
    out: dict[str, Any] = {
        "device_tier": None,
        "placement": "worker" if args.tier_rows else "ps",
        "shards": args.shards,
    }
    phases: dict[str, Any] = {}
    try:
        out["data"] = data = write_data(args, folder)
        print(f"big_job: data {data}", flush=True)
        keys = job_keys(args, folder)
        cluster.start_or_join(None, 60.0)  # one local Ray for every phase
        learner = GraphLearner(keys, quiet=not args.verbose)
        try:
            result = phase(phases, "train", learner.train, sampler)
            if result is not None:
                row = result.history[-1]
                out["samples_per_s"] = float(row["train_samples_per_s"])
                out["valid_auc_after_train"] = row.get("valid_auc")
                out["shards_after_train"] = acc = shard_account(learner)
                # (and the tables the worker holds whole: the biases, with a device tier)
                placed = learner.actors.placed
                whole = {t.name: t.rows for t in placed.whole()} if placed is not None else {}
                out["rows_on_workers"] = whole
                out["rows_held"] = acc["rows_total"] + sum(whole.values())
                out["bytes_per_row_shards"] = acc["bytes_total"] / max(acc["rows_total"], 1)
                # (the end-of-epoch save wrote the tier's rows back: the shards hold them all)
                out["device_tier"] = tier_account(folder, args.tier_rows)
            saved = folder / "saved"
            phase(phases, "save", lambda: learner.save(saved), sampler)
            if phases["save"]["ok"]:
                out["checkpoint_bytes"] = sum(
                    p.stat().st_size for p in saved.rglob("*") if p.is_file()
                )
        finally:
            learner.shutdown()
        print(f"big_job: trained and saved {phases}", flush=True)

        def resume() -> dict[str, Any]:
            # The first job's checkpoint resumed for one more epoch (a resume with nothing left
            # to train is refused): the same ids again, so the shards must hold the same rows.
            again = GraphLearner({**keys, "ml.epoch.num": 2}, quiet=not args.verbose)
            try:
                res = again.train(resume=True)
                out["samples_per_s_resumed"] = float(res.history[-1]["train_samples_per_s"])
                acc = shard_account(again)
            finally:
                again.shutdown()
            want = out.get("shards_after_train", {}).get("rows")
            if acc["rows"] != want:
                raise RuntimeError(f"resumed shards hold {acc['rows']} rows, trained {want}")
            return acc

        out["shards_after_resume"] = phase(phases, "resume", resume, sampler)
        valid = folder / "valid.parquet"
        models: list[Any] = []

        def predict() -> Any:
            # The saved model loaded (its shards refilled), then a prediction of every row.
            models.append(GraphLearner.load(saved, keys, quiet=not args.verbose))
            return models[0].predict(valid)

        try:
            pred = phase(phases, "predict", predict, sampler)
            if pred is not None:
                out["predictions"] = len(pred)
            if models:
                out["evaluate"] = phase(
                    phases, "evaluate", lambda: models[0].evaluate(valid), sampler
                )
            else:
                phases["evaluate"] = {"ok": False, "seconds": 0.0, "error": "no model loaded"}
        finally:
            for m in models:
                m.shutdown()
    finally:
        sampler.stop()
        from learners.job import cluster

        cluster.stop()
    out["phases"] = phases
    out["peak_rss_mib_total"] = round(sampler.peak_rss / MIB, 1)
    out["peak_pss_mib_total"] = round(sampler.peak_pss / MIB, 1)
    out["peak_processes"] = sampler.peak_procs
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", required=True, metavar="PATH", help="where the results go")
    p.add_argument("--ids", type=int, default=100_000_000, help="distinct ids (table rows)")
    p.add_argument("--fields", type=int, default=26)
    p.add_argument("--zipf-rows", type=int, default=200_000, help="power-law rows after the walk")
    p.add_argument("--valid-rows", type=int, default=50_000)
    p.add_argument("--model", default="FactorizationMachines")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument(
        "--tier-rows",
        type=int,
        default=1_000_000,
        help="rows of each table on the worker's device (0: every row on the shards only)",
    )
    p.add_argument("--chunk-rows", type=int, default=1 << 18, help="rows generated at a time")
    p.add_argument("--sample-s", type=float, default=0.5, help="memory sampling period")
    p.add_argument("--dir", help="working folder (default: a temporary one, removed after)")
    p.add_argument("--verbose", action="store_true", help="the jobs' progress lines")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another key of the jobs, e.g. --set angel.ps.backup.interval=100 (repeatable)",
    )
    args = p.parse_args(argv)
    if args.ids < args.fields:
        p.error(f"--ids {args.ids} must be at least --fields {args.fields}")
    bad = [kv for kv in args.set if "=" not in kv]
    if bad:
        p.error(f"--set {bad[0]!r}: expected KEY=VALUE")
    folder = Path(args.dir or tempfile.mkdtemp(prefix="big-job-"))
    folder.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    try:
        result = run(args, folder)
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    result["seconds_total"] = round(time.perf_counter() - t, 1)
    result["args"] = {k: v for k, v in vars(args).items() if k not in ("json", "dir")}
    result["machine"] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "mem_total_gib": round(os.sysconf("SC_PHYS_PAGES") * PAGE / (1 << 30), 1),
        "load": os.getloadavg(),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    ok = all(ph["ok"] for ph in result["phases"].values()) and len(result["phases"]) == 5
    print(json.dumps({k: result.get(k) for k in SUMMARY}, default=str))
    return 0 if ok else 1


SUMMARY = (
    "rows_held",
    "bytes_per_row_shards",
    "peak_rss_mib_total",
    "samples_per_s",
    "checkpoint_bytes",
    "phases",
)

if __name__ == "__main__":
    raise SystemExit(main())
