"""A private local Ray starts without Ray's token-authentication warning on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_START = """
import ray
from learners import cluster
cluster.start_or_join(None, 5.0)
ray.shutdown()
print("started")
"""


@pytest.mark.slow  # starts a Ray
def test_a_private_ray_starts_without_the_token_warning() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run(
        [sys.executable, "-c", _START],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "started"
    assert "Token authentication" not in run.stderr, run.stderr
