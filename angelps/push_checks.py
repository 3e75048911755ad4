"""The checks a push and a pull go through, in one module the client and the shard both import.

Where they run (each call is validated once on each side of a trust boundary):

* the client (:class:`angelps.client.ps_client.PSClient`) checks what the user hands it (tables,
  key ranges, shapes, dtypes, finiteness, the step) before anything leaves the worker, so a bad
  push is refused whole, on every shard at once; the calls it builds are marked
  :attr:`angelps.step_call.StepCall.checked` and the shard does not check them again (they
  arrive as Ray actor calls from the job's own clients);
* the shard (:class:`angelps.server.shard.ParameterShard`) checks every call that is not marked:
  a call decoded from the network (:mod:`angelps.client.wire` never carries the mark), or a
  direct use of the plain class. A refused push leaves the shard unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from angelps.rates import Step, StepRates
from angelps.table import TableSpec

__all__ = ["all_finite", "check_grads", "check_keys", "check_lr", "check_push"]


def all_finite(a: np.ndarray) -> bool:
    """No NaN or inf in ``a``. A finite sum proves it without a boolean temporary (NaN and inf
    propagate through a sum); only a non-finite sum, which may be an overflow, is checked
    element by element."""
    if a.size == 0:
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        total = a.sum(dtype=np.float64)
    if np.isfinite(total):
        return True
    return bool(np.isfinite(a).all())


def check_lr(lr: Any) -> Step:
    """The step of a push: a finite number >= 0, or :class:`~angelps.rates.StepRates` (checked
    when built)."""
    if isinstance(lr, StepRates):
        return lr
    try:
        value = float(lr)
    except (TypeError, ValueError):
        raise ValueError(f"learning rate {lr!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"learning rate {lr!r} must be a finite number >= 0")
    return value


def check_keys(spec: TableSpec, keys: ArrayLike) -> np.ndarray:
    """Keys as a 1-D int64 array, checked against the table's range."""
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(f"table {spec.name!r}: keys must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise ValueError(f"table {spec.name!r}: keys must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 2**63:
        raise ValueError(f"table {spec.name!r}: key {int(arr.max())} does not fit in int64")
    arr = arr.astype(np.int64, copy=False)
    if spec.rows > 0 and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= spec.rows:
            bad = lo if lo < 0 else hi
            kind = "sparse index" if spec.sparse else "dense"
            raise ValueError(
                f"table {spec.name!r}: key {bad} is outside the {kind} range [0, {spec.rows})"
            )
    return arr


def check_grads(spec: TableSpec, n: int, grads: ArrayLike) -> np.ndarray:
    """Gradients as a ``[n, cols]`` array of the table's dtype."""
    arr = np.asarray(grads)
    if arr.dtype.kind != "f":
        raise ValueError(
            f"table {spec.name!r}: gradients must be floating point, got dtype {arr.dtype}"
        )
    if arr.ndim == 1 and spec.cols == 1:
        arr = arr.reshape(-1, 1)
    if arr.shape != (n, spec.cols):
        raise ValueError(
            f"table {spec.name!r}: gradients of shape {arr.shape} do not match "
            f"{n} keys x {spec.cols} columns"
        )
    return arr.astype(spec.dtype, copy=False)


def check_push(
    spec: TableSpec,
    keys: ArrayLike,
    grads: ArrayLike,
    nan_policy: str,
    check_owned: Callable[[np.ndarray], None] | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Keys and gradients of one table's push, checked (``check_owned``: the shard's check
    that it holds the keys); None when the gradients are not finite and ``nan_policy`` is
    skip (ValueError when it is error)."""
    k = check_keys(spec, keys)
    if check_owned is not None:
        check_owned(k)
    g = check_grads(spec, len(k), grads)
    if all_finite(g):
        return k, g
    if nan_policy == "error":
        raise ValueError(
            f"table {spec.name!r}: gradient contains NaN or inf "
            f"(angel.ps.nan.policy=error; set it to skip to drop such updates)"
        )
    return None
