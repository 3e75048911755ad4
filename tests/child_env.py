"""The import path of a Python process a test starts: the repository first, then the path the
tests themselves run with, so a child finds what an environment provides through PYTHONPATH
(Ray unpacked beside a system torch, as on a GPU machine without Ray installed) as well as the
code under test."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["python_path"]


def python_path(repo: str | os.PathLike[str]) -> str:
    """``repo`` then this process's PYTHONPATH, for a child's ``PYTHONPATH``."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(Path(repo)), *[p for p in inherited.split(os.pathsep) if p]])
