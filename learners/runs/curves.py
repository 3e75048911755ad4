"""Training curves from runs' ``metrics.jsonl``: one panel per kind of metric, one epoch axis.

A run's file (:mod:`learners.runs.run_log`) holds a ``start`` line (job, model, settings), ``step``
lines (every ``angel.log.every.steps`` updates), ``epoch`` lines (validation) and a ``summary``.
Files written before runs had their own directories may hold several runs appended: a run ends
at its ``summary`` line, or where the step count goes backwards. Lines of other kinds are
skipped; a line that is not a JSON object, or a step/epoch line without its step/epoch number,
is an error naming the file and line. The file is read whole, from the disk or from object
storage (a URL), through :func:`angelps.file_store.files_for` (pyarrow only for a URL).

The figure (:func:`panels` decides what goes where; :func:`learners.runs.plot.plot_runs` draws it): every panel
shares one x axis, the epoch, counted from 1 as the console counts: training is drawn at its
global update (update ``u`` at ``u / updates per epoch``), and the validation after epoch ``k``
at ``x = k``, so training and validation line up and the integer grid lines are the epoch
boundaries. Each kind of metric gets its own panel and y axis: losses together (training, the
validation loss, logloss), AUC alone, accuracy alone, regression errors (RMSE, MAE) apart from
R², then the learning rate and the throughput. With several runs each run has one colour and is
named in the legend.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angelps.file_store import files_for

__all__ = [
    "FAMILIES",
    "Panel",
    "Run",
    "Series",
    "panels",
    "read_metrics",
    "run_labels",
    "title_of",
]

#: (panel, title, the validation metrics it draws); every other metric asked for gets its own
FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("loss", "loss", ("valid_loss", "valid_logloss")),
    ("auc", "AUC (validation)", ("valid_auc",)),
    ("accuracy", "accuracy (validation)", ("valid_accuracy",)),
    ("error", "error (validation)", ("valid_rmse", "valid_mae")),
    ("r2", "R² (validation)", ("valid_r2",)),
)
HEADLINE_METRICS = tuple(m for _, _, ms in FAMILIES for m in ms)
_LABELS = {
    "valid_loss": "validation loss",
    "valid_logloss": "validation logloss",
    "valid_auc": "validation AUC",
    "valid_accuracy": "validation accuracy",
    "valid_rmse": "RMSE",
    "valid_mae": "MAE",
    "valid_r2": "R²",
}


@dataclass
class Run:
    """The lines of one training run, in file order, and its name (the legend)."""

    name: str = ""
    start: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)

    def series(self, kind: str, x: str, y: str) -> tuple[list[float], list[float]]:
        """(xs, ys) of the ``kind`` lines that have ``y``; null values become NaN (a gap)."""
        rows = self.steps if kind == "step" else self.epochs
        xs, ys = [], []
        for r in rows:
            if y in r:
                xs.append(float(r[x]))
                ys.append(_num(r[y]))
        return xs, ys

    def updates_per_epoch(self) -> float | None:
        """Optimizer updates per epoch: from the start line, else from where epochs end."""
        upe = self.start.get("updates_per_epoch")
        if isinstance(upe, (int, float)) and upe > 0:
            return float(upe)
        for e in self.epochs:
            if isinstance(e.get("step"), (int, float)) and e["step"] > 0:
                return float(e["step"]) / (int(e["epoch"]) + 1)
        ends: dict[int, float] = {}
        for s in self.steps:
            if "epoch" in s:
                ends[int(s["epoch"])] = max(ends.get(int(s["epoch"]), 0.0), float(s["step"]))
        return ends[min(ends)] / (min(ends) + 1) if ends else None

    def epoch_x(self, key: str) -> tuple[list[float], list[float]]:
        """An epoch line's ``key`` at the end of its epoch: x = epoch + 1."""
        xs, ys = self.series("epoch", "epoch", key)
        return [x + 1 for x in xs], ys

    def step_x(self, key: str) -> tuple[list[float], list[float]]:
        """A step line's ``key`` at its global update, in epochs (or in updates when the
        updates per epoch are unknown)."""
        xs, ys = self.series("step", "step", key)
        upe = self.updates_per_epoch()
        return ([x / upe for x in xs] if upe else xs), ys

    def valid_keys(self) -> list[str]:
        """The numeric ``valid_*`` metrics present in the epoch lines, in first-seen order."""
        keys: dict[str, None] = {}
        for r in self.epochs:
            for k, v in r.items():
                if k.startswith("valid_") and (v is None or isinstance(v, (int, float))):
                    keys[k] = None
        return list(keys)

    def headline_keys(self) -> list[str]:
        """The validation metrics drawn by default: the usual quality measures that are present
        (not counts, not recalls), or every numeric ``valid_*`` when none of them is."""
        present = self.valid_keys()
        chosen = [k for k in HEADLINE_METRICS if k in present]
        return chosen or [k for k in present if not k.endswith(("_count", "_rows"))]


@dataclass
class Series:
    """One curve: the run it belongs to, what it is (``style``: interval, epoch, valid, lr,
    speed), its label and its points."""

    run: str
    style: str
    label: str
    xs: list[float]
    ys: list[float]


@dataclass
class Panel:
    """One axes of the figure: its key (the family), title, y label and curves."""

    key: str
    title: str
    ylabel: str
    series: list[Series] = field(default_factory=list)


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def _require_number(obj: dict[str, Any], key: str, where: str) -> None:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: a {obj['kind']} line needs a number in '{key}', found {v!r}")


def _check_values(obj: dict[str, Any], where: str) -> None:
    for k, v in obj.items():
        if k != "kind" and v is not None and isinstance(v, str):
            if k in ("lr", "loss", "train_loss") or k.startswith("valid_"):
                raise ValueError(f"{where}: '{k}' should be a number or null, found {v!r}")


def _parse(file: str, lineno: int, line: str) -> dict[str, Any] | None:
    text = line.strip()
    if not text:
        return None
    where = f"{file}:{lineno}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not a JSON object ({e.msg}): {text[:60]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, found {text[:60]!r}")
    if obj.get("kind") in ("step", "epoch"):
        _require_number(obj, str(obj["kind"]), where)
        if obj["kind"] == "step":
            _require_number(obj, "loss", where)
        _check_values(obj, where)
    return obj


def _lines(path: str) -> list[str]:
    """The lines of a metrics file (a local path, or a URL), read whole."""
    try:
        data = files_for(path).read_bytes(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such metrics file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read it: {' '.join(str(e).split())}") from None
    return data.decode("utf-8").splitlines()


def read_metrics(path: str | Path, name: str = "") -> list[Run]:
    """Parse a ``metrics.jsonl`` (a local path or a URL) into its runs (one, or several
    appended by older versions); ``name`` names them. Raises ValueError naming the file and
    line."""
    file = files_for(str(path)).canonical(str(path))
    runs: list[Run] = [Run()]
    last_step = -math.inf
    for lineno, line in enumerate(_lines(file), start=1):
        obj = _parse(file, lineno, line)
        kind = None if obj is None else obj.get("kind")
        run = runs[-1]
        if obj is None or kind not in ("start", "step", "epoch", "summary"):
            continue
        if kind in ("step", "epoch") and "epoch" in obj and run.start.get("epoch_base") == 1:
            # counted from 1 in the file (as people read it); from 0 here, as older files
            obj = {**obj, "epoch": int(obj["epoch"]) - 1}
        if kind == "start":
            if run.steps or run.epochs:
                run = Run()
                runs.append(run)
            run.start = obj
        elif kind == "step":
            if obj["step"] <= last_step and (run.steps or run.epochs):
                run = Run()
                runs.append(run)
            last_step = obj["step"]
            run.steps.append(obj)
        elif kind == "epoch":
            run.epochs.append(obj)
        elif run.steps or run.epochs:  # a summary ends its run
            runs.append(Run())
            last_step = -math.inf
    runs = [r for r in runs if r.steps or r.epochs]
    if not runs:
        raise ValueError(f"{file}: no step or epoch lines (is this a metrics.jsonl?)")
    base = name or str(runs[0].start.get("run") or Path(file).stem)
    for i, r in enumerate(runs):
        r.name = base if len(runs) == 1 else f"{base} #{i + 1}"
    return runs


def _loss_series(run: Run, keys: Sequence[str]) -> list[Series]:
    out = []
    xs, ys = run.step_x("loss")
    if xs:
        every = run.steps[0].get("updates")
        what = f"every {every} updates" if isinstance(every, int) else "per log interval"
        out.append(Series(run.name, "interval", f"training ({what})", xs, ys))
    xs, ys = run.epoch_x("train_loss")
    if xs:
        out.append(Series(run.name, "epoch", "training (epoch mean)", xs, ys))
    valid = {k: run.epoch_x(k) for k in ("valid_loss", "valid_logloss") if k in keys}
    if "valid_loss" in valid and "valid_logloss" in valid:
        a, b = valid["valid_loss"][1], valid["valid_logloss"][1]
        if all(
            abs(x - y) <= 1e-6 * max(1.0, abs(y))
            for x, y in zip(a, b, strict=False)
            if x == x and y == y
        ):
            del valid["valid_loss"]  # the same numbers twice: the logloss is the loss
    for k, (xs, ys) in valid.items():
        out.append(Series(run.name, "valid", _LABELS[k], xs, ys))
    return out


def _lr_steps(run: Run) -> tuple[list[float], list[float]]:
    """The step size as a step line: a step line's lr holds over the updates it covers, so the
    first one starts where its interval starts (epoch lines: over the epoch they end)."""
    xs, ys = run.step_x("lr")
    if not xs:
        xs, ys = run.epoch_x("lr")
        return ([xs[0] - 1, *xs], [ys[0], *ys]) if xs else (xs, ys)
    first, upe = run.steps[0], run.updates_per_epoch()
    if isinstance(first.get("updates"), int) and upe:
        return [(first["step"] - first["updates"]) / upe, *xs], [ys[0], *ys]
    return xs, ys


def panels(runs: Sequence[Run], metrics: Sequence[str] | None = None) -> list[Panel]:
    """What the figure draws, panel by panel: the losses, one panel per family of validation
    metrics (``metrics``, or each run's headline ones), the learning rate, the throughput.
    Panels without a curve are left out."""
    keys = {r.name: list(metrics) if metrics else r.headline_keys() for r in runs}
    out = [Panel("loss", "loss", "loss")]
    for r in runs:
        out[0].series += _loss_series(r, keys[r.name])
    family_of = {m: fam for fam, _, ms in FAMILIES for m in ms}
    for fam, title, members in FAMILIES[1:]:
        panel = Panel(fam, title, title.split(" (")[0])
        for r in runs:
            for m in members:
                if m in keys[r.name]:
                    xs, ys = r.epoch_x(m)
                    panel.series.append(Series(r.name, "valid", _LABELS.get(m, m), xs, ys))
        out.append(panel)
    extra = [m for m in dict.fromkeys(k for r in runs for k in keys[r.name]) if m not in family_of]
    for m in extra:
        label = m.removeprefix("valid_")
        panel = Panel(m, f"{label} (validation)", label)
        for r in runs:
            if m in keys[r.name]:
                panel.series.append(Series(r.name, "valid", label, *r.epoch_x(m)))
        out.append(panel)
    lr, speed = Panel("lr", "learning rate", "step size"), Panel("speed", "throughput", "samples/s")
    for r in runs:
        lr.series.append(Series(r.name, "lr", "lr", *_lr_steps(r)))
        xs, ys = r.step_x("samples_per_s")
        if xs:
            speed.series.append(Series(r.name, "speed", "samples/s", xs, ys))
    out += [lr, speed]
    return [p for p in out if any(s.xs for s in p.series)]


def _settings(start: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """The job's key settings from its start line, as the title and legend show them."""
    out = []
    for k in keys:
        v = start.get(k)
        if v is None or v == "":
            continue
        if k == "lr":
            out.append(f"lr {v:g}")
        elif k == "global_batch":
            out.append(f"batch {v}")
        elif k == "workers":
            out.append(f"{v} worker{'s' if v != 1 else ''}")
        elif k == "updates_per_epoch":
            out.append(f"{v} updates/epoch")
        else:
            out.append(str(v))
    return out


_SETTINGS = ("job", "model", "lr", "decay", "global_batch", "workers", "updates_per_epoch")


def _shared(runs: Sequence[Run]) -> list[str]:
    """The settings every run has alike (all of them for one run)."""
    return [k for k in _SETTINGS if len({json.dumps(r.start.get(k)) for r in runs}) == 1]


def title_of(runs: Sequence[Run]) -> str:
    """The job, its model and key settings (those all runs share), from the start lines; the
    run's name under them (one run), or how many runs are compared."""
    head = " · ".join(_settings(runs[0].start, _shared(runs)))
    tail = runs[0].name if len(runs) == 1 else f"{len(runs)} runs compared"
    return f"{head}\n{tail}" if head else tail


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Each run's legend entry: its name, and the settings in which the runs differ."""
    differ = [k for k in _SETTINGS if k not in _shared(runs)]
    out = []
    for r in runs:
        said = _settings(r.start, differ)
        out.append(f"{r.name} ({', '.join(said)})" if said else r.name)
    return out
