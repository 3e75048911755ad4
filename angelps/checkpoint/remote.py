"""A checkpoint on object storage (``s3://...``): generations, and a pointer committed last.

Object storage has no rename, so the local protocol (:mod:`angelps.checkpoint.local_dir`: a temporary
sibling renamed into place) cannot be used. A checkpoint saved at URL ``<path>`` is instead::

    <path>/LATEST.json             the pointer: {"format", "current", "previous", "kept"}
    <path>/gen-<id>/manifest.json  one generation: a complete checkpoint (tables, dense file,
    <path>/gen-<id>/<table>/...    manifest with every file's SHA-256), as a local one

A save writes a new generation (every file first, its manifest last), then commits it by
writing ``LATEST.json`` (one object, replaced whole: a reader sees the old pointer or the new
one). Only then are the generations the pointer no longer names removed: the one before the
previous, and uncommitted ones left by a save that crashed. Invariants: a generation that no
pointer names is not a checkpoint (nothing reads it); the previous committed generation stays
readable until the new pointer is written, and is kept as ``previous`` after it (``--resume``
falls back to it when the latest is damaged); a damaged generation set aside by ``--resume`` is
listed in ``kept`` and never removed.

A copy of a committed checkpoint (the kept ``<path>.epoch-<n>`` and ``<path>.best`` of a
training job) is a checkpoint of the same form at its own URL, made the same way
(:func:`copy_checkpoint`: every object copied server-side into a new generation, compared,
then the copy's pointer), so a crash mid-copy leaves the copy as it was. :func:`remove`
removes only what a save or a copy wrote: the pointer, then the generations.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from angelps import fs
from angelps.checkpoint.errors import MANIFEST, CheckpointDamaged, CheckpointError, NoCheckpoint

__all__ = [
    "POINTER",
    "check_target",
    "commit_dir",
    "copy_checkpoint",
    "current",
    "holds_checkpoint",
    "new_tmp_dir",
    "previous",
    "remove",
    "resolve",
    "set_aside",
]

POINTER = "LATEST.json"
_POINTER_FORMAT = "angelps-checkpoint-pointer"
_GEN = re.compile(r"gen-[0-9]{1,24}-[0-9a-f]{1,32}")


def _pointer(path: str) -> dict[str, Any] | None:
    """The pointer of the checkpoint at ``path`` (None without one), its names checked."""
    where = fs.join(path, POINTER)
    try:
        data = fs.read_bytes(where)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"cannot read {where}: {' '.join(str(e).split())}") from None
    try:
        ptr = json.loads(data)
        names = [ptr["current"], *([ptr["previous"]] if ptr.get("previous") else [])]
        names += list(ptr.get("kept", []))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointDamaged(f"checkpoint file {where} is damaged or unreadable") from None
    # A name, never a path: a pointer cannot lead outside its checkpoint.
    if ptr.get("format") != _POINTER_FORMAT or not all(
        isinstance(n, str) and _GEN.fullmatch(n) for n in names
    ):
        raise CheckpointDamaged(f"checkpoint file {where} is damaged: not an angelps pointer")
    return dict(ptr)


def current(path: str) -> str | None:
    """The name of the generation the pointer at ``path`` names (None without a pointer)."""
    ptr = _pointer(path)
    return str(ptr["current"]) if ptr else None


def holds_checkpoint(path: str) -> bool:
    """Whether ``path`` has a committed checkpoint (a pointer)."""
    return fs.exists(fs.join(path, POINTER))


def check_target(path: str) -> None:
    """Refuse a save URL that holds something other than angelps generations: a file, or a
    prefix of other objects without a pointer."""
    if not fs.exists(path):
        return
    if not fs.is_dir(path):
        raise CheckpointError(
            f"{path} is a file, not a checkpoint directory: angelps will not replace it "
            "(remove it or choose another path)"
        )
    names = [n for n, _ in fs.list_dir(path)]
    if POINTER not in names and any(not _GEN.fullmatch(n) for n in names):
        raise CheckpointError(
            f"{path} holds objects without an angelps checkpoint ({POINTER}): angelps will not "
            "replace them (choose a new or empty prefix)"
        )


def new_tmp_dir(path: str) -> str:
    """The URL of a new generation under ``path`` (nothing is created: a prefix exists once an
    object is written under it)."""
    check_target(path)
    return fs.join(path, f"gen-{time.time_ns()}-{uuid.uuid4().hex[:8]}")


def commit_dir(tmp: str, path: str, keep_previous: bool = True) -> None:
    """Make the complete generation ``tmp`` the checkpoint at ``path``: write the pointer, then
    remove the generations it no longer names (see the module docstring). Without
    ``keep_previous`` the generation it replaces is removed too (a copy has no fallback)."""
    check_target(path)
    old = _pointer(path)
    new = tmp.rstrip("/").rsplit("/", 1)[-1]
    kept: list[str] = list(old.get("kept", [])) if old else []
    prev: str | None = old["current"] if old and keep_previous else None
    ptr = {
        "format": _POINTER_FORMAT,
        "current": new,
        "previous": prev,
        "kept": kept,
        "committed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    fs.write_bytes(fs.join(path, POINTER), json.dumps(ptr, indent=1).encode())
    _prune(path, {new, *([prev] if prev else []), *kept})


def _prune(path: str, keep: set[str]) -> None:
    """Remove the generations under ``path`` that are not in ``keep``."""
    for name, is_dir in fs.list_dir(path):
        if is_dir and _GEN.fullmatch(name) and name not in keep:
            fs.delete_dir(fs.join(path, name))


def copy_checkpoint(src: str, dst: str) -> str:
    """Make ``dst`` a checkpoint equal to the one committed at ``src`` (on the same store),
    replacing the one there only once the copy is complete; the new generation's URL.

    Every object of ``src``'s current generation is copied server-side into a new generation
    under ``dst``, the manifest last; the copy is listed and compared with the source (names
    and sizes) before ``dst``'s pointer is written. A crash or an error before that leaves
    ``dst`` as it was (the partial generation is removed by its next commit)."""
    tmp = new_tmp_dir(dst)  # refuses a dst of other objects before anything is copied
    gen = resolve(src)
    files = fs.list_files(gen)
    if MANIFEST not in dict(files):
        raise CheckpointDamaged(f"checkpoint {gen} is damaged: it has no {MANIFEST}")
    # The manifest last: a generation is read only through a pointer, but a copy holding a
    # manifest should hold every file the manifest names.
    for rel, _ in sorted(files, key=lambda f: f[0] == MANIFEST):
        fs.copy_file(fs.join(gen, rel), fs.join(tmp, rel))
    copied = fs.list_files(tmp)
    if copied != files:
        missing = sorted(set(files) - set(copied))
        raise CheckpointError(
            f"copying the checkpoint {gen} to {tmp} left it incomplete ({len(missing)} of "
            f"{len(files)} files missing or of another size, first {missing[:1]}): {dst} "
            "is unchanged"
        )
    commit_dir(tmp, dst, keep_previous=False)
    return tmp


def remove(path: str) -> None:
    """Remove the checkpoint at ``path`` (a save's or a copy's): its pointer first, so that it
    stops being a checkpoint at once, then its generations. Any other object under ``path``
    stays; a ``LATEST.json`` that is not an angelps pointer is a CheckpointDamaged and nothing
    is removed."""
    _pointer(path)  # an angelps pointer, or none (a copy that crashed before its commit)
    fs.delete_file(fs.join(path, POINTER))
    _prune(path, set())
    if not fs.list_dir(path):
        # pyarrow leaves an empty "directory" object where it deleted the last object under a
        # prefix: drop it too, or every pruned copy would leave one behind.
        fs.delete_dir(path)


def resolve(path: str) -> str:
    """The generation holding the checkpoint at ``path`` (the pointer's current one)."""
    ptr = _pointer(path)
    if ptr is None:
        if fs.exists(path):
            raise NoCheckpoint(f"{path} is not a checkpoint: it has no {POINTER}")
        raise NoCheckpoint(f"no checkpoint at {path}")
    return fs.join(path, ptr["current"])


def previous(path: str) -> str | None:
    """The previous committed generation at ``path`` if it holds a manifest, else None."""
    ptr = _pointer(path)
    if ptr is None or not ptr.get("previous"):
        return None
    prev = fs.join(path, ptr["previous"])
    return prev if fs.exists(fs.join(prev, MANIFEST)) else None


def set_aside(path: str) -> str:
    """Point ``path`` back at its previous generation, keeping the current (damaged) one
    listed in ``kept`` so that no save removes it; returns the damaged generation's URL."""
    ptr = _pointer(path)
    if ptr is None or not ptr.get("previous"):
        raise CheckpointError(f"{path}: no previous checkpoint to fall back to")
    damaged = ptr["current"]
    ptr.update(current=ptr["previous"], previous=None, kept=[*ptr.get("kept", []), damaged])
    fs.write_bytes(fs.join(path, POINTER), json.dumps(ptr, indent=1).encode())
    return fs.join(path, damaged)
