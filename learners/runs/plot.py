"""Drawing training curves: the run(s) of metrics.jsonl files to a png, pdf or svg.

What goes into the figure (the runs read, the panels, the labels) is
:mod:`learners.runs.curves`; the drawing itself, with matplotlib (imported only to draw), is
:mod:`learners.runs.plot_draw`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from learners.runs.curves import Run, panels, read_metrics, title_of

__all__ = ["plot_metrics", "plot_runs"]


def plot_metrics(
    path: str | Path,
    out: str | Path,
    metrics: list[str] | None = None,
    last_run_only: bool = False,
    title: str | None = None,
) -> Path:
    """Draw the run(s) of one metrics.jsonl to ``out`` (see :func:`plot_runs`)."""
    runs = read_metrics(path)
    return plot_runs(runs[-1:] if last_run_only else runs, out, metrics, title, where=str(path))


def plot_runs(
    runs: Sequence[Run],
    out: str | Path,
    metrics: list[str] | None = None,
    title: str | None = None,
    where: str = "",
) -> Path:
    """Draw ``runs`` to ``out`` (png, pdf, svg by its suffix); returns the path written.

    ``metrics`` picks the validation metrics (default: the headline ones each run has; any
    numeric ``valid_*`` may be named). ValueError for a metric no run has, or a bad format."""
    if metrics:
        present = {k for r in runs for k in r.valid_keys()}
        missing = [m for m in metrics if m not in present]
        if missing:
            raise ValueError(
                f"{where or ', '.join(r.name for r in runs)}: no {', '.join(missing)} in the "
                f"epoch lines; present: {', '.join(sorted(present)) or 'none'}"
            )
    from learners.runs.plot_draw import draw  # matplotlib: only when drawing

    return draw(panels(runs, metrics), runs, Path(out), title or title_of(runs))
