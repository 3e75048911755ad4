"""The test tiers: the default suite leaves the end-to-end tier (every test under tests/faults,
the whole jobs on the object storage emulators) and the slow tests out, and CI runs the
end-to-end tier after the default suite, then the slow tests of the tables on the workers and
their device tiers, so that no test drops out of CI unseen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.child_env import python_path

REPO = Path(__file__).resolve().parents[2]
ONE_FAULT_FILE = "tests/faults/test_job_checks.py"
ONE_STORAGE_FILE = "tests/learners/test_object_storage_gcs.py"


def _collected(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": python_path(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode in (0, 5), out.stdout + out.stderr  # (5: nothing selected)
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_the_default_suite_leaves_the_e2e_and_slow_tiers_out() -> None:
    conf = (REPO / "pyproject.toml").read_text()
    assert """addopts = "-ra -m 'not slow and not e2e' """ in conf
    assert '\n    "e2e: whole jobs under injected faults (tests/faults)' in conf
    assert _collected(ONE_FAULT_FILE, ONE_STORAGE_FILE) == []
    e2e = _collected("-m", "e2e and not slow", ONE_FAULT_FILE, ONE_STORAGE_FILE)
    assert {t.split("::")[0] for t in e2e} == {ONE_FAULT_FILE, ONE_STORAGE_FILE}


#: The long tests CI runs after the e2e tier: the tables on the workers and their device tiers.
SLOW_FILES = [
    "tests/learners/test_device_tier_job.py",
    "tests/faults/test_tier_failover.py",
    "tests/learners/test_worker_tables.py",
    "tests/ops/test_bench_big_job.py",
]


def test_ci_runs_the_default_suite_then_the_e2e_tier_then_the_tiers_slow_tests() -> None:
    script = (REPO / ".ci" / "run").read_text().replace("\\\n", " ")
    lines = [
        " ".join(line.split())
        for line in script.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    runs = [line for line in lines if "scripts/test" in line]
    assert runs == [
        "bash scripts/test",
        'ANGELPS_LINT=0 bash scripts/test -m "e2e and not slow"',
        "ANGELPS_LINT=0 bash scripts/test -m slow " + " ".join(SLOW_FILES),
    ]
    readme = (REPO / "README.md").read_text()
    assert "bash scripts/test\n" in readme or "bash scripts/test " in readme
    assert '`bash scripts/test -m "e2e and not slow"`' in readme
    # (every file named holds slow tests: a file renamed or emptied fails here, not silently)
    slow = _collected("-m", "slow", *SLOW_FILES)
    assert {t.split("::")[0] for t in slow} == set(SLOW_FILES)
