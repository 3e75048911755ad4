"""A short temp directory for Ray: Ray puts Unix sockets under its temp dir, and a socket path
must stay under 107 bytes, which pytest's ``tmp_path`` (a long user name, a CI's TMPDIR) can
exceed."""

from __future__ import annotations

import os
import tempfile

__all__ = ["short_tmp"]

_ROOT = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()


def short_tmp(prefix: str = "ray-") -> str:
    """A new, short temp directory (for Ray's ``_temp_dir``); the caller removes it."""
    return tempfile.mkdtemp(prefix=prefix, dir=_ROOT)
