"""Drawing the panels of :mod:`learners.runs.curves` with matplotlib (imported only to draw).

Styles say what a curve is, colours say which run: training per log interval is a thin line,
training per epoch a solid line with dots, validation a dashed line with squares (its best
point marked and labelled when one run is drawn), the learning rate a step line. One run: each
panel has its own legend of what its curves are. Several runs: one legend above the panels names
the runs by colour, and the loss panel's legend says what the styles are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learners.runs.curves import Panel, Run, Series, run_labels
from learners.runs.output_file import replace_atomically

__all__ = ["draw"]

_STYLE: dict[str, dict[str, Any]] = {
    "interval": {"lw": 1.0, "alpha": 0.45},
    "epoch": {"lw": 1.8, "marker": "o", "ms": 4},
    "valid": {"lw": 1.8, "ls": "--", "marker": "s", "ms": 4},
    "lr": {"lw": 1.6, "drawstyle": "steps-pre"},
    "speed": {"lw": 1.0, "alpha": 0.8},
}
# Higher is better for these panels; lower for the others (where the best point is marked).
_HIGHER = ("auc", "accuracy", "r2")


def _colors(runs: Sequence[Run], one: bool) -> dict[tuple[str, str], str]:
    """A colour per (run, curve): per curve label with one run, per run with several."""
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return (
        {("", str(i)): c for i, c in enumerate(cycle)}
        if one
        else {(r.name, ""): cycle[i % len(cycle)] for i, r in enumerate(runs)}
    )


def _best(panel: Panel, s: Series) -> tuple[float, float] | None:
    pts = [(x, y) for x, y in zip(s.xs, s.ys, strict=True) if not math.isnan(y)]
    if s.style != "valid" or not pts:
        return None
    pick = max if panel.key in _HIGHER else min
    return pick(pts, key=lambda p: p[1])


def _draw_panel(ax: Any, panel: Panel, one: bool, colors: dict[tuple[str, str], str]) -> None:
    labels: dict[str, int] = {}
    title = panel.title
    alone = one and len(panel.series) == 1  # its best goes in the title, no legend needed
    for s in panel.series:
        if one:
            idx = labels.setdefault(s.label, len(labels))
            color = colors.get(("", str(idx)), "k")
            label = s.label
        else:
            color = colors[(s.run, "")]
            label = None
        best = _best(panel, s)
        if best is not None and one:
            said = f"best {best[1]:.4f} at epoch {best[0]:.0f}"
            title = f"{title}: {said}" if alone else title
            label = f"{s.label}: {said}"
            ax.plot(*best, marker="*", ms=14, color=color, zorder=5, ls="none")
        ax.plot(s.xs, s.ys, color=color, label=label, **_STYLE[s.style])
    ax.set_title(title, fontsize=12)
    ax.set_ylabel(panel.ylabel, fontsize=10)
    ax.grid(True, alpha=0.35)
    ax.margins(y=0.12)
    if one and len(panel.series) > 1:
        ax.legend(fontsize=9, loc="best")


def _style_legend(ax: Any, panel: Panel) -> None:
    from matplotlib.lines import Line2D

    shown = dict.fromkeys((s.style, s.label) for s in panel.series)
    handles = [Line2D([], [], color="0.3", **_STYLE[style]) for style, _ in shown]
    ax.legend(handles, [label for _, label in shown], fontsize=9, loc="best")


def draw(panels: Sequence[Panel], runs: Sequence[Run], out: Path, title: str) -> Path:
    """The figure of ``panels`` at ``out``: two or three panels a row, one shared epoch axis."""
    # Here, not at the top: the backend must be chosen before pyplot is first imported, and
    # only a drawing needs matplotlib at all.
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in a Ray job or on CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    one = len(runs) == 1
    n = max(len(panels), 1)
    cols = 2 if n <= 4 else 3
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(5.2 * cols, 3.4 * rows + 0.8),
        sharex=True,
        squeeze=False,
        layout="constrained",
    )
    colors = _colors(runs, one)
    in_updates = any(r.updates_per_epoch() is None for r in runs)
    for ax, panel in zip(axes.flat, panels, strict=False):
        _draw_panel(ax, panel, one, colors)
        if not one and panel.key == "loss":
            _style_legend(ax, panel)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=12))
        ax.tick_params(labelbottom=True, labelsize=9)
        ax.set_xlabel("update" if in_updates else "epoch", fontsize=10)
    axes.flat[0].set_xlim(left=0)
    fig.suptitle(title, fontsize=13)
    if not one:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=colors[(r.name, "")], lw=2.5) for r in runs]
        fig.legend(
            handles,
            run_labels(runs),
            loc="outside lower center",
            ncol=min(len(runs), 4),
            fontsize=10,
            frameon=False,
        )
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Replaced whole (a symbolic link there is replaced, never written through).
        fmt = out.suffix[1:].lower() or None
        replace_atomically(out, lambda tmp: fig.savefig(tmp, dpi=100, format=fmt))
    except ValueError as e:  # matplotlib: unknown format
        raise ValueError(f"--out {out}: {e}") from None
    finally:
        plt.close(fig)
    return out
