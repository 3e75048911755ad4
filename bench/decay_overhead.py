"""Per-step cost of decay's ``next()`` against torch's ``scheduler.step()``, for every schedule.

torch side: the torch scheduler of the same name on a one-parameter SGD optimizer; for
schedules torch does not have (Angel's four, the Warmup* family), the ``LambdaLR`` that computes
the same multiplier (how KempnerForge and Hugging Face implement them). Each figure is the best
of several repeats of N steps, in nanoseconds per step.

The rule it checks: a schedule's per-update cost stays negligible next to a training step (which
takes milliseconds): under :data:`TARGET_NS` nanoseconds per update, for every schedule.

    python bench/decay_overhead.py [--steps N] [--repeats R] [--json bench/results/decay_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import decay

S = torch.optim.lr_scheduler
LR = 0.5
#: The most a schedule may cost per update, in nanoseconds (a training step costs milliseconds).
TARGET_NS = 2_000


def _lam(o: torch.optim.Optimizer, f: Callable[[int], float]) -> S.LRScheduler:
    return S.LambdaLR(o, f)


def cases(
    n: int,
) -> list[
    tuple[str, Callable[[], decay.StepSizeScheduler], Callable[[torch.optim.Optimizer], object]]
]:
    """(name, our schedule, torch equivalent) for every schedule; horizons exceed n."""
    total = n + 10
    return [
        (
            "ConstantLearningRate",
            lambda: decay.ConstantLearningRate(LR),
            lambda o: _lam(o, lambda k: 1.0),
        ),
        (
            "StandardDecay",
            lambda: decay.StandardDecay(LR, 0.001),
            lambda o: _lam(o, lambda k: 1 / math.sqrt(1 + 0.001 * (k + 1))),
        ),
        (
            "CorrectionDecay",
            lambda: decay.CorrectionDecay(LR, 0.001, 0.9),
            lambda o: _lam(
                o, lambda k: 1 / math.sqrt(1 + 0.001 * (k + 1)) * 0.1 / (1 - 0.9 ** (k + 1))
            ),
        ),
        (
            "WarmRestarts",
            lambda: decay.WarmRestarts(LR, 0.001, 100),
            lambda o: S.CosineAnnealingWarmRestarts(o, 100, 2, LR / 10),
        ),
        ("StepLR", lambda: decay.StepLR(LR, 100, 0.9), lambda o: S.StepLR(o, 100, 0.9)),
        (
            "MultiStepLR",
            lambda: decay.MultiStepLR(LR, [n // 4, n // 2, 3 * n // 4]),
            lambda o: S.MultiStepLR(o, [n // 4, n // 2, 3 * n // 4]),
        ),
        ("ConstantLR", lambda: decay.ConstantLR(LR, 0.5, 100), lambda o: S.ConstantLR(o, 0.5, 100)),
        (
            "LinearLR",
            lambda: decay.LinearLR(LR, 0.1, 1.0, n // 2),
            lambda o: S.LinearLR(o, 0.1, 1.0, n // 2),
        ),
        (
            "ExponentialLR",
            lambda: decay.ExponentialLR(LR, 0.9999),
            lambda o: S.ExponentialLR(o, 0.9999),
        ),
        (
            "PolynomialLR",
            lambda: decay.PolynomialLR(LR, total, 2.0),
            lambda o: S.PolynomialLR(o, total, 2.0),
        ),
        (
            "CosineAnnealingLR",
            lambda: decay.CosineAnnealingLR(LR, 1000),
            lambda o: S.CosineAnnealingLR(o, 1000),
        ),
        (
            "CosineAnnealingWarmRestarts",
            lambda: decay.CosineAnnealingWarmRestarts(LR, 100, 2),
            lambda o: S.CosineAnnealingWarmRestarts(o, 100, 2),
        ),
        (
            "CyclicLR",
            lambda: decay.CyclicLR(0.05, LR, step_size_up=500),
            lambda o: S.CyclicLR(o, 0.05, LR, 500),
        ),
        (
            "OneCycleLR",
            lambda: decay.OneCycleLR(LR, total),
            lambda o: S.OneCycleLR(o, LR, total_steps=total),
        ),
        (
            "ReduceLROnPlateau",
            lambda: decay.ReduceLROnPlateau(LR, patience=5),
            lambda o: S.ReduceLROnPlateau(o, patience=5),
        ),
        (
            "WarmupCosine",
            lambda: decay.WarmupCosine(LR, total, warmup_steps=1000),
            lambda o: _lam(o, _kf_cosine(1000, total - 1000, 0.1)),
        ),
        (
            "WarmupLinear",
            lambda: decay.WarmupLinear(LR, total, warmup_steps=1000),
            lambda o: _lam(o, _kf_linear(1000, total - 1000, 0.1)),
        ),
        (
            "WarmupConstant",
            lambda: decay.WarmupConstant(LR, warmup_steps=1000),
            lambda o: _lam(o, lambda k: min(1.0, k / 1000)),
        ),
        (
            "WarmupStableDecay",
            lambda: decay.WarmupStableDecay(LR, total, warmup_steps=1000, stable_steps=n // 2),
            lambda o: _lam(o, _kf_wsd(1000, n // 2, total - 1000 - n // 2, 0.1)),
        ),
        (
            "Rex",
            lambda: decay.Rex(LR, total, warmup_steps=1000),
            lambda o: _lam(o, _kf_rex(1000, total - 1000, 0.1, 1.0)),
        ),
        (
            "InverseSqrt",
            lambda: decay.InverseSqrt(LR, warmup_steps=1000),
            lambda o: _lam(
                o, lambda k: k / 1000 if k < 1000 else 1 / math.sqrt((k - 1000 + 1000) / 1000)
            ),
        ),
        ("NoDecay", lambda: decay.NoDecay(LR), lambda o: _lam(o, lambda k: 1.0)),
        (
            "SequentialLR",
            lambda: decay.SequentialLR(
                [decay.LinearLR(LR, 0.1, 1.0, 100), decay.CosineAnnealingLR(LR, 1000)], [100]
            ),
            lambda o: S.SequentialLR(
                o, [S.LinearLR(o, 0.1, 1.0, 100), S.CosineAnnealingLR(o, 1000)], [100]
            ),
        ),
        (
            "ChainedScheduler",
            lambda: decay.ChainedScheduler(
                [decay.ConstantLR(LR, 0.5, 100), decay.ExponentialLR(LR, 0.9999)]
            ),
            lambda o: S.ChainedScheduler([S.ConstantLR(o, 0.5, 100), S.ExponentialLR(o, 0.9999)]),
        ),
    ]


def _kf_cosine(w: int, d: int, r: float) -> Callable[[int], float]:
    return lambda k: (
        k / w if k < w else r + 0.5 * (1 - r) * (1 + math.cos(math.pi * min(1.0, (k - w) / d)))
    )


def _kf_linear(w: int, d: int, r: float) -> Callable[[int], float]:
    return lambda k: k / w if k < w else 1 - (1 - r) * min(1.0, (k - w) / d)


def _kf_wsd(w: int, s: int, d: int, r: float) -> Callable[[int], float]:
    def f(k: int) -> float:
        if k < w:
            return k / w
        if k < w + s:
            return 1.0
        p = min(1.0, (k - w - s) / d)
        return r + 0.5 * (1 - r) * (1 + math.cos(math.pi * p))

    return f


def _kf_rex(w: int, d: int, r: float, a: float) -> Callable[[int], float]:
    return lambda k: k / w if k < w else max(r, (1 - min(1.0, (k - w) / max(d, 1))) ** a)


def plan_cases(n: int) -> list[tuple[str, Callable[[], object]]]:
    """(name, rate plan) for what the training loop pays per update: ``RatePlan.rates()`` (the
    step sizes and momenta of the update, built into what the push carries) and ``advance()``."""
    from learners.job.rate_plan import RatePlan

    total = n + 10
    g, rows = 256, 256 * 1000  # a global batch; an epoch of 1000 updates
    return [
        ("StandardDecay", lambda: RatePlan(decay.StandardDecay(LR, 0.001), on_batch=True)),
        (
            "OneCycleLR, momentum applied",
            lambda: RatePlan(decay.OneCycleLR(LR, total_steps=total), on_batch=True),
        ),
        (
            "CosineAnnealingLR in samples",
            lambda: RatePlan(
                decay.CosineAnnealingLR(LR, t_max=total * g), None, "samples", True, g, rows
            ),
        ),
        (
            "WarmupCosine in epochs",
            lambda: RatePlan(
                decay.WarmupCosine(LR, total_steps=100, warmup_steps=1),
                None,
                "epochs",
                True,
                g,
                rows,
            ),
        ),
        (
            "StepLR + a table's CosineAnnealingLR",
            lambda: RatePlan(
                decay.StepLR(LR, 1000),
                {"embedding": decay.CosineAnnealingLR(0.1, total)},
                on_batch=True,
            ),
        ),
        (
            "OneCycleLR + 2 tables, in samples",
            lambda: RatePlan(
                decay.OneCycleLR(LR, total_steps=total * g),
                {
                    "embedding": decay.ConstantLearningRate(0.05),
                    "dense": decay.WarmupCosine(LR, total_steps=total * g, warmup_steps=g * 100),
                },
                "samples",
                True,
                g,
                rows,
            ),
        ),
    ]


def time_plan(make: Callable[[], object], n: int) -> float:
    p: Any = make()
    rates, advance = p.rates, p.advance
    t0 = time.process_time_ns()
    for _ in range(n):
        rates()
        advance()
    return (time.process_time_ns() - t0) / n


def time_ours(make: Callable[[], decay.StepSizeScheduler], n: int, plateau: bool) -> float:
    s = make()
    t0 = time.process_time_ns()
    if plateau:  # the metric step, once per validation (not per update)
        step = s.step  # type: ignore[attr-defined]
        for _ in range(n):
            step(1.0)
    else:
        nxt = s.next
        for _ in range(n):
            nxt()
    return (time.process_time_ns() - t0) / n


def time_torch(make: Callable[[torch.optim.Optimizer], object], n: int, plateau: bool) -> float:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=LR, momentum=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = make(opt)
        step = sched.step  # type: ignore[attr-defined]
        t0 = time.process_time_ns()
        if plateau:
            for _ in range(n):
                step(1.0)
        else:
            for _ in range(n):
                step()
        return (time.process_time_ns() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=20_000, help="steps per repeat (20000)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats; the best is kept (5)")
    ap.add_argument(
        "--json", default="bench/results/decay_overhead.json", help="where to write the results"
    )
    ap.add_argument("--markdown", metavar="PATH", help="also write the table as PATH")
    args = ap.parse_args()
    rows = []
    print(f"{'schedule':<28} {'decay ns':>9} {'torch ns':>9} {'ratio':>7}")
    all_cases = cases(args.steps)
    plateau_case = next(c for c in all_cases if c[0] == "ReduceLROnPlateau")
    all_cases.append(("ReduceLROnPlateau.step(metric)", plateau_case[1], plateau_case[2]))
    for name, ours, theirs in all_cases:
        # Per update, ReduceLROnPlateau costs next() here and step(metric) in torch (torch has
        # no per-update call); its metric step, once per validation, is the extra row.
        plateau = name == "ReduceLROnPlateau.step(metric)"
        # Interleaved repeats, best of each: the machine may be shared, CPU time is measured.
        a = b = math.inf
        for _ in range(args.repeats):
            a = min(a, time_ours(ours, args.steps, plateau))
            b = min(b, time_torch(theirs, args.steps, name.startswith("ReduceLROnPlateau")))
        rows.append(
            {
                "schedule": name,
                "decay_ns_per_step": round(a, 1),
                "torch_ns_per_step": round(b, 1),
                "ratio": round(b / a, 1),
            }
        )
        print(f"{name:<28} {a:9.0f} {b:9.0f} {b / a:6.1f}x")
    per_update = [r for r in rows if not r["schedule"].endswith("step(metric)")]
    worst = min(r["ratio"] for r in per_update)
    slowest = max(r["decay_ns_per_step"] for r in per_update)
    print(
        f"slowest per-update cost: {slowest:.0f} ns (target < {TARGET_NS} ns); "
        f"smallest torch / decay ratio: {worst:.1f}x"
    )
    plans = []
    print(f"\n{'rate plan (rates + advance)':<40} {'ns/update':>9}")
    for name, make in plan_cases(args.steps):
        best = min(time_plan(make, args.steps) for _ in range(args.repeats))
        plans.append({"plan": name, "ns_per_update": round(best, 1)})
        print(f"{name:<40} {best:9.0f}")
    slowest_plan = max(r["ns_per_update"] for r in plans)
    print(f"slowest rate plan per update: {slowest_plan:.0f} ns (target < {TARGET_NS} ns)")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "steps": args.steps,
        "repeats": args.repeats,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }
    out.write_text(
        json.dumps(
            {
                "meta": meta,
                "results": rows,
                "max_per_update_ns": slowest,
                "min_per_update_ratio": worst,
                "rate_plans": plans,
                "max_rate_plan_ns": slowest_plan,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    if args.markdown:
        text = markdown(meta, rows, slowest, worst) + plan_markdown(plans, slowest_plan, slowest)
        Path(args.markdown).write_text(text)
        print(f"wrote {args.markdown}")


def markdown(
    meta: dict[str, object], rows: list[dict[str, object]], slowest: float, worst: float
) -> str:
    """docs/benchmarks-decay.md: the table and how it was measured."""
    lines = [
        "# Benchmark: step-size scheduler overhead",
        "",
        "Cost of one step of the schedule: decay's `next()` against torch's `scheduler.step()` on a",
        "one-parameter SGD optimizer (for schedules torch lacks, the `LambdaLR` computing the same",
        "multiplier, as KempnerForge and Hugging Face build them). CPU time per step, best of "
        f"{meta['repeats']} interleaved repeats of {meta['steps']} steps; Python {meta['python']}, "
        f"torch {meta['torch']}, {meta['machine']}.",
        "",
        "    python bench/decay_overhead.py --markdown docs/benchmarks-decay.md",
        "",
        "| schedule | decay ns/step | torch ns/step | torch / decay |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['schedule']} | {r['decay_ns_per_step']:.0f} | {r['torch_ns_per_step']:.0f} | "
            f"{r['ratio']:.1f}x |"
        )
    lines += [
        "",
        f"Slowest per-update cost: **{slowest:.0f} ns** (target: under {TARGET_NS} ns, "
        f"negligible next to a training step); smallest torch / decay ratio: {worst:.1f}x.",
        "",
        "How: a schedule is a pure function of the update count, and `next()` is",
        "`lr_at(count)` then `count += 1`: one evaluation of the schedule's formula (written",
        "once, in `_lr`), no values computed ahead. The training loop calls `peek()` and",
        "`advance()`, the same formula and count. torch recomputes and writes the lr through its",
        "`LRScheduler.step()` machinery on every call. ReduceLROnPlateau's per-update cost is",
        "`next()` (torch has no per-update call, so its `step(metric)` is the comparison); its",
        "metric step, once per validation, is the separate `step(metric)` row and is not a",
        "per-update cost. The measuring machine is shared (2 cores, other jobs running), so",
        "single figures vary by tens of percent between runs; the ratios are steadier.",
        "",
    ]
    return "\n".join(lines)


def plan_markdown(plans: list[dict[str, Any]], slowest: float, before: float) -> str:
    """The rate plan's section of docs/benchmarks-decay.md."""
    lines = [
        "",
        "## What the training loop pays per update",
        "",
        "The learner does not call `next()`: each update, the worker's copy of the rate plan",
        "(learners/job/rate_plan.py) gives the update's step sizes and momenta (`rates()`: the job's",
        "schedule read at its count or at the samples seen, each table's own schedule, and the",
        "`StepRates` the push carries when more than one step size is sent) and then counts the",
        "update (`advance()`). CPU time per update, best of the same repeats:",
        "",
        "| rate plan | ns/update |",
        "|---|---:|",
    ]
    lines += [f"| {r['plan']} | {r['ns_per_update']:.0f} |" for r in plans]
    lines += [
        "",
        f"Slowest: **{slowest:.0f} ns** per update (target: under {TARGET_NS} ns). Before the rate",
        "plan the worker called the schedule's `peek()` and `advance()` per update, about the",
        f"`next()` figures above (slowest {before:.0f} ns). A plain schedule (no momentum, no table",
        "of its own, counted in updates) still pushes a float; the others read each schedule once",
        "per update (lr and momentum in one pass) and build the one `StepRates` tuple the push",
        "carries.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
