"""Every declared configuration key of the project, gathered for the loader and the docs.

A module declares the keys it reads as a module-level ``KEYS`` list (``angelps.config.Key``, or
``decay.registry.Param`` in the standard-library-only ``decay`` package). This module finds them
by importing every module of ``angelps`` and ``learners``, so a new module's keys cannot be
forgotten here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from functools import lru_cache

import angelps
import decay
import learners
from angelps.config import KeyLike

# Entry-point modules have no keys and would import back into this one.
_SKIP = {"angelps.__main__", "angelps.cli"}


@lru_cache(maxsize=1)
def key_groups() -> tuple[tuple[str, tuple[KeyLike, ...]], ...]:
    """(module title, keys) for every module that declares keys, in a stable order."""
    groups: list[tuple[str, tuple[KeyLike, ...]]] = [("decay", tuple(decay.KEYS))]
    for pkg in (angelps, learners):
        for info in sorted(
            pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."), key=lambda i: i.name
        ):
            if info.name in _SKIP:
                continue
            module = importlib.import_module(info.name)
            keys = getattr(module, "KEYS", None)
            if keys:
                groups.append((info.name, tuple(keys)))
    return tuple(groups)


def all_keys() -> Sequence[KeyLike]:
    """Every declared key, each once."""
    return [k for _, keys in key_groups() for k in keys]
