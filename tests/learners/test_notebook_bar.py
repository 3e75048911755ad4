"""In a Jupyter kernel the progress is tqdm's notebook widget, not a plain line every 30 s
(learners/runs/progress.py, learners/runs/run_log.py)."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import ClassVar

import pytest

from learners.runs.progress import JobBar, PlainProgress, in_notebook
from learners.runs.run_log import RunLog


class ZMQInteractiveShell:  # the name Jupyter's kernel shell has
    pass


class _Widget:
    made: ClassVar[list[dict]] = []

    def __init__(self, **kw: object) -> None:
        _Widget.made.append(kw)
        self.n, self.disable = int(kw.get("initial", 0)), False

    def set_postfix_str(self, *a: object, **k: object) -> None: ...
    def set_description_str(self, *a: object, **k: object) -> None: ...
    def refresh(self) -> None: ...
    def clear(self) -> None: ...
    def close(self) -> None: ...

    def update(self, n: int) -> None:
        self.n += n


@pytest.fixture
def kernel(monkeypatch):
    fake = types.ModuleType("IPython")
    fake.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "ipywidgets" else real(name, *a),
    )
    notebook = types.ModuleType("tqdm.notebook")
    notebook.tqdm = _Widget  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm.notebook", notebook)
    _Widget.made.clear()


def test_outside_a_kernel_there_is_no_widget(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert in_notebook() is False
    log = RunLog(None, progress_s=30.0, tty=False)
    assert isinstance(log.bar(100, 0, 2, 50), PlainProgress)
    log.close()


@pytest.mark.usefixtures("kernel")
def test_in_a_kernel_the_bar_is_the_notebook_widget() -> None:
    assert in_notebook() is True
    log = RunLog(None, progress_s=30.0)
    bar = log.bar(100, 0, 2, 50)
    assert isinstance(bar, JobBar) and isinstance(bar.bar, _Widget)
    assert _Widget.made == [{"total": 100, "desc": "epoch 1/2", "initial": 0, "unit": "upd"}]
    bar.update(60, 600, 1.0, 0.5, 0.1)
    assert bar.bar.n == 60
    log.close()
    assert RunLog(None, quiet=True).notebook is False  # quiet: no bar at all
