"""Every declared configuration key of the project, gathered for the loader and the docs.

A key module declares the keys it reads as a module-level ``KEYS`` list and imports only the
standard library and ``angelconf.config``. This module imports exactly the key modules listed in
:data:`KEY_MODULES`, so gathering the keys (``angelps conf``, ``angelps schedule``) loads
neither torch nor Ray nor numpy. A new key module is added to that list.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import lru_cache

from angelconf.config import Key

__all__ = ["KEY_MODULES", "all_keys", "key_groups"]

#: The key modules, in the order of the docs (docs/config.md): each module's ``KEYS``.
KEY_MODULES = (
    "decay",
    "angelps.options",
    "learners.job.loop_options",
    "learners.job.save_keys",
    "learners.job.sparse_keys",
    "learners.worker.feed",
    "learners.job.action",
    "learners.runs.progress",
    "learners.models.config",
    "learners.models.angel_json",
    "learners.data.options",
    "learners.angel_keys",
)


@lru_cache(maxsize=1)
def key_groups() -> tuple[tuple[str, tuple[Key, ...]], ...]:
    """(module name, keys) for every key module, in :data:`KEY_MODULES` order."""
    return tuple((name, tuple(importlib.import_module(name).KEYS)) for name in KEY_MODULES)


def all_keys() -> Sequence[Key]:
    """Every declared key, each once."""
    return [k for _, keys in key_groups() for k in keys]
