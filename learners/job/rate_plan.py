"""The step size and momentum of every update: the job's schedule, the tables' own schedules,
the unit they count in and the batch scaling (:class:`RatePlan`).

* Momentum: a schedule that defines ``momentum_at`` (CyclicLR, OneCycleLR with
  ``cycle_momentum``) sets the momentum of Momentum and β1 of Adam for each update, as torch's
  schedulers write ``momentum``/``betas[0]`` into the optimizer before each step.
* Tables: ``ml.opt.decay.<table>.*`` / ``ml.learn.rate.<table>`` give a table (``dense``: the
  worker-side layers) a schedule of its own (:mod:`learners.job.table_schedules`).
* Unit (``ml.opt.decay.unit``): ``updates`` evaluates each schedule at its count (advanced per
  update or per epoch, ``ml.opt.decay.on.batch``); ``samples`` at the training rows seen before
  the update, ``epoch × rows + min(update × global batch, rows)``; ``epochs`` at that divided by
  the rows of an epoch (a real number). These do not depend on the worker count or batch size,
  so a job resumed with others continues the same curve per sample.
* Scaling (``ml.learn.rate.scaling``): every step size times ``G/ref`` (linear) or
  ``√(G/ref)`` (sqrt), ``G`` the global batch, ``ref`` ``ml.learn.rate.reference.batch``.

Where the schedules stand is a pure function of the applied updates and the epoch (plus a
metric-driven schedule's reductions). The driver sends each worker the plan once (when the job
starts or restarts, and again after a validation only when a schedule is metric-driven:
ReduceLROnPlateau); each worker asks it for each update's rates (:meth:`RatePlan.rates`),
advances it once per applied update and counts the epochs itself (:meth:`RatePlan.start_epoch`).
The driver keeps its own copy in step from the count of applied updates each ``run_steps``
reports (:meth:`RatePlan.advance`): no schedule state comes back from the workers.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

from angelconf.config import ConfigError
from angelps import OptimizerSpec
from angelps.rates import Step, StepRates
from angelps.table import TableSpec
from decay import StepSizeScheduler, from_conf
from decay.base import unreached
from decay.keys import PREFIX
from learners.job.job_size import JobSize
from learners.job.loop_options import TrainPlan
from learners.job.lr_scaling import batch_scale
from learners.job.table_schedules import DENSE, job_schedule, table_schedules
from learners.models.config import ModelConfig
from learners.models.table_decl import table_specs
from learners.models.tables import model_tables

__all__ = [
    "UNITS",
    "RatePlan",
    "UpdateRates",
    "batch_scale",
    "build_rate_plan",
    "schedule_total",
]

UNITS = ("updates", "samples", "epochs")
_NONE: dict[str, tuple[float, float | None]] = {}  # (never written to)
#: Keys of state_dict() that are the plan's own (the rest is the job schedule's).
_OWN = ("tables", "in_epoch", "epoch")


class UpdateRates(NamedTuple):
    """What one update uses: ``push`` goes with the PS push (a float when nothing but the
    step size is set), ``dense_lr``/``dense_momentum`` step the worker-side layers, ``lr`` and
    ``momentum`` are the job schedule's, ``tables`` each table's own ``(lr, momentum)``, ``at``
    the position read (a schedule counted in samples or epochs). A tuple: built every update."""

    push: Step
    lr: float
    dense_lr: float
    dense_momentum: float | None
    momentum: float | None = None
    tables: Mapping[str, tuple[float, float | None]] | None = None
    at: float | None = None

    @classmethod
    def fixed(cls, lr: float) -> UpdateRates:
        """A plain step size ``lr`` for everything."""
        return cls(lr, lr, lr, None)

    def record(self) -> dict[str, float]:
        """The step record's fields beside ``lr``: momentum, lr/<table>, momentum/<table>,
        schedule_at (built once per record, not per update)."""
        out: dict[str, float] = {}
        if self.momentum is not None:
            out["momentum"] = self.momentum
        for name, (lr, m) in (self.tables or {}).items():
            out[f"lr/{name}"] = lr
            if m is not None:
                out[f"momentum/{name}"] = m
        if self.at is not None:
            out["schedule_at"] = self.at
        return out


def schedule_total(unit: str, on_batch: bool, epochs: int, updates: int, rows: int) -> int:
    """The length the schedules are told (fills ``total.steps``/``t.max`` when unset)."""
    if unit == "samples":
        return max(1, epochs * rows)
    if unit == "epochs":
        return epochs
    return updates * epochs if on_batch else epochs


class RatePlan:
    """The schedules of a job and where they stand; see the module docstring."""

    def __init__(
        self,
        main: StepSizeScheduler,
        tables: Mapping[str, StepSizeScheduler] | None = None,
        unit: str = "updates",
        on_batch: bool = False,
        global_batch: int = 1,
        epoch_rows: int = 1,
        scale: float = 1.0,
        ps_dense: tuple[str, ...] = (),
    ) -> None:
        """``tables``: the tables' own schedules by name (``dense``: the dense layers, and the
        PS tables ``ps_dense`` that hold them under angel.dense.placement=ps)."""
        if unit not in UNITS:
            raise ValueError(f"ml.opt.decay.unit={unit} is not valid: expected one of {UNITS}")
        self.main = main
        self.tables = dict(tables or {})
        self.unit = unit
        self.on_batch = on_batch
        self.global_batch = global_batch
        self.epoch_rows = max(1, epoch_rows)
        self.scale = scale
        self.ps_dense = ps_dense if DENSE in self.tables else ()
        self.epoch = 0
        self.in_epoch = 0  # updates applied in this epoch
        self.ended = False  # whether epoch ``epoch`` was counted by the per-epoch schedules
        self._plain = not self.tables and main.momentum_at(0) is None and unit == "updates"
        self._own = list(self.tables.items())  # (name, schedule): read every update

    # --- where the schedules stand ---------------------------------------------------------------

    def start_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` begins (its first update has seen ``epoch × rows`` samples). A later
        epoch than the plan's own, which was not ended (a worker's copy: the driver ends epochs
        after validating), ends that one first: the per-epoch schedules count it."""
        if epoch > self.epoch and not self.ended:
            self.end_epoch()
        self.epoch = epoch
        self.in_epoch = 0
        self.ended = False

    def end_epoch(self) -> None:
        """Epoch ``epoch`` is over: per-epoch decay (unit updates, ``ml.opt.decay.on.batch=false``)
        counts it, once (a schedule counted in samples or epochs reads its position from the
        samples seen)."""
        if not self.ended and self.unit == "updates" and not self.on_batch:
            for s in self.schedules():
                s.advance()
        self.ended = True

    def position(self) -> float:
        """Where the next update reads the schedules: samples seen, or the fractional epoch
        (unit updates: the job schedule's count)."""
        if self.unit == "updates":
            return float(self.main.count)
        seen = self.epoch * self.epoch_rows + min(
            self.in_epoch * self.global_batch, self.epoch_rows
        )
        return seen if self.unit == "samples" else seen / self.epoch_rows

    def advance(self, n: int = 1) -> None:
        """``n`` updates were applied: the per-update schedules count them (a worker after each
        applied update; the driver with the count a ``run_steps`` chunk reports)."""
        self.in_epoch += n
        if self.unit == "updates" and self.on_batch:
            self.main.advance(n)
            for s in self.tables.values():
                s.advance(n)

    def schedules(self) -> list[StepSizeScheduler]:
        """The job schedule, then the tables' own."""
        return [self.main, *self.tables.values()]

    # --- the rates of the next update ------------------------------------------------------------

    def _read(self, s: StepSizeScheduler, x: float | None) -> tuple[float, float | None]:
        """``s``'s (scaled step size, momentum) at ``x`` (None: at its own count)."""
        lr, m = s.value_at(s.count if x is None else x)
        return lr * self.scale, m

    def peek(self) -> float:
        """The job schedule's step size for the next update."""
        return self._read(self.main, None if self.unit == "updates" else self.position())[0]

    def rates(self) -> UpdateRates:
        """Step sizes and momenta of the next update (called once per update: kept lean)."""
        if self._plain:  # the common case: one float, as before
            lr = self.main.peek() * self.scale
            return UpdateRates(lr, lr, lr, None)
        x: float | None = None
        if self.unit != "updates":  # (position(), inlined)
            rows, seen = self.epoch_rows, self.in_epoch * self.global_batch
            x = self.epoch * rows + (seen if seen < rows else rows)
            if self.unit == "epochs":
                x /= rows
        scale = self.scale
        lr, m = self.main.value_at(self.main.count if x is None else x)
        lr *= scale
        if not self._own:
            return UpdateRates(StepRates.unchecked(lr, m, _NONE), lr, lr, m, m, None, x)
        own: dict[str, tuple[float, float | None]] = {}
        for name, s in self._own:  # (inlined _read: this runs every update)
            t_lr, t_m = s.value_at(s.count if x is None else x)
            own[name] = (t_lr * scale, t_m)
        pushed = own  # (an entry for dense, no PS table's name, is never read)
        if self.ps_dense:  # the PS's dense.* tables take dense's rates
            pushed = dict(own)
            for t in self.ps_dense:
                pushed[t] = own[DENSE]
        dense_lr, dense_m = own.get(DENSE, (lr, m))
        return UpdateRates(StepRates.unchecked(lr, m, pushed), lr, dense_lr, dense_m, m, own, x)

    def describe(self) -> list[str]:
        """The start screen's lines: each schedule, what it counts and its first values."""
        if self.unit == "updates":
            per = "per update" if self.on_batch else "per epoch"
            points: list[float] = [0, 1, 2, 3]
        else:
            per = f"in {self.unit} (ml.opt.decay.unit)"
            seen = [float(min(i * self.global_batch, self.epoch_rows)) for i in range(4)]
            points = seen if self.unit == "samples" else [x / self.epoch_rows for x in seen]
        if self.scale != 1.0:
            per += f", x{self.scale:.4g} (ml.learn.rate.scaling)"
        lines = []
        for name, s in [("", self.main), *((f"{n}: ", t) for n, t in self.tables.items())]:
            vals = [s.value_at(x) for x in points]
            text = ", ".join(f"{lr * self.scale:.4g}" for lr, _ in vals)
            if vals[0][1] is not None:
                text += "; momentum " + ", ".join(f"{m:.4g}" for _, m in vals)
            lines.append(f"{name}{s.describe()} {per}: {text}, ...")
        return lines

    # --- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The job schedule's state (what checkpoints always held), the tables' and the position
        in the epoch."""
        return {
            **self.main.state_dict(),
            "tables": {n: s.state_dict() for n, s in self.tables.items()},
            "in_epoch": self.in_epoch,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint: written after its epoch ended); a
        checkpoint without a table's state (the table had no schedule of its own then) starts
        that table at the job schedule's count."""
        self.main.load_state_dict({k: v for k, v in state.items() if k not in _OWN})
        saved = state.get("tables") or {}
        for name, s in self.tables.items():
            s.load_state_dict(saved.get(name, {"count": self.main.count}))
        self.in_epoch = int(state.get("in_epoch", 0))
        self.epoch = int(state.get("epoch", self.epoch))
        self.ended = True


#: The optimizers whose momentum (β1) a schedule can drive.
_CYCLABLE = ("momentum", "adam")


def check_momentum_cycle(
    sched: StepSizeScheduler, users: Mapping[str, str], prefix: str = PREFIX
) -> None:
    """ConfigError when ``sched`` cycles the momentum but one of its ``users`` (what -> its
    optimizer's name) has none, as torch raises for an optimizer without momentum or betas; or
    when the cycle leaves [0, 1)."""
    if sched.momentum_at(0) is None:
        return
    key = f"{prefix}cycle.momentum"
    for what, opt in users.items():
        if opt not in _CYCLABLE:
            raise ConfigError(
                f"{key}=true: {type(sched).__name__} cycles the momentum, but the optimizer of "
                f"{what} is {opt}, which has none (valid with a momentum cycle: Momentum, "
                f"Adam); set {key}=false or use Momentum or Adam"
            )
    for name in ("base_momentum", "max_momentum"):
        m = getattr(sched, name, None)
        if m is not None and not 0 <= m < 1:
            raise ConfigError(
                f"{prefix}{name.replace('_', '.')}={m!r} is not valid with {key}=true: "
                "expected a number in [0, 1) (the optimizer's momentum or Adam's beta1)"
            )


def build_rate_plan(
    conf: Mapping[str, Any],
    plan: TrainPlan,
    size: JobSize,
    tables: list[TableSpec],
    dense_params: int,
) -> RatePlan:
    """The job's rate plan from its configuration, once the tables and the job's size are
    known. ConfigError for a per-table key of an unknown table, or a momentum cycle on an
    optimizer without momentum."""
    unit = str(conf["ml.opt.decay.unit"])
    rows = sum(size.train_rows) or size.batch_size * plan.workers * size.updates_per_epoch
    total = schedule_total(unit, plan.decay_on_batch, plan.epochs, size.updates_per_epoch, rows)
    main = job_schedule(conf, total)
    worker_dense = bool(dense_params) and plan.dense_placement == "worker"
    names = [t.name for t in tables]
    own = table_schedules(conf, names, total, worker_dense)
    _say_unreached(main, own, total, unit if unit != "updates" or plan.decay_on_batch else "epochs")
    # (schedule of, what, optimizer) of everything that takes a step
    users = [
        (DENSE if t.name.startswith(DENSE + ".") else t.name, f"table {t.name}", t.optimizer.name)
        for t in tables
    ]
    if worker_dense:
        opt = OptimizerSpec.from_conf(conf, "ml.fclayer.optimizer").name
        users.append((DENSE, "the dense layers (ml.fclayer.optimizer)", opt))
    for name, s in own.items():
        check_momentum_cycle(s, {w: o for t, w, o in users if t == name}, f"{PREFIX}{name}.")
    check_momentum_cycle(main, {w: o for t, w, o in users if t not in own})
    global_batch = size.batch_size * plan.workers * plan.accum
    scale = batch_scale(
        str(conf["ml.learn.rate.scaling"]), global_batch, int(conf["ml.learn.rate.reference.batch"])
    )
    ps_dense = tuple(n for n in names if n.startswith(DENSE + "."))
    return RatePlan(main, own, unit, plan.decay_on_batch, global_batch, rows, scale, ps_dense)


def _say_unreached(
    main: StepSizeScheduler, own: Mapping[str, StepSizeScheduler], total: int, unit: str
) -> None:
    """A warning for each phase of the job's schedules that the job ends before (a warmup of
    50 updates in a job of 11 trains at a fraction of ml.learn.rate throughout)."""
    one = unit.removesuffix("s")
    for name, sched in [("", main), *((f" (table {t})", s) for t, s in own.items())]:
        for k, what in unreached(sched, total):
            warnings.warn(
                f"{type(sched).__name__}{name}: the job ends after {total} {unit}, before "
                f"{what} ({one} {k}); `angelps schedule --conf JOB` shows the step sizes",
                stacklevel=3,
            )


def _sourced(message: str, conf: Mapping[str, Any]) -> str:
    """``message`` (``KEY=VALUE: why``) with where KEY was set, as other key errors say it."""
    key, eq, rest = message.partition("=")
    source = getattr(conf, "source", None)
    is_set = getattr(conf, "is_set", None)
    value, colon, why = rest.partition(": ")
    if not (eq and colon and callable(source) and callable(is_set)) or "(set in" in message:
        return message
    try:
        if not is_set(key):
            return message
        return f"{key}={value} ({source(key)}): {why}"
    except KeyError:  # (not a key: the message names something else)
        return message


def check_rates_early(conf: Mapping[str, Any]) -> None:
    """Before any actor starts: per-table keys naming a table the model does not have, and a
    momentum cycle on a table whose optimizer has none (the PS tables follow from the
    configuration alone; ``dense`` and the dense layers' optimizer are checked once the model
    is built, by :func:`build_rate_plan`)."""

    fields = int(conf["ml.fm.field.num"])
    try:
        n = max(1, int(conf["ml.feature.index.range"]))
        decls = model_tables(ModelConfig.from_config(conf, n, fields or 1))
        specs = table_specs(conf, decls)
    except (ConfigError, ValueError):
        return  # the workers' build reports it
    far = 10**9  # any length: only the names and the momentum cycle are checked here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the job's own build warns, once
        try:
            own = table_schedules(conf, [t.name for t in specs], far, dense_layers=None)
            main = from_conf(conf, total_steps=far)
        except ConfigError:
            raise
        except ValueError as e:  # a schedule's bad name or value: bad input (exit 2), sourced
            raise ConfigError(_sourced(str(e), conf)) from None
    users = [
        (t.name, f"table {t.name} (ml.{d.role}.optimizer)", t.optimizer.name)
        for t, d in zip(specs, decls, strict=True)
    ]
    for name, s in own.items():
        check_momentum_cycle(s, {w: o for t, w, o in users if t == name}, f"{PREFIX}{name}.")
    check_momentum_cycle(main, {w: o for t, w, o in users if t not in own})
