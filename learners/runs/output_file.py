"""One output file replaced whole or not at all (predictions, an exported state_dict).

The file is written under a temporary name in its own directory, fsynced, and renamed over
``out``, so a failure (an exception, Ctrl-C, a full disk) leaves ``out`` as it was and no
temporary behind; a crash after the rename leaves the new file complete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["current_umask", "replace_atomically"]


def current_umask() -> int:
    """The process's umask, read without changing it where /proc tells it (os.umask can only
    be read by setting it, which is racy with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_atomically(out: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` to write a temporary file next to ``out``, then rename it to
    ``out``; on any failure the temporary is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        write(tmp)
        # mkstemp creates the file 0600; a finished output is as readable as any new file
        # (0644 under umask 022), for the other users and services that read it.
        os.chmod(tmp, 0o666 & ~current_umask())
        # The rename must not become durable before the bytes it names.
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
