"""Table and optimizer specifications, and the deterministic row initializers.

A table (Angel's "matrix") is declared by a small frozen :class:`TableSpec`: a dense table has
``rows`` rows addressed ``0 .. rows-1``; a sparse table takes any int64 key (hashed feature ids)
and creates a row on first touch. Every row, dense or sparse, is initialised from
``hash(seed, key, column)`` alone, so its first value never depends on which shard holds it, how
many shards there are, or when it was first touched.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

import numpy as np

from angelps.optimizer_keys import (
    OPTIMIZER_KEYS,
    OPTIMIZER_MODULES,
    OPTIMIZER_NAME_KEYS,
    OPTIMIZERS,
)

__all__ = [
    "INITIALIZERS",
    "OptimizerSpec",
    "TableSpec",
    "check_unique_names",
    "init_rows",
    "mix64",
    "table_named",
]

INITIALIZERS = ("zeros", "normal", "uniform", "constant")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class OptimizerSpec:
    """A server-side optimizer and its hyper-parameters (see :mod:`angelps.optim` for formulas).

    ``name`` is one of sgd, momentum, adam, adagrad, rmsprop, ftrl (any case). Angel's "AdaGrad"
    is really RMSProp: its behaviour is ``rmsprop`` here, and ``adagrad`` is the classic AdaGrad
    of torch.optim. The step size is not part of the spec: it arrives with every push.
    """

    name: str = "sgd"
    # Hyper-parameters default to their keys' declared defaults (angelps.options).
    l1: float = OPTIMIZER_KEYS["l1"].default
    l2: float = OPTIMIZER_KEYS["l2"].default
    momentum: float = OPTIMIZER_KEYS["momentum"].default
    beta1: float = OPTIMIZER_KEYS["beta1"].default
    beta2: float = OPTIMIZER_KEYS["beta2"].default
    eps: float = OPTIMIZER_KEYS["eps"].default
    rho: float = OPTIMIZER_KEYS["rho"].default
    ftrl_alpha: float = OPTIMIZER_KEYS["ftrl_alpha"].default
    ftrl_beta: float = OPTIMIZER_KEYS["ftrl_beta"].default
    #: The module that registers an optimizer added outside angelps (set from the registry):
    #: another process (a shard) imports it before applying the optimizer. "" for built-ins.
    impl: str = ""

    def __post_init__(self) -> None:
        canon = str(self.name).strip().lower()
        if canon not in OPTIMIZERS and self.impl:
            importlib.import_module(self.impl)  # a spec read back in another process
        if canon not in OPTIMIZERS:
            raise ValueError(
                f"unknown optimizer {self.name!r}; valid names: {', '.join(OPTIMIZERS.values())}"
            )
        object.__setattr__(self, "name", canon)
        object.__setattr__(self, "impl", self.impl or OPTIMIZER_MODULES.get(canon, ""))
        for f in fields(self):
            if f.name in ("name", "impl"):
                continue
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"optimizer {canon}: {f.name}={v!r} is not a finite number")
            object.__setattr__(self, f.name, float(v))
        for name in ("l1", "l2", "ftrl_beta"):
            if getattr(self, name) < 0:
                raise ValueError(f"optimizer {canon}: {name}={getattr(self, name)} must be >= 0")
        for name in ("momentum", "beta1", "beta2", "rho"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(
                    f"optimizer {canon}: {name}={getattr(self, name)} must be in [0, 1)"
                )
        for name in ("eps", "ftrl_alpha"):
            if getattr(self, name) <= 0:
                raise ValueError(f"optimizer {canon}: {name}={getattr(self, name)} must be > 0")

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any], name_key: str) -> OptimizerSpec:
        """Build from Angel's keys: ``conf[name_key]`` names the optimizer (one of the
        ``ml.*.optimizer`` keys, e.g. ``ml.embedding.optimizer``); hyper-parameters come from
        ``ml.opt.*`` and ``ml.reg.*``. Keys absent from ``conf`` take their declared defaults."""
        names = {k.name: k for k in OPTIMIZER_NAME_KEYS}
        if name_key not in names:
            raise ValueError(f"{name_key!r} is not one of {', '.join(names)}")
        params = {field_name: key.read(conf) for field_name, key in OPTIMIZER_KEYS.items()}
        return cls(name=names[name_key].read(conf), **params)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for checkpoint manifests; ``impl`` only when set)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if not d["impl"]:
            del d["impl"]
        return d


@dataclass(frozen=True)
class TableSpec:
    """One parameter table.

    ``rows``: for a dense table the number of rows (keys ``0 .. rows-1``); for a sparse table -1
    (any int64 key) or an index range ``[0, rows)`` that keys must fall in (used by the range
    partitioner). ``init``: zeros | normal (std ``init_std``) | uniform (``[-init_std,
    init_std)``) | constant (every value ``init_std``), drawn from ``hash(seed, key, column)``.
    """

    name: str
    rows: int
    cols: int = 1
    dtype: str = "float32"
    sparse: bool = False
    init: str = "normal"
    init_std: float = 1e-4
    seed: int = 0
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"table name must be a non-empty string, got {self.name!r}")
        where = f"table {self.name!r}"
        if not isinstance(self.rows, (int, np.integer)) or isinstance(self.rows, bool):
            raise ValueError(f"{where}: rows={self.rows!r} must be an integer")
        if self.sparse:
            if self.rows != -1 and self.rows < 1:
                raise ValueError(f"{where}: rows={self.rows} must be -1 (any key) or >= 1")
        elif self.rows < 1:
            raise ValueError(f"{where}: a dense table needs rows >= 1, got {self.rows}")
        if not isinstance(self.cols, (int, np.integer)) or self.cols < 1:
            raise ValueError(f"{where}: cols={self.cols!r} must be an integer >= 1")
        object.__setattr__(self, "rows", int(self.rows))
        object.__setattr__(self, "cols", int(self.cols))
        dtype = str(np.dtype(self.dtype)) if self.dtype in DTYPES else str(self.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"{where}: dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        object.__setattr__(self, "dtype", dtype)
        init = str(self.init).lower()
        if init not in INITIALIZERS:
            raise ValueError(f"{where}: init={self.init!r} is not one of {', '.join(INITIALIZERS)}")
        object.__setattr__(self, "init", init)
        if not np.isfinite(self.init_std) or (init in ("normal", "uniform") and self.init_std < 0):
            raise ValueError(f"{where}: init_std={self.init_std!r} must be a finite number >= 0")
        object.__setattr__(self, "init_std", float(self.init_std))
        object.__setattr__(self, "seed", int(self.seed))
        if not isinstance(self.optimizer, OptimizerSpec):
            raise ValueError(f"{where}: optimizer must be an OptimizerSpec")

    def with_optimizer(self, optimizer: OptimizerSpec) -> TableSpec:
        """A copy with another optimizer."""
        return replace(self, optimizer=optimizer)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for checkpoint manifests)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "optimizer"}
        d["optimizer"] = self.optimizer.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableSpec:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["optimizer"] = OptimizerSpec(**d.get("optimizer", {}))
        return cls(**d)


# --- deterministic initialisation --------------------------------------------------------------

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, vectorised over a uint64 array (wrapping arithmetic).

    A bijection of 64-bit integers with good avalanche; used for row initialisation and hash
    partitioning so that both are pure functions of the key.
    """
    x = x ^ (x >> np.uint64(30))
    x = x * _C1
    x = x ^ (x >> np.uint64(27))
    x = x * _C2
    return x ^ (x >> np.uint64(31))


def _uniform01(seed: int, keys: np.ndarray, cols: int, stream: int) -> np.ndarray:
    """float64 in [0, 1), shape [len(keys), cols], a pure function of (seed, stream, key, col)."""
    base = np.uint64((seed * 2 + stream) & 0xFFFFFFFFFFFFFFFF)
    k = mix64(keys.astype(np.int64, copy=False).view(np.uint64) ^ mix64(np.asarray([base]))[0])
    c = np.arange(1, cols + 1, dtype=np.uint64) * _GOLDEN
    bits = mix64(k[:, None] + c[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def init_rows(spec: TableSpec, keys: np.ndarray) -> np.ndarray:
    """Initial values of the rows ``keys`` of ``spec``, shape ``[len(keys), spec.cols]``.

    Deterministic: the value of (key, column) depends only on the table's init, init_std and
    seed. normal uses Box-Muller on two independent hash streams.
    """
    n, cols = len(keys), spec.cols
    dtype = np.dtype(spec.dtype)
    if spec.init == "zeros" or n == 0:
        return np.zeros((n, cols), dtype=dtype)
    if spec.init == "constant":
        return np.full((n, cols), spec.init_std, dtype=dtype)
    if spec.init == "uniform":
        u = _uniform01(spec.seed, keys, cols, 0)
        return ((2.0 * u - 1.0) * spec.init_std).astype(dtype)
    u1 = _uniform01(spec.seed, keys, cols, 0)
    u2 = _uniform01(spec.seed, keys, cols, 1)
    z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return (z * spec.init_std).astype(dtype)


def check_unique_names(tables: Sequence[TableSpec]) -> None:
    """Table names identify tables on the shards and in checkpoints: no two may be equal."""
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"table names must be unique, got {names}")


T = TypeVar("T")


def table_named(tables: Mapping[str, T], name: str) -> T:
    """``tables[name]``, or a ValueError that names the tables there are."""
    try:
        return tables[name]
    except KeyError:
        raise ValueError(
            f"unknown table {name!r}; tables: {', '.join(sorted(tables)) or '(none)'}"
        ) from None
