"""scripts/_env.sh reinstalls only when the requirements changed or extras not installed are
asked for: quickstart after scripts/test (whose extras hold its own) reused the install no more."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("have", "extras", "covered"),
    [
        ("abc-test", "", True),  # quickstart after scripts/test
        ("abc-test", "test", True),
        ("abc-", "test", False),  # scripts/test after quickstart: its extras are missing
        ("abc-test,gpu", "gpu", True),
        ("abd-test", "", False),  # pyproject.toml changed
        ("", "", False),  # never installed
    ],
)
def test_an_install_covers_the_extras_it_holds(have: str, extras: str, covered: bool) -> None:
    code = f'source scripts/_env.sh; _stamp_covers "{have}" abc "{extras}"'
    out = subprocess.run(["bash", "-c", code], cwd=ROOT)
    assert (out.returncode == 0) is covered
