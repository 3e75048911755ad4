"""Generate docs/decay.md from the registry: ``python -m decay.render > docs/decay.md``.

Every schedule's section comes from its class docstring and constructor signature, every key
from its declaration, and every example from :data:`EXAMPLES` (the same examples the
``angelps schedule --catalogue`` verb plots into docs/img/decay/).
"""

from __future__ import annotations

import inspect
import sys

from decay.base import StepSizeScheduler
from decay.factory import from_conf
from decay.keys import CLASS_KEY, KEYS, LR_KEY, PREFIX
from decay.registry import CATALOGUE, COMPOSITE, FROM_TOTAL, schedule_keys
from decay.training_doc import TRAINING

__all__ = ["EXAMPLES", "render"]

#: One example configuration per schedule (properties), plotted in the catalogue.
EXAMPLES: dict[str, tuple[dict[str, str], int]] = {
    "ConstantLearningRate": ({"ml.learn.rate": "0.5"}, 100),
    "StandardDecay": ({"ml.learn.rate": "0.5", "ml.opt.decay.alpha": "0.05"}, 200),
    "CorrectionDecay": (
        {"ml.learn.rate": "0.5", "ml.opt.decay.alpha": "0.05", "ml.opt.decay.beta": "0.9"},
        200,
    ),
    "WarmRestarts": (
        {"ml.learn.rate": "0.5", "ml.opt.decay.intervals": "20", "ml.opt.decay.alpha": "0.5"},
        300,
    ),
    "StepLR": ({"ml.learn.rate": "0.5", "ml.opt.decay.step.size": "30"}, 120),
    "MultiStepLR": (
        {"ml.learn.rate": "0.5", "ml.opt.decay.milestones": "30,80", "ml.opt.decay.gamma": "0.3"},
        120,
    ),
    "ConstantLR": (
        {"ml.learn.rate": "0.5", "ml.opt.decay.factor": "0.5", "ml.opt.decay.total.iters": "20"},
        60,
    ),
    "LinearLR": (
        {
            "ml.learn.rate": "0.5",
            "ml.opt.decay.start.factor": "0.1",
            "ml.opt.decay.total.iters": "40",
        },
        60,
    ),
    "ExponentialLR": ({"ml.learn.rate": "0.5", "ml.opt.decay.gamma": "0.97"}, 120),
    "PolynomialLR": (
        {"ml.learn.rate": "0.5", "ml.opt.decay.total.iters": "80", "ml.opt.decay.power": "2"},
        100,
    ),
    "CosineAnnealingLR": (
        {"ml.learn.rate": "0.5", "ml.opt.decay.t.max": "50", "ml.opt.decay.eta.min": "0.05"},
        150,
    ),
    "CosineAnnealingWarmRestarts": (
        {"ml.learn.rate": "0.5", "ml.opt.decay.t.0": "10", "ml.opt.decay.t.mult": "2"},
        150,
    ),
    "CyclicLR": (
        {
            "ml.learn.rate": "0.05",
            "ml.opt.decay.max.lr": "0.5",
            "ml.opt.decay.step.size.up": "20",
            "ml.opt.decay.mode": "triangular2",
        },
        160,
    ),
    "OneCycleLR": ({"ml.learn.rate": "0.5", "ml.opt.decay.total.steps": "100"}, 100),
    "ReduceLROnPlateau": ({"ml.learn.rate": "0.5", "ml.opt.decay.patience": "2"}, 30),
    "WarmupCosine": (
        {
            "ml.learn.rate": "0.5",
            "ml.opt.decay.warmup.steps": "20",
            "ml.opt.decay.total.steps": "100",
        },
        120,
    ),
    "WarmupLinear": (
        {
            "ml.learn.rate": "0.5",
            "ml.opt.decay.warmup.steps": "20",
            "ml.opt.decay.total.steps": "100",
            "ml.opt.decay.min.lr.ratio": "0",
        },
        120,
    ),
    "WarmupConstant": ({"ml.learn.rate": "0.5", "ml.opt.decay.warmup.steps": "20"}, 100),
    "WarmupStableDecay": (
        {
            "ml.learn.rate": "0.5",
            "ml.opt.decay.warmup.steps": "10",
            "ml.opt.decay.stable.steps": "50",
            "ml.opt.decay.decay.steps": "30",
            "ml.opt.decay.decay.type": "sqrt",
        },
        100,
    ),
    "Rex": (
        {
            "ml.learn.rate": "0.5",
            "ml.opt.decay.warmup.steps": "10",
            "ml.opt.decay.total.steps": "100",
            "ml.opt.decay.rex.alpha": "2",
        },
        120,
    ),
    "InverseSqrt": ({"ml.learn.rate": "0.5", "ml.opt.decay.warmup.steps": "10"}, 200),
    "NoDecay": ({"ml.learn.rate": "0.5"}, 100),
    "SequentialLR": (
        {
            "ml.learn.rate": "0.5",
            "ml.opt.decay.schedulers": "LinearLR,CosineAnnealingLR",
            "ml.opt.decay.milestones": "10",
            "ml.opt.decay.0.start.factor": "0.05",
            "ml.opt.decay.0.total.iters": "10",
            "ml.opt.decay.1.t.max": "90",
        },
        100,
    ),
    "ChainedScheduler": (
        {
            "ml.learn.rate": "0.5",
            "ml.opt.decay.schedulers": "StepLR,CyclicLR",
            "ml.opt.decay.0.step.size": "40",
            "ml.opt.decay.0.gamma": "0.5",
            "ml.opt.decay.1.max.lr": "1.0",
            "ml.opt.decay.1.step.size.up": "10",
        },
        120,
    ),
}

# What an unset (None) default means, per constructor parameter.
_NONE_DEFAULT = {
    "base_lr": "ml.learn.rate",
    "max_lr": "ml.learn.rate",
    "step_size_down": "step.size.up",
    "scale_mode": "by mode",
    "eta_min": "ml.learn.rate/10",
    "total_steps": "total updates",
    "decay_steps": "total.steps − warmup (− stable)",
    "stable_steps": "total.steps − warmup − decay",
    "timescale": "warmup.steps, or 10000",
}

_FROM_TOTAL_DEFAULT = "total updates (else required)"


def example(name: str) -> tuple[StepSizeScheduler, int]:
    """The catalogue example of a schedule and its number of updates."""
    props, steps = EXAMPLES[name]
    return from_conf({CLASS_KEY: name, **props}, total_steps=steps), steps


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.10g}"
    return str(v)


def _default(cls: type[StepSizeScheduler], p: inspect.Parameter) -> str:
    if p.default is inspect.Parameter.empty:
        return _FROM_TOTAL_DEFAULT if p.name in FROM_TOTAL else "**required**"
    if p.default is None:
        return _NONE_DEFAULT.get(p.name, "unset")
    return f"`{_fmt(p.default)}`"


def _doc(cls: type) -> str:
    return inspect.cleandoc(cls.__doc__ or "")


def _first_sentence(cls: type) -> str:
    text = " ".join(_doc(cls).split("\n\n")[0].split())
    return text.replace("|", "\\|")


def _key_table(cls: type[StepSizeScheduler]) -> list[str]:
    by = {k.name: k for k in KEYS}
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    rows.append(f"| `{LR_KEY}` | float | `0.5` | {by[LR_KEY].doc} |")
    for suffix, p in schedule_keys(cls):
        key = by[PREFIX + suffix]
        rows.append(f"| `{key.name}` | {key.type} | {_default(cls, p)} | {key.doc} |")
    if cls in COMPOSITE:
        rows.append(
            f"| `{PREFIX}schedulers` | str_list | **required** | {by[PREFIX + 'schedulers'].doc} |"
        )
        rows.append(
            f"| `{PREFIX}<i>.class.name`, `{PREFIX}<i>.*` | | | Child i's name "
            "(instead of listing it in schedulers) and its keys. |"
        )
    if not any(p.name == "warmup_steps" for _, p in schedule_keys(cls)):
        rows.append(
            f"| `{PREFIX}warmup.steps` | int | `0` | A linear warmup from 0 in front of the schedule. |"
        )
    return rows


def _example_block(name: str) -> list[str]:
    props, steps = EXAMPLES[name]
    sched, _ = example(name)
    first = ", ".join(f"{sched.lr_at(k):.6g}" for k in range(5))
    lines = ["```properties", f"{CLASS_KEY}={name}"]
    lines += [f"{k}={v}" for k, v in props.items()]
    lines.append("```")
    lines.append("")
    lines.append(f"First step sizes: {first}, ... ({steps} updates plotted below).")
    lines.append("")
    lines.append(f"![{name}](img/decay/{name}.png)")
    return lines


_INTRO = """\
# decay: step-size schedules

<!-- Generated by `python -m decay.render > docs/decay.md` from the registry in decay/. Do not edit. -->

A schedule is a pure function of the update count: `lr_at(k)` is the step size applied to
update `k` (k = 0, 1, 2, ...), or to epoch `k` when the learner decays once per epoch
(`ml.opt.decay.on.batch=false`, Angel's default). The only state of a `StepSizeScheduler` is that
count (plus, for `ReduceLROnPlateau`, its plateau counters and reductions), so a scheduler
restored from `state_dict()` (JSON-safe) continues with identical numbers.

```python
import decay

sched = decay.from_conf(conf, total_steps=epochs * updates_per_epoch)  # Config or plain mapping
lr = sched.peek()            # step size for the coming update
if optimizer_step(lr):       # False when AMP found inf/NaN and skipped the update
    sched.advance()          # a skipped update does not advance the schedule
lr = sched.next()            # Angel style: lr_at(count), then advance
sched.momentum_at(k)         # CyclicLR / OneCycleLR: momentum (or beta1) for update k, else None
sched.is_interval_boundary() # Angel's "validate every ml.opt.decay.intervals updates" signal
state = sched.state_dict()   # {"count": k}
```

* **Updates, not micro-batches.** With gradient accumulation the schedule advances once per
  optimizer update. `decay.updates_per_epoch(num_samples, batch_size, workers, accum_steps,
  drop_last=False)` gives the number of updates in an epoch; the learner passes
  `total_steps = epochs × updates per epoch` to `from_conf`, which fills `ml.opt.decay.total.steps`,
  `ml.opt.decay.t.max` (and so the decay length of the Warmup* schedules) when they are not set.
* **Names** are matched case-insensitively; an unknown name lists the valid ones, closest first.
* **Errors** name the key, the value and the valid range (`ValueError`); no schedule divides by
  zero or returns NaN or infinity (a growing schedule that overflows raises).
* **A job shorter than its schedule.** `sched.phases()` lists the steps a job is meant to reach
  (a warmup's end, WSD's cooldown, StepLR's first decay, MultiStepLR's first milestone); a
  training job that ends before one says so in one warning line (`WarmupCosine: the job ends
  after 10 updates, before the end of its warmup (update 50)`): it would train at a fraction
  of `ml.learn.rate` throughout, or never decay.
* **Torch optimizers.** `decay.torch.DecayLR(optimizer, sched)` is a
  `torch.optim.lr_scheduler.LRScheduler` driven by any schedule (it also writes the momentum of
  CyclicLR/OneCycleLR), so these schedules serve plain torch loops too.
* **Command line.** `angelps schedule --set ml.opt.decay.class.name=OneCycleLR --set
  ml.opt.decay.total.steps=100 --steps 100 --format csv` prints `update,lr` for updates 1..100;
  `--plot out.png` draws the curve.
"""

_ANGEL_FIXES = """\
## Angel's bugs, fixed

Angel's four reproduce Angel's counter semantics: `lr_at(k)` is the value of Angel's
`(k+1)`-th `next()` call. Where Angel's code is wrong, the fix is:

| Angel | Here |
|---|---|
| StandardDecay reads the deprecated `ml.learn.decay` (pre-filled with 0.5), so `ml.opt.decay.alpha` has no effect and α is always 0.5. | α is `ml.opt.decay.alpha` (default 0.001). `ml.learn.decay` is still accepted when set, with a `DecayDeprecationWarning`; `ml.opt.decay.alpha` wins when both are set. Set `ml.opt.decay.alpha=0.5` to reproduce Angel's effective default. |
| CorrectionDecay's first call uses t = 0 and returns `(1−β)/0 = +Infinity`. | t = k + 1: `lr_at(k) = lr/√(1+α(k+1)) · (1−β)/(1−β^(k+1))`, Angel's sequence without its leading ∞; β must lie in [0, 1). |
| WarmRestarts' documented formula divides by `1 + cos(πt/I)` (diverges at t = I). | Angel's code: `eta_min + ½(eta_max − eta_min)(1 + cos(π·c/T))`, eta_min = lr/10 unless `ml.opt.decay.eta.min` is set, first period `ml.opt.decay.intervals`, each restart doubles the period and divides eta_max by `√(1 + restarts·α)`. |
| An unknown `ml.opt.decay.class.name` throws `scala.MatchError` without a message. | `ValueError` naming the key, the value and the valid names, closest first. |
"""

_TORCH_DIFFS = """\
## Differences from torch

The torch-named schedules equal `torch.optim.lr_scheduler` (one parameter group, nothing else
touching the lr) within 1e-9 relative for k up to 100,000 (tests/decay/test_torch_oracle.py),
except where torch fails:

* **OneCycleLR** holds its final value for k ≥ total.steps − 1; torch raises `ValueError` when
  stepped past total_steps, and its last allowed step extrapolates past the end (negative for
  linear annealing). A `pct.start` with `pct.start·total.steps = 1` (a zero-length first phase,
  ZeroDivisionError in torch) is rejected.
* **ConstantLR** rejects `factor=0` (torch accepts it, then raises ZeroDivisionError at
  total_iters); ConstantLR/LinearLR/PolynomialLR need `total.iters >= 1`.
* **Milestones** must be strictly increasing (torch's MultiStepLR silently stacks duplicates);
  SequentialLR milestones must be >= 1 (torch's milestone 0 leaks the first schedule's factor,
  pytorch#185872).
* **SequentialLR** restarts each child at its own count 0, as torch does for children whose
  recursive and closed forms agree; **ChainedScheduler** multiplies every child's factor
  `child.lr_at(k)/child.lr` (torch's absolute schedules overwrite the lr instead).
* **ReduceLROnPlateau** keeps `best = None` instead of ±inf (JSON-safe), rejects a NaN or infinite
  metric, and records each reduction at the update count where its metric was reported, so
  `lr_at(k)` replays the history. It can follow a warmup (`ml.opt.decay.warmup.steps`), which
  torch cannot express, but cannot be a child of a sequence or chain.
* **CyclicLR**: `scale.mode` is fixed by the mode (torch ignores it without a custom `scale_fn`);
  a contradicting value is an error instead of being ignored.
"""

_COMPOSITION = """\
## Composition in properties

`SequentialLR` and `ChainedScheduler` take their children from `ml.opt.decay.schedulers`
(comma-separated names) or `ml.opt.decay.<i>.class.name`; child `i` reads its keys under
`ml.opt.decay.<i>.` (any key of the table below, e.g. `ml.opt.decay.0.total.iters=5`). A key for
a child index without a class is an error. A child's `total.steps`/`t.max` default to the span
of the child (milestone to milestone, the last one to the end). Nesting composites needs the
Python API. `ml.opt.decay.warmup.steps` on any schedule without a warmup of its own (composites
included) puts a linear warmup from 0 in front of it, and the inner schedule starts after the
warmup: `lr_at(k) = inner.lr_at(0)·k/W` for k < W, then `inner.lr_at(k − W)`.

`LambdaLR(lr, fn)` and `MultiplicativeLR(lr, fn)` (torch semantics) take a Python function and are
available from the Python API only.
"""


def render() -> str:
    """docs/decay.md."""
    out = [_INTRO, "## Catalogue", ""]
    out += ["| schedule | what it does |", "|---|---|"]
    for _, group in CATALOGUE:
        for cls in group:
            out.append(f"| [{cls.__name__}](#{cls.__name__.lower()}) | {_first_sentence(cls)} |")
    out.append("")
    for title, group in CATALOGUE:
        out += [f"## {title}", ""]
        for cls in group:
            out += [f"### {cls.__name__}", "", _doc(cls), ""]
            out += _key_table(cls)
            out.append("")
            out += _example_block(cls.__name__)
            out.append("")
    out += [_ANGEL_FIXES, _TORCH_DIFFS, _COMPOSITION, TRAINING]
    out += ["## Every key", ""]
    out += ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in KEYS:
        default = "unset" if k.default is None else f"`{_fmt(k.default)}`"
        choices = f" One of: {', '.join(k.choices)}." if k.choices else ""
        out.append(f"| `{k.name}` | {k.type} | {default} | {k.doc}{choices} |")
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
