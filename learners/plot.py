"""Training curves from a job's ``metrics.jsonl``: loss, validation metrics, learning rate.

The file holds one JSON object per line, as the learner writes it under ``angel.log.path``:

- ``{"kind": "step", "epoch", "step", "lr", "loss", "samples_per_s", "pull_s", ...}``
- ``{"kind": "epoch", "epoch", "lr", "train_loss", "valid_auc", "valid_logloss", ...}``
- ``{"kind": "summary", ...}`` at the end of a run

The learner appends, so one file may hold several runs; a run ends at its ``summary`` line, or
where the step count goes backwards. Lines of other kinds are skipped; a line that is not a JSON
object, or a step/epoch line without its step/epoch number, is an error naming the file and line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HEADLINE_METRICS", "Run", "plot_metrics", "read_metrics"]

# Drawn by default when present; any other valid_* metric can be asked for with `metrics`.
HEADLINE_METRICS = (
    "valid_auc",
    "valid_logloss",
    "valid_accuracy",
    "valid_rmse",
    "valid_mae",
    "valid_r2",
)


@dataclass
class Run:
    """The step and epoch lines of one training run, in file order."""

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


def read_metrics(path: str | Path) -> list[Run]:
    """Parse ``metrics.jsonl`` into runs. Raises ValueError naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such metrics file")
    runs: list[Run] = [Run()]
    last_step = -math.inf
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            text = line.strip()
            if not text:
                continue
            where = f"{p}:{lineno}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not a JSON object ({e.msg}): {text[:60]!r}") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected a JSON object, found {text[:60]!r}")
            kind = obj.get("kind")
            run = runs[-1]
            if kind == "step":
                _require_number(obj, "step", where)
                _require_number(obj, "loss", where)
                _check_values(obj, where)
                if obj["step"] <= last_step and (run.steps or run.epochs):
                    run = Run()
                    runs.append(run)
                last_step = obj["step"]
                run.steps.append(obj)
            elif kind == "epoch":
                _require_number(obj, "epoch", where)
                _check_values(obj, where)
                run.epochs.append(obj)
            elif kind == "summary":
                if run.steps or run.epochs:
                    runs.append(Run())
                last_step = -math.inf
    runs = [r for r in runs if r.steps or r.epochs]
    if not runs:
        raise ValueError(f"{p}: no step or epoch lines (is this a metrics.jsonl?)")
    return runs


def plot_metrics(
    path: str | Path,
    out: str | Path,
    metrics: list[str] | None = None,
    last_run_only: bool = False,
    title: str | None = None,
) -> Path:
    """Draw loss, validation metrics, learning rate (and samples/s when logged) to ``out``.

    ``metrics`` picks the validation metrics (default: those of :data:`HEADLINE_METRICS` that
    the file has; any numeric ``valid_*`` may be named). The image
    format follows the suffix of ``out`` (png, pdf, svg). Returns the path written.
    """
    # Here, not at the top: the backend must be chosen before pyplot is first imported, and
    # only a drawing needs matplotlib at all.
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in a Ray job or on CI
    import matplotlib.pyplot as plt

    runs = read_metrics(path)
    if last_run_only:
        runs = runs[-1:]
    if metrics:
        present = {k for r in runs for k in r.valid_keys()}
        missing = [m for m in metrics if m not in present]
        if missing:
            raise ValueError(
                f"{path}: no {', '.join(missing)} in the epoch lines; "
                f"present: {', '.join(sorted(present)) or 'none'}"
            )
    labelled = len(runs) > 1
    has_speed = any("samples_per_s" in s for r in runs for s in r.steps)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), squeeze=False)
    ax_loss, ax_valid, ax_lr, ax_speed = axes[0][0], axes[0][1], axes[1][0], axes[1][1]

    for i, run in enumerate(runs):
        tag = f"run {i + 1} " if labelled else ""
        xs, ys = run.series("step", "step", "loss")
        if xs:
            ax_loss.plot(xs, ys, lw=1, label=f"{tag}train loss (per log interval)")
        # Epoch lines carry no step number: place each at the last step logged in its epoch.
        epoch_end = {}
        for s in run.steps:
            if "epoch" in s:
                epoch_end[s["epoch"]] = float(s["step"])
        ex = [epoch_end.get(e["epoch"]) for e in run.epochs if "train_loss" in e]
        ey = [_num(e["train_loss"]) for e in run.epochs if "train_loss" in e]
        if ex and all(x is not None for x in ex):
            ax_loss.plot(ex, ey, "o-", ms=4, label=f"{tag}train loss (epoch mean)")
        elif ey and not xs:
            eps = [float(e["epoch"]) for e in run.epochs if "train_loss" in e]
            ax_loss.plot(eps, ey, "o-", ms=4, label=f"{tag}train loss (epoch mean)")
            ax_loss.set_xlabel("epoch")

        for key in metrics or run.headline_keys():
            vx, vy = run.series("epoch", "epoch", key)
            if vx:
                ax_valid.plot(vx, vy, "o-", ms=4, label=f"{tag}{key}")

        lx, ly = run.series("step", "step", "lr")
        if lx:
            # A step line's lr held over the interval that ends at its step: steps-pre.
            ax_lr.plot(lx, ly, lw=1.2, drawstyle="steps-pre", label=f"{tag}lr (per log interval)")
            ax_lr.set_xlabel("step")
        else:
            lx, ly = run.series("epoch", "epoch", "lr")
            ax_lr.plot(lx, ly, "o-", ms=4, label=f"{tag}lr")
            ax_lr.set_xlabel("epoch")

        sx, sy = run.series("step", "step", "samples_per_s")
        if sx:
            ax_speed.plot(sx, sy, lw=1, label=f"{tag}samples/s")

    ax_loss.set_title("training loss")
    if not ax_loss.get_xlabel():
        ax_loss.set_xlabel("step")
    ax_valid.set_title("validation")
    ax_valid.set_xlabel("epoch")
    ax_lr.set_title("learning rate")
    ax_speed.set_title("throughput")
    ax_speed.set_xlabel("step")
    ax_speed.set_ylabel("samples/s")
    if not has_speed:
        ax_speed.text(0.5, 0.5, "no samples_per_s logged", ha="center", va="center")
        ax_speed.set_axis_off()
    for ax in (ax_loss, ax_valid, ax_lr, ax_speed):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not any(r.epochs for r in runs):
        ax_valid.text(0.5, 0.5, "no epoch lines yet", ha="center", va="center")
    fig.suptitle(title or str(path), fontsize=10)
    fig.tight_layout()
    out_path = Path(out)
    if out_path.parent != Path(""):
        out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out_path, dpi=110)
    except ValueError as e:  # matplotlib: unknown format
        raise ValueError(f"--out {out}: {e}") from None
    finally:
        plt.close(fig)
    return out_path
