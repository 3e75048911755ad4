"""A schedule per table: ``ml.opt.decay.<table>.*`` and ``ml.learn.rate.<table>``; and the
job's own (:func:`job_schedule`).

Any of these keys set gives the table a schedule of its own (the job's schedule drives every
other table). Unset values fall back to the global keys: a table that sets only
``ml.learn.rate.embedding`` runs the job's schedule from its own rate; one that sets
``ml.opt.decay.<table>.class.name`` runs that schedule with its own parameters only (none of the
global schedule's, which belong to another class). ``<table>`` is a table's name as the start
screen lists it; ``dense`` stands for the worker-side dense layers (and, with
``angel.dense.placement=ps``, for every ``dense.*`` table). A table's own schedule cannot be a
SequentialLR or ChainedScheduler (their children's keys are global).
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import decay
from angelconf.config import ConfigError, KeyIndex, format_value
from decay import StepSizeScheduler
from decay.keys import CLASS_KEY, KEYS, LR_KEY, PREFIX, TABLE_LR_KEY
from decay.registry import COMPOSITE, schedule_class
from learners.models.angel_json import set_by_angel_json

__all__ = ["DENSE", "job_schedule", "table_keys", "table_names", "table_schedules"]

#: The name that stands for the worker-side dense layers (and the PS's ``dense.*`` tables).
DENSE = "dense"
_INDEX = KeyIndex(KEYS)
_TABLE_KEY = re.compile(r"^ml\.opt\.decay\.([A-Za-z_][A-Za-z0-9_]*)\.(.+)$")


def _is_set(conf: Mapping[str, Any], key: str) -> bool:
    is_set = getattr(conf, "is_set", None)
    if callable(is_set):
        try:
            return bool(is_set(key))
        except KeyError:
            return False
    return conf.get(key) is not None


def table_keys(conf: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """For each table with keys of its own: global key -> the table's key, for each one set."""
    out: dict[str, dict[str, str]] = {}
    for key in conf:
        declared = _INDEX.find(key) if isinstance(key, str) else None
        if declared is None or "<table>" not in declared.name or not _is_set(conf, key):
            continue
        if declared.name == TABLE_LR_KEY.name:
            table, glob = key[len(LR_KEY) + 1 :], LR_KEY
        else:
            m = _TABLE_KEY.match(key)
            assert m is not None  # the declaration's pattern matched it
            table, glob = m.group(1), PREFIX + m.group(2)
        out.setdefault(table, {})[glob] = key
    return out


def table_names(tables: Sequence[str], dense_layers: bool) -> list[str]:
    """The names a per-table key may use: the PS tables (``dense.*`` ones as ``dense``) and
    ``dense`` for worker-side dense layers."""
    names = [t for t in tables if not t.startswith(DENSE + ".")]
    if dense_layers or len(names) < len(tables):
        names.append(DENSE)
    return names


def _view(conf: Mapping[str, Any], own: Mapping[str, str]) -> dict[str, Any]:
    """The configuration the table's schedule is built from: its keys in the global names,
    over the global ones (only the rate when the table names a class of its own)."""
    view: dict[str, Any] = {LR_KEY: conf.get(LR_KEY)}
    if CLASS_KEY not in own:
        for key in conf:
            if (
                isinstance(key, str)
                and (key.startswith(PREFIX) or key == "ml.learn.decay")
                and _is_set(conf, key)
                and "<table>" not in getattr(_INDEX.find(key), "name", "<table>")
            ):
                view[key] = conf[key]
    for glob, key in own.items():
        view[glob] = conf[key]
    return view


def _own_names(text: str, table: str, own: Mapping[str, str]) -> str:
    """``text`` (from decay.from_conf) with the table's key names in place of the global ones."""
    if CLASS_KEY in own:  # every schedule key is the table's
        text = re.sub(r"\bml\.opt\.decay\.(?=[a-z])", f"ml.opt.decay.{table}.", text)
        if LR_KEY in own:
            text = re.sub(r"\bml\.learn\.rate\b(?!\.)", own[LR_KEY], text)
        return text
    for glob in sorted(own, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.]){re.escape(glob)}(?![\w.])", own[glob], text)
    return text


def _build(
    conf: Mapping[str, Any], table: str, own: Mapping[str, str], total: int
) -> StepSizeScheduler:
    if CLASS_KEY in own:
        name = conf[own[CLASS_KEY]]
        if schedule_class(str(name), own[CLASS_KEY]) in COMPOSITE:
            raise ConfigError(
                f"{own[CLASS_KEY]}={name}: a table's own schedule cannot be {name} (its "
                f"children's keys {PREFIX}<i>.* are the job's); give the job that schedule"
            )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sched = decay.from_conf(_view(conf, own), total_steps=total)
        except ValueError as e:  # ConfigError included: a bad value or parameter
            raise ConfigError(_own_names(str(e), table, own)) from None
    for w in caught:
        if isinstance(w.message, decay.UnusedDecayKeys):
            # the job's keys were reported by the job's own schedule; report the table's only
            keys = [own[k] for k in w.message.keys if k in own]
            if keys:
                warnings.warn(decay.UnusedDecayKeys(keys, w.message.schedule), stacklevel=3)
            continue
        warnings.warn(str(w.message), w.category, stacklevel=3)
    return sched


def table_schedules(
    conf: Mapping[str, Any], tables: Sequence[str], total: int, dense_layers: bool | None = False
) -> dict[str, StepSizeScheduler]:
    """The tables with a schedule of their own, each built as the job's is (``total``: the
    length the job's schedule is told). ConfigError naming the key for an unknown table.
    ``dense_layers``: whether the model has worker-side dense layers (None: not known yet,
    ``dense`` is accepted and left to the check made once the model is built)."""
    keys = table_keys(conf)
    valid = table_names(tables, bool(dense_layers))
    for table, own in keys.items():
        if table not in valid and not (dense_layers is None and table == DENSE):
            raise ConfigError(
                f"{sorted(own.values())[0]}: this model has no table {table!r}; valid table "
                f"names: {', '.join(valid)}"
            )
    return {t: _build(conf, t, own, total) for t, own in sorted(keys.items())}


def job_schedule(conf: Mapping[str, Any], total: int) -> StepSizeScheduler:
    """The job's schedule (:func:`decay.from_conf`; the ``schedule`` verb's too). Of its keys
    set but not used, those an Angel JSON's ``train`` block set get one note line each rather
    than a warning: Angel's documented JSONs set ``decaybeta`` for StandardDecay, which
    ignored it there too, and a JSON pasted as documented should not warn on every run."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched = decay.from_conf(conf, total_steps=total)
    for w in caught:
        if not isinstance(w.message, decay.UnusedDecayKeys):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            continue
        from_json = [k for k in w.message.keys if set_by_angel_json(conf, k)]
        for key in from_json:
            where = getattr(conf, "source")(key)  # noqa: B009 (set by a JSON: a Config)
            print(
                f"angelps: note: {key}={format_value(conf[key])} ({where}) is not "
                f"used by {w.message.schedule} (nor was it by Angel's)",
                file=sys.stderr,
            )
        rest = [k for k in w.message.keys if k not in from_json]
        if rest:
            warnings.warn(decay.UnusedDecayKeys(rest, w.message.schedule), stacklevel=3)
    return sched
