"""docs/decay.md's sections on how training applies the schedules: the momentum cycle, schedules
counted in samples or epochs, a schedule per table (the learner's rate plan,
learners/job/rate_plan.py). Text only; :mod:`decay.render` places it."""

from __future__ import annotations

__all__ = ["TRAINING"]

TRAINING = """\
## Momentum cycles, applied

A schedule that drives the momentum (CyclicLR, OneCycleLR with `ml.opt.decay.cycle.momentum=true`,
the default, or any Python schedule that defines `momentum_at`) sets, for every update, the
momentum of the `Momentum` optimizer and β1 of `Adam`: on the shards' tables and on the
workers' dense layers alike, exactly as torch's `OneCycleLR`/`CyclicLR` write `momentum` or
`betas[0]` into the optimizer before each step. The momentum travels with the step size in
each push (`angelps.rates.StepRates`). Both optimizers follow torch's formulas, so the weights
agree with `torch.optim.SGD(momentum=m)` (buffer `v ← m·v + g`, dampening 0, the first step
`v = g`) and `torch.optim.Adam` (bias correction `1 − β1^t` with the step's β1) driven by torch's
schedulers on the same gradients, to 1e-6 (tests/decay/test_momentum_applied.py). Step
records in metrics.jsonl (and TensorBoard, `train/momentum`) carry `momentum`.

An optimizer without momentum (SGD, AdaGrad, RMSProp, FTRL) under a momentum cycle is a
configuration error naming the key, as torch raises one:

```
ml.opt.decay.cycle.momentum=true: OneCycleLR cycles the momentum, but the optimizer of table
weight (ml.inputlayer.optimizer) is sgd, which has none (valid with a momentum cycle: Momentum,
Adam); set ml.opt.decay.cycle.momentum=false or use Momentum or Adam
```

The job is checked before any actor starts (the dense layers' optimizer once the model is
built); a table on a schedule of its own is checked against that schedule
(`ml.opt.decay.<table>.cycle.momentum`).

The momentum is a function of the update count, like the step size, so checkpoints and resume
stay exact.

```
angelps schedule --set ml.opt.decay.class.name=OneCycleLR --set ml.learn.rate=0.1 \\
    --set ml.opt.decay.pct.start=0.25 --steps 400 --plot docs/img/schedules/momentum-onecycle.png
```

![OneCycleLR, lr and momentum](img/schedules/momentum-onecycle.png)

## Schedules counted in samples or epochs

`ml.opt.decay.unit` says what a schedule counts:

| unit | the step size of an update is the schedule at |
|---|---|
| `updates` (default) | its count of updates (or of epochs with `ml.opt.decay.on.batch=false`) |
| `samples` | the training rows seen before the update: `epoch × rows + min(update × global batch, rows)` |
| `epochs` | that divided by the rows of an epoch (a real number: StepLR changes at whole epochs, cosine moves every update) |

Step sizes, warmups and periods (`step.size`, `warmup.steps`, `t.max`, `milestones`, ...) are
then read in that unit, and the length the learner fills in (`total.steps`, `t.max`) is
`ml.epoch.num ×` the rows of an epoch, or `ml.epoch.num`. The position does not depend on the
worker count or the batch, so a job resumed with more workers or a bigger batch continues the
same curve per sample seen (tests/learners/test_rate_plan.py: 2 epochs on 1 worker, resumed on 2
workers with twice the global batch). Step records carry `schedule_at`, the position read.

`ml.learn.rate.scaling` scales every step size with the global batch `G` (batch × workers ×
accumulation) against `ml.learn.rate.reference.batch` (`R`, default 256): `none`, `linear`
(`× G/R`, the linear scaling rule of Goyal et al. 2017, with a warmup) or `sqrt` (`× √(G/R)`).

`angelps schedule --conf job.properties` shows a job counted in samples as one value per update
with the samples seen in the first column (`samples,lr`; `epochs,lr` for epochs) and says where
the rows come from:

```
angelps schedule --conf conf/lr_a9a.properties --set ml.opt.decay.unit=samples \\
    --set ml.opt.decay.class.name=WarmupCosine --set ml.opt.decay.warmup.steps=20000 \\
    --set ml.epoch.num=4 --set ml.learn.rate=0.05 --set ml.opt.decay.alpha=0.001 \\
    --plot docs/img/schedules/unit-samples.png
```

![WarmupCosine in samples](img/schedules/unit-samples.png)

## A schedule per table

Any of `ml.opt.decay.<table>.class.name`, `ml.opt.decay.<table>.<param>` (every schedule key,
e.g. `ml.opt.decay.embedding.gamma`) and `ml.learn.rate.<table>` gives a table a schedule of its
own; every other table follows the job's. `<table>` is a table's name as the start screen lists
it (`weight`, `bias`, `embedding`, `wide`, ...); `dense` stands for the worker-side dense layers
(and, with `angel.dense.placement=ps`, every `dense.*` table). Unset values fall back to the
global keys: a table that sets only `ml.learn.rate.embedding` runs the job's schedule from its
own rate; a table that names its own class takes only its own parameters (the global ones
belong to another schedule). A table's own schedule cannot be a SequentialLR or
ChainedScheduler. A key naming a table the model does not have is an error:

```
ml.opt.decay.embeding.gamma: this model has no table 'embeding'; valid table names: wide,
wide_bias, embedding, dense
```

```properties
# a warmup and cosine for the dense layers and biases, a constant rate for the embedding
ml.learn.rate=0.01
ml.opt.decay.class.name=WarmupCosine
ml.opt.decay.warmup.steps=100
ml.learn.rate.embedding=0.05
ml.opt.decay.embedding.class.name=ConstantLearningRate
```

The start screen prints each table's schedule; step records in metrics.jsonl carry `lr/<table>`
beside `lr` (and `momentum/<table>` where the table's schedule drives it), TensorBoard
`train/lr/<table>`; checkpoints keep every schedule's state. From Python, the same keys go in
the dict of `GraphLearner(conf)` or `GraphLearner.from_properties(path, overrides)`. A table on
its own schedule trains exactly as a job whose schedule that is (tests/learners/
test_table_schedules.py). `angelps schedule` prints a column `lr/<table>` per table with its own
schedule (JSON: `tables`) and draws them together:

```
angelps schedule --set ml.opt.decay.class.name=WarmupCosine --set ml.learn.rate=0.01 \\
    --set ml.opt.decay.warmup.steps=100 --set ml.learn.rate.embedding=0.05 \\
    --set ml.opt.decay.embedding.class.name=ConstantLearningRate --set ml.learn.rate.wide=0.02 \\
    --set ml.opt.decay.wide.class.name=StepLR --set ml.opt.decay.wide.step.size=300 \\
    --set ml.opt.decay.wide.gamma=0.5 --steps 1000 --plot docs/img/schedules/per-table.png
```

![Per-table schedules](img/schedules/per-table.png)
"""
