"""Lazy package faces (PEP 562): a package names its public objects without importing them.

A package's ``__init__`` maps each public name to the module that defines it and installs
``__getattr__ = lazy_exports(__name__, EXPORTS, globals())``: the module is imported on first
use and the object cached in the package. So ``import angelconf.config`` (the key layer, shared
with the standard-library-only ``decay``) or ``import learners.job.loop_options`` (keys read by the
config-only CLI verbs) loads no numpy, torch or Ray. Standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``exports`` maps a public name to its module."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    return __getattr__
