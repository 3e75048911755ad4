"""The optimizer keys of the parameter server: which optimizer each kind of table uses, and
the optimizers' hyper-parameters (read by :meth:`angelps.table.OptimizerSpec.from_conf`).

A key module, as :mod:`angelps.options` (which lists these among its keys and re-exports
them): it imports only the standard library and :mod:`angelconf.config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from angelconf.config import Key, non_negative

__all__ = ["OPTIMIZERS", "OPTIMIZER_KEYS", "OPTIMIZER_MODULES", "OPTIMIZER_NAME_KEYS"]

#: Canonical optimizer names (lower case) and the spelling used in Angel-style conf files: the
#: built-in six, and any optimizer added by ``angelps.optimizers.registry.register``.
OPTIMIZERS: dict[str, str] = {
    "sgd": "SGD",
    "momentum": "Momentum",
    "adam": "Adam",
    "adagrad": "AdaGrad",
    "rmsprop": "RMSProp",
    "ftrl": "FTRL",
}
#: Optimizers registered outside angelps: name -> the module that registers it (imported by a
#: shard before it applies one).
OPTIMIZER_MODULES: dict[str, str] = {}


class _LiveNames(Sequence[str]):
    """The values of a name table as a key's choices, read when a value is checked (so an
    optimizer registered after this module loaded is a valid choice too)."""

    def __init__(self, table: Mapping[str, str]) -> None:
        self._table = table

    def __getitem__(self, i: Any) -> Any:
        return tuple(self._table.values())[i]

    def __len__(self) -> int:
        return len(self._table)


def _in_open_unit(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else "a number in [0, 1)"


def _positive(value: float) -> str | None:
    return None if value > 0 else "a number > 0"


_OPT_CHOICES = _LiveNames(OPTIMIZERS)

#: Keys naming a table kind's optimizer (``OptimizerSpec.from_conf(conf, name_key)``).
OPTIMIZER_NAME_KEYS = [
    Key(
        "ml.inputlayer.optimizer",
        "str",
        "Momentum",
        "Server-side optimizer of sparse input layers (linear weights): "
        "SGD, Momentum, Adam, AdaGrad, RMSProp or FTRL.",
        choices=_OPT_CHOICES,
    ),
    Key(
        "ml.embedding.optimizer",
        "str",
        "Momentum",
        "Server-side optimizer of embedding tables.",
        choices=_OPT_CHOICES,
    ),
    Key(
        "ml.fclayer.optimizer",
        "str",
        "Momentum",
        "Optimizer of dense (fully connected) layers.",
        choices=_OPT_CHOICES,
    ),
]

#: ``OptimizerSpec`` field -> the key it is read from.
OPTIMIZER_KEYS: dict[str, Key] = {
    "momentum": Key(
        "ml.opt.momentum.momentum",
        "float",
        0.9,
        "Momentum factor m: v <- m*v + g; w <- w - lr*v.",
        check=_in_open_unit,
    ),
    "beta1": Key(
        "ml.opt.adam.beta",
        "float",
        0.9,
        "Adam beta1 (decay of the first moment).",
        check=_in_open_unit,
    ),
    "beta2": Key(
        "ml.opt.adam.gamma",
        "float",
        0.99,
        "Adam beta2 (decay of the second moment).",
        check=_in_open_unit,
    ),
    "eps": Key(
        "ml.opt.adam.epsilon",
        "float",
        1e-8,
        "Adam/AdaGrad/RMSProp epsilon added to the denominator.",
        check=_positive,
    ),
    "rho": Key(
        "ml.opt.adagrad.beta",
        "float",
        0.9,
        "Decay rho of the squared-gradient average of RMSProp (what Angel calls AdaGrad).",
        check=_in_open_unit,
    ),
    "l1": Key(
        "ml.reg.l1", "float", 0.0, "L1 regularisation (proximal soft threshold).", non_negative
    ),
    "l2": Key("ml.reg.l2", "float", 0.0, "L2 regularisation.", check=non_negative),
    "ftrl_alpha": Key(
        "ml.opt.ftrl.alpha", "float", 0.1, "FTRL-Proximal alpha (per-coordinate rate).", _positive
    ),
    "ftrl_beta": Key("ml.opt.ftrl.beta", "float", 1.0, "FTRL-Proximal beta.", check=non_negative),
}
