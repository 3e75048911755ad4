"""The optimizer registry: every optimizer by name, the built-in six first.

:func:`register` adds an :class:`~angelps.optimizers.base.Optimizer` (a new file with its
class, plus one call): its name becomes valid for the ``ml.*.optimizer`` keys and
``OptimizerSpec``, and the shards, the workers' dense layers and tables held by workers all
run it through :func:`optimizer_for`. A spec of an optimizer registered outside this package
names the registering module (``OptimizerSpec.impl``), so a shard in another process imports
it before its first update.
"""

from __future__ import annotations

import importlib

from angelps.optimizer_keys import OPTIMIZER_MODULES, OPTIMIZERS
from angelps.optimizers.base import Optimizer
from angelps.optimizers.builtin import BUILTIN
from angelps.table import OptimizerSpec

__all__ = ["optimizer_for", "register", "unregister"]

_BY_NAME: dict[str, Optimizer] = {}


def register(opt: Optimizer, module: str | None = None) -> Optimizer:
    """Add ``opt`` under ``opt.name`` (lower case; a taken name is an error). ``module``: the
    module that registers it (default: its class's), imported by other processes on use."""
    name = opt.name.strip().lower()
    if not name or name != opt.name:
        raise ValueError(f"optimizer registry: name {opt.name!r} must be lower case, non-empty")
    if name in _BY_NAME:
        raise ValueError(f"optimizer registry: {name!r} is already registered")
    _BY_NAME[name] = opt
    OPTIMIZERS[name] = opt.display or opt.name
    mod = module or type(opt).__module__
    if not mod.startswith("angelps.optimizers."):
        OPTIMIZER_MODULES[name] = mod
    return opt


def unregister(name: str) -> None:
    """Remove an optimizer registered outside angelps (the built-in six stay)."""
    if name in OPTIMIZER_MODULES:
        del _BY_NAME[name], OPTIMIZERS[name], OPTIMIZER_MODULES[name]


def optimizer_for(spec: OptimizerSpec | str) -> Optimizer:
    """The optimizer of ``spec`` (or of a name); a spec naming its module loads it first."""
    name = spec if isinstance(spec, str) else spec.name
    opt = _BY_NAME.get(name.lower())
    if opt is None and isinstance(spec, OptimizerSpec) and spec.impl:
        importlib.import_module(spec.impl)  # registers it
        opt = _BY_NAME.get(name.lower())
    if opt is None:
        raise ValueError(
            f"unknown optimizer {name!r}; valid names: {', '.join(OPTIMIZERS.values())}"
        )
    return opt


for _opt in BUILTIN:
    register(_opt)
