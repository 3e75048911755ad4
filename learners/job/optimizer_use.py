"""Which optimizer keys a job's tables read, and the ones set that none does.

A table's optimizer comes from its role's key (``ml.inputlayer.optimizer``,
``ml.embedding.optimizer``, ``ml.fclayer.optimizer`` for the dense layers) and reads some of
the ``ml.opt.*`` and ``ml.reg.*`` keys (``Optimizer.reads``): Momentum, the default, has no L1,
so ``ml.reg.l1`` beside it trains as if unset; ``ml.opt.adam.beta`` does nothing without Adam;
``ml.embedding.optimizer`` does nothing on LogisticRegression, which has no embedding. Such a
key is said once, before the job starts (:func:`unused_optimizer_keys`), as a model key the
model does not read is (``learners.models.config.unused_model_keys``).

Not checked: a JSON graph's job (each layer may name its own optimizer and its parameters), and
an optimizer registered without ``reads``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from angelconf.config import ConfigError, format_value
from angelps.optimizer_keys import OPTIMIZER_KEYS, OPTIMIZERS
from angelps.optimizers.registry import optimizer_for
from learners.models.angel_json import GRAPH_MODEL
from learners.models.config import HIDDEN_LAYERS, ModelConfig, job_model_info
from learners.models.tables import model_tables

__all__ = ["unused_optimizer_keys"]

#: The roles with an optimizer key of their own (``ml.<role>.optimizer``).
_ROLES = ("inputlayer", "embedding", "fclayer")


def _roles(conf: Mapping[str, Any]) -> set[str] | None:
    """The roles of the model's tables and layers; None where that is not known here."""
    entry = job_model_info(conf)
    if entry.name == GRAPH_MODEL or entry.reads is None:
        return None
    try:
        fields = int(conf["ml.fm.field.num"])
        n = max(1, int(conf["ml.feature.index.range"]))
        decls = model_tables(ModelConfig.from_config(conf, n, fields if fields > 0 else 1))
    except (ConfigError, ValueError):
        return None  # (the job's own checks report it)
    roles = {d.role for d in decls}
    if HIDDEN_LAYERS.name in entry.reads:  # (an MLP: its layers take ml.fclayer.optimizer)
        roles.add("fclayer")
    return roles


def unused_optimizer_keys(conf: Mapping[str, Any]) -> list[str]:
    """One line for each optimizer key set in ``conf`` that no optimizer of the job reads:
    a hyper-parameter of an optimizer no table uses (``ml.reg.l1`` beside Momentum), or the
    optimizer of a role the model has no table of. Empty for a plain mapping (which keys were
    set is not known) and where the job's optimizers are not known here (module doc)."""
    is_set, source = getattr(conf, "is_set", None), getattr(conf, "source", None)
    if is_set is None or source is None:
        return []
    roles = _roles(conf)
    if roles is None:
        return []
    used: dict[str, set[str]] = {}  # field -> the optimizer keys of the roles that read it
    chosen = []
    unapplied: set[str] = set()  # fields the dense layers' optimizer has, but not on workers
    for role in [r for r in _ROLES if r in roles]:
        role_key = f"ml.{role}.optimizer"
        try:
            opt = optimizer_for(str(conf[role_key]))
        except ValueError:
            return []  # (the job's own checks report it)
        if opt.reads is None:
            return []
        dense_on_workers = (
            role == "fclayer" and conf.get("angel.dense.placement", "worker") == "worker"
        )
        # (the workers' dense layers run torch.optim's semantics: no L1)
        reads = set(opt.reads) - ({"l1"} if dense_on_workers else set())
        unapplied |= set(opt.reads) - reads
        chosen.append(f"{role_key}={opt.display}")
        for field in reads:
            used.setdefault(field, set()).add(role_key)

    def shown(name: str) -> str:
        return f"{name}={format_value(conf[name])} ({source(name)})"

    out = []
    for role in _ROLES:
        name = f"ml.{role}.optimizer"
        if role not in roles and name in conf and is_set(name):
            out.append(
                f"{shown(name)}: set but not used: {job_model_info(conf).name} has no "
                f"{role} tables or layers"
            )
    for field, key in OPTIMIZER_KEYS.items():
        if field in used or key.name not in conf or not is_set(key.name):
            continue
        readers = []
        for name, display in OPTIMIZERS.items():
            theirs = optimizer_for(name).reads
            if theirs is not None and field in theirs:
                readers.append(display)
        dense = (
            "; the dense layers on the workers (angel.dense.placement=worker) do not apply it"
            if field in unapplied
            else ""
        )
        out.append(
            f"{shown(key.name)}: set but not used by the job's optimizers "
            f"({', '.join(chosen)}); it is read by {', '.join(readers)}{dense}"
        )
    return out
