"""Validation quality of the example jobs next to Angel's published numbers: 3 seeds, mean ± sd.

    python bench/quality.py                      # every job, seeds 0 1 2
    python bench/quality.py --jobs lr_a9a fm_census --seeds 0 1 2 --out bench/results/quality.json

Runs each conf/<job>.properties with ``ml.seed`` = each seed on one local Ray (started once),
prints a table and writes JSON. docs/quality.md records a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# job -> (metric, Angel's published value or None, what Angel's number is)
JOBS: dict[str, tuple[str, float | None]] = {
    "lr_a9a": ("valid_auc", 0.899),
    "lr_census": ("valid_auc", 0.900),
    "fm_census": ("valid_auc", 0.900),
    "deepfm_census": ("valid_auc", 0.904),
    "wideanddeep_census": ("valid_auc", 0.904),
    "nfm_census": ("valid_auc", 0.906),
    "pnn_census": ("valid_auc", 0.905),
    "lr_w6a": ("valid_auc", 0.968),
    "dnn_w6a": ("valid_auc", 0.982),
    "linreg_abalone": ("valid_r2", 0.47),
    "robustreg_abalone": ("valid_r2", 0.4517),
    "softmax_dna": ("valid_accuracy", None),
    "svm_a9a": ("valid_auc", None),
    "mlr_census": ("valid_auc", None),
}


# Linear jobs: the exact optimum of the same model on the same split (scikit-learn), which
# bounds what any optimizer can reach there.
REFERENCE = {"lr_a9a", "lr_census", "lr_w6a", "linreg_abalone"}


def sklearn_reference(job: str) -> float:
    """scikit-learn's fit of the job's linear model on the job's own train/validation split."""
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.metrics import r2_score, roc_auc_score

    from angelconf.config import load_config
    from learners import data
    from learners.keys import all_keys

    conf = load_config(ROOT / "conf" / f"{job}.properties", {}, all_keys())
    train, valid = data.load_train_valid(data.DataOptions.from_config(conf))
    n = int(conf["ml.feature.index.range"])
    xt, xv = train.to_dense(n), valid.to_dense(n)
    if job == "linreg_abalone":
        model = LinearRegression().fit(xt, train.labels)
        return float(r2_score(valid.labels, model.predict(xv)))
    yt, yv = data.binary_labels01(train.labels), data.binary_labels01(valid.labels)
    best = 0.0
    for c in (0.1, 1.0, 10.0):
        model = LogisticRegression(C=c, max_iter=5000).fit(xt, yt)
        best = max(best, float(roc_auc_score(yv, model.decision_function(xv))))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--jobs", nargs="*", default=list(JOBS), help="job names (conf/<job>.properties)"
    )
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "quality.json"))
    p.add_argument(
        "--reference-only",
        action="store_true",
        help="only print scikit-learn's optimum of the linear jobs on the same splits",
    )
    args = p.parse_args(argv)
    if args.reference_only:
        for job in args.jobs:
            if job in REFERENCE:
                print(f"{job}: scikit-learn best {JOBS[job][0]} {sklearn_reference(job):.4f}")
        return 0

    import ray

    from learners.job.learner import GraphLearner

    ray.init(num_cpus=2, include_dashboard=False, namespace="angelps", log_to_driver=False)
    rows = []
    try:
        for job in args.jobs:
            metric, angel = JOBS[job]
            values, times = [], []
            for seed in args.seeds:
                learner = GraphLearner.from_properties(
                    ROOT / "conf" / f"{job}.properties",
                    {
                        "ml.seed": seed,
                        "angel.job.name": f"q_{job}_{seed}",
                        "angel.log.path": str(ROOT / "runs" / "quality" / f"{job}_{seed}"),
                    },
                    quiet=True,
                )
                t0 = time.perf_counter()
                try:
                    res = learner.train()
                finally:
                    learner.shutdown()
                values.append(float(res.summary[metric]))
                times.append(time.perf_counter() - t0)
                print(
                    f"  {job} seed {seed}: {metric} {values[-1]:.4f} ({times[-1]:.1f} s)",
                    flush=True,
                )
            mean = statistics.fmean(values)
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            rows.append(
                {
                    "job": job,
                    "metric": metric,
                    "values": values,
                    "mean": mean,
                    "sd": sd,
                    "angel": angel,
                    "seconds_mean": statistics.fmean(times),
                }
            )
    finally:
        ray.shutdown()
    print()
    print(f"| job | metric | angelps (mean ± sd, {len(args.seeds)} seeds) | Angel | s/run |")
    print("|---|---|---|---|---|")
    for r in rows:
        angel = f"{r['angel']:.4g}" if r["angel"] is not None else "—"
        print(
            f"| {r['job']} | {r['metric']} | {r['mean']:.4f} ± {r['sd']:.4f} | {angel} | "
            f"{r['seconds_mean']:.0f} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seeds": args.seeds, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
