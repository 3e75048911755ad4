"""Reading a path wherever it lives: a local disk, or object storage, chosen once from the path.

The job's inputs, a JSON model file, a run's metrics and the runs under a log root are read
the same way wherever they are: does the path exist, is it a file or a folder, what does a
folder hold, what does a file contain. :class:`FileStore` is that interface, :class:`LocalFiles`
(``os`` calls) and :class:`ObjectFiles` (:mod:`angelps.fs`, pyarrow) its two implementations,
and :func:`files_for` the one place that looks at a path to pick one (:func:`is_url` is its
test). Writing a checkpoint is :mod:`angelps.checkpoint.store`'s, and where a job's runs are
logged :mod:`learners.runs.log_store`'s; both choose by the same test.

Standard library only at import: pyarrow loads on the first use of an object-store path, so
that the light commands (``angelps plot`` of a local run, ``conf``) never load it.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

__all__ = ["FileStore", "LocalFiles", "ObjectFiles", "files_for", "is_url"]


def is_url(path: object) -> bool:
    """Whether ``path`` is on object storage: a URL of a non-local file system (``s3://``,
    ``gs://``, ``hdfs://``; ``file://`` is local). The same test as
    :func:`angelps.fs.is_remote`, without loading pyarrow."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


class FileStore(Protocol):
    """Where a path lives, as its readers need it."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file or a folder (on object storage: a prefix of objects)."""
        ...

    def is_file(self, path: str) -> bool:
        """Whether ``path`` is a file (on object storage: an object)."""
        ...

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a folder (on object storage: a prefix holding objects)."""
        ...

    def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """(name, is a folder) of the entries directly under folder ``path``, by name."""
        ...

    def files_in(self, path: str) -> list[str]:
        """The names of the files directly under folder ``path``, by name."""
        ...

    def read_bytes(self, path: str) -> bytes:
        """The whole content of file ``path`` (FileNotFoundError when it is not a file)."""
        ...

    def join(self, base: str, *parts: str) -> str:
        """``base`` joined with ``parts`` (``/`` on object storage)."""
        ...

    def canonical(self, path: str) -> str:
        """``path`` as messages and comparisons name it (local: ``~`` expanded, normalised,
        without ``file://``; a URL as it is)."""
        ...

    def is_absolute(self, path: str) -> bool:
        """Whether ``path`` means the same place from any working directory (a URL does)."""
        ...

    def absolute(self, path: str, base: str | None = None) -> str:
        """``path`` from any working directory: a local one against ``base`` (default: the
        current directory), ``~`` expanded, normalised, without ``file://``; a URL as it is."""
        ...

    def parent(self, path: str) -> str | None:
        """The folder holding ``path``; None when there is none to hold siblings of it (a
        bucket: its siblings would be other buckets)."""
        ...

    def disk_path(self, path: str) -> Path | None:
        """``path`` on this machine's file system, for what only a disk has (permissions,
        realpath, in-place files); None on object storage."""
        ...

    def probe(self, path: str, must_exist: bool) -> str | None:
        """Why the store of ``path`` cannot be used, in a few words, or None: on object storage
        a bounded check of the store, the bucket, the credentials (and with ``must_exist`` the
        path); a local disk needs no check (its paths are checked where they are used)."""
        ...


class LocalFiles:
    """Paths on the local file system (``file://`` is one too), read with ``os`` calls."""

    def exists(self, path: str) -> bool:
        return os.path.exists(_local(path))

    def is_file(self, path: str) -> bool:
        return os.path.isfile(_local(path))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(_local(path))

    def list_dir(self, path: str) -> list[tuple[str, bool]]:
        p = _local(path)
        return sorted((n, os.path.isdir(os.path.join(p, n))) for n in os.listdir(p))

    def files_in(self, path: str) -> list[str]:
        p = _local(path)
        return sorted(n for n in os.listdir(p) if os.path.isfile(os.path.join(p, n)))

    def read_bytes(self, path: str) -> bytes:
        p = _local(path)
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{path}: no such file")
        with open(p, "rb") as f:
            return f.read()

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def canonical(self, path: str) -> str:
        return os.path.normpath(os.path.expanduser(_local(path)))

    def is_absolute(self, path: str) -> bool:
        return os.path.isabs(_local(path))

    def absolute(self, path: str, base: str | None = None) -> str:
        p = os.path.expanduser(_local(path))
        return os.path.normpath(p if os.path.isabs(p) else os.path.join(base or os.getcwd(), p))

    def parent(self, path: str) -> str | None:
        return os.path.dirname(os.path.abspath(_local(path)))

    def disk_path(self, path: str) -> Path | None:
        return Path(_local(path))

    def probe(self, path: str, must_exist: bool) -> str | None:
        return None


class ObjectFiles:
    """Paths on object storage (``s3://``, ``gs://``, ``hdfs://``), read through
    :mod:`angelps.fs` (pyarrow, loaded on first use)."""

    def exists(self, path: str) -> bool:
        from angelps import fs  # pyarrow: only for a path on object storage

        return fs.exists(path)

    def is_file(self, path: str) -> bool:
        from angelps import fs

        return fs.is_file(path)

    def is_dir(self, path: str) -> bool:
        from angelps import fs

        return fs.is_dir(path)

    def list_dir(self, path: str) -> list[tuple[str, bool]]:
        from angelps import fs

        return fs.list_dir(path)

    def files_in(self, path: str) -> list[str]:
        return [n for n, is_dir in self.list_dir(path) if not is_dir]

    def read_bytes(self, path: str) -> bytes:
        from angelps import fs

        return fs.read_bytes(path)

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts)

    def canonical(self, path: str) -> str:
        return path

    def is_absolute(self, path: str) -> bool:
        return True

    def absolute(self, path: str, base: str | None = None) -> str:
        return path

    def parent(self, path: str) -> str | None:
        parts = urlsplit(path)
        inner = parts.path.strip("/")
        if not inner:
            return None  # the bucket itself
        head = posixpath.dirname(inner)
        return (
            f"{parts.scheme}://{parts.netloc}/{head}"
            if head
            else f"{parts.scheme}://{parts.netloc}"
        )

    def disk_path(self, path: str) -> Path | None:
        return None

    def probe(self, path: str, must_exist: bool) -> str | None:
        from angelps import fs

        return fs.probe(path, must_exist)


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


_LOCAL = LocalFiles()
_OBJECT = ObjectFiles()


def files_for(path: str) -> FileStore:
    """The store that ``path`` names: object storage for a URL, else the local disk. The one
    place that looks at a path to choose how to read it."""
    return _OBJECT if is_url(path) else _LOCAL
