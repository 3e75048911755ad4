"""Shared fixtures: one private local Ray per test module that asks for it; a probe of what a
fresh interpreter loads."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.short_tmp import short_tmp


def _local_ray(gpus: int) -> Iterator[None]:
    import ray

    tmp = short_tmp()
    ray.init(
        num_cpus=2,
        num_gpus=gpus,
        include_dashboard=False,
        namespace="angelps",
        _temp_dir=tmp,
        log_to_driver=False,
    )
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A local Ray for this module: 2 CPUs, no dashboard, its own short temp dir (see
    :func:`short_tmp`), namespace angelps."""
    # (no GPU, on a CUDA machine too: tests pin "no GPU" errors)
    yield from _local_ray(0)


@pytest.fixture(scope="module")
def ray_local_gpu() -> Iterator[None]:
    """:func:`ray_local` with the machine's GPU, where it has one (for the ``gpu`` twins of
    a module's jobs, whose workers ask for one)."""
    import torch

    yield from _local_ray(1 if torch.cuda.is_available() else 0)


HEAVY = ("numpy", "torch", "ray", "pyarrow", "pandas")
ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "tests" / "faults"


@pytest.hookimpl(tryfirst=True)  # (before -m deselects)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/faults is of the ``e2e`` tier (whole jobs under injected faults:
    CI runs them after the default suite, which leaves them out to stay near 10 minutes)."""
    for item in items:
        if FAULTS in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def heavy_after() -> Callable[[str], list[str]]:
    """Runs Python ``code`` in a fresh interpreter at the repo root; returns the heavy libraries
    (numpy, torch, Ray, pyarrow, pandas) it left loaded. The config-only paths (the key modules,
    the package faces, `angelps conf`) must leave none."""

    def run(code: str) -> list[str]:
        probe = f"{code}\nimport sys\nprint('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
        out = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
        )
        last = out.stdout.strip().splitlines()[-1]
        assert last.startswith("HEAVY="), out.stdout
        return [m for m in last.removeprefix("HEAVY=").split(",") if m]

    return run


# Tests keep what their jobs write under tmp_path: a job file's relative paths (runs/...) are
# the repository's, and two test processes writing them at once collide on their save locks.
# Where the repository has no runs/ folder when the tests start (a fresh clone: CI), the run
# fails if one appears.
_RUNS = Path(__file__).resolve().parents[1] / "runs"
_RUNS_AT_START = _RUNS.exists()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _RUNS_AT_START or hasattr(session.config, "workerinput") or not _RUNS.exists():
        return
    names = sorted(p.name for p in _RUNS.iterdir())
    msg = (
        f"error: the tests wrote into the repository's runs/ folder ({', '.join(names[:5])}): "
        "a test's job keeps its outputs under tmp_path (angel.save.model.path, angel.log.path)"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(msg, red=True)
    else:
        print(msg, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
