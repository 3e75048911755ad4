"""Job configuration: typed key declarations and one loader of ``.properties`` files.

The file syntax itself is :mod:`angelconf.properties`; this module gives the entries meaning.

Precedence: built-in defaults < ``.properties`` file < repeated ``--set key=value``.

Every key is declared once, next to the code that reads it, as a :class:`Key` in a module-level
``KEYS`` list. :func:`load_config` takes the declarations, parses the file, merges the
overrides, converts types, runs each key's check and returns a read-only :class:`Config` that
remembers where every value came from. Errors are :class:`ConfigError` (a ``ValueError``) whose
message names the file and line or the key, the value and what would be valid.

This is the project's one key layer: every package declares its keys as :class:`Key` (``decay``
included), and :func:`validate` is the one conversion and check of a value, used by the loader
and by ``decay.from_conf`` on plain mappings, so a bad value reads the same wherever it is
caught: ``name=value is not valid: expected ...``. Invariant: standard library only, so the
config-only entry points and the standard-library-only ``decay`` package can import it.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angelconf.printable import printable
from angelconf.properties import ConfigError, parse_properties

__all__ = [
    "TYPES",
    "Config",
    "ConfigError",
    "Key",
    "KeyIndex",
    "at_least",
    "between",
    "format_value",
    "in_range",
    "interval",
    "load_config",
    "non_negative",
    "positive",
    "validate",
]

TYPES = ("int", "float", "bool", "str", "int_list", "float_list", "str_list")

#: Unknown keys named in one message (the rest counted); a job file with at least
#: _NOT_A_JOB entries and no known key is said to be no job file.
_LISTED = 20
_NOT_A_JOB = 10
#: Where an unknown key's error sends the user to find the valid ones.
LISTING = "`angelps conf --keys` lists every key"
_CLOSE = 0.8  # difflib's ratio for a suggestion: the likely typo, not a look-alike key

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


@dataclass(frozen=True)
class Key:
    """One configuration key: its name, type, default, a one-line doc and an optional check.

    ``check(value)`` returns ``None`` when the value is fine, else a short phrase saying what is
    valid ("an integer >= 1"). ``choices`` restricts a ``str`` key to these names (matched
    case-insensitively, stored in the declared spelling). A ``<i>`` in the name stands for a
    non-negative integer index, a ``<table>`` for a model's table name (a letter or ``_``, then
    letters, digits or ``_``). ``default=None`` means "unset": the reader decides.
    """

    name: str
    type: str
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None
    choices: Sequence[str] | None = None
    deprecated: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(
                f"key {self.name}: type {self.type!r} is not one of {', '.join(TYPES)}"
            )

    def read(self, conf: Mapping[str, Any]) -> Any:
        """This key's value in ``conf`` (a :class:`Config` or a plain mapping of typed values),
        or its declared default when ``conf`` lacks it or holds ``None``.

        The one place a default is applied outside the loader, so option objects built from a
        partial mapping (tests, the Python API) get the same defaults as a loaded job.
        """
        value = conf.get(self.name)
        return self.default if value is None else value


# --- checks ------------------------------------------------------------------------------------


def positive(value: float) -> str | None:
    """Check: value > 0."""
    return None if value > 0 else "a number > 0"


def non_negative(value: float) -> str | None:
    """Check: value >= 0."""
    return None if value >= 0 else "a number >= 0"


def at_least(low: float, what: str = "a number") -> Callable[[float], str | None]:
    """Check: value >= low; ``what`` names the kind of value ("an integer") in the message."""

    def check(value: float) -> str | None:
        return None if value >= low else f"{what} >= {low:g}"

    return check


def interval(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Callable[[float], str | None]:
    """Check: value in the interval from low to high, each end closed unless marked open;
    the message writes it as ``[0, 1)``."""
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def check(value: float) -> str | None:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        return None if above and below else f"a number in {shown}"

    return check


def between(low: float, high: float) -> Callable[[float], str | None]:
    """Check: low <= value <= high (closed interval)."""
    return interval(low, high)


def in_range(low: float, high: float) -> Callable[[float], str | None]:
    """Check: low < value < high (open interval)."""
    return interval(low, high, low_open=True, high_open=True)


# --- type conversion ---------------------------------------------------------------------------

_WHAT = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "int_list": "a comma-separated list of integers",
    "float_list": "a comma-separated list of numbers",
    "str_list": "a comma-separated list of names",
}


def _convert(key: Key, value: Any) -> Any:
    """Convert a raw string (or an already typed Python value) to the key's type."""
    t = key.type
    if value is None:
        return None
    if t == "str":
        return str(value)
    if t == "bool":
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise ValueError
    if t == "int":
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            return value
        s = str(value).strip()
        try:
            return int(s)
        except ValueError:
            f = float(s)  # accept "1e6" and "10.0" when they are whole numbers
            if f.is_integer():
                return int(f)
            raise
    if t == "float":
        if isinstance(value, bool):
            raise ValueError
        f = float(value)
        return f
    # lists
    if isinstance(value, (list, tuple)):
        items = list(value)
    else:
        s = str(value).strip()
        items = [p.strip() for p in s.split(",")] if s else []
    if t == "int_list":
        return [_convert(Key("x", "int", None, ""), v) for v in items]
    if t == "float_list":
        return [float(v) for v in items]
    return [str(v) for v in items]


def validate(key: Key, value: Any, name: str | None = None) -> Any:
    """Convert one value (a properties string or a typed value) to ``key``'s type and check it.

    Returns the typed value (``None`` stays ``None``). Raises :class:`ConfigError`
    ``"{name}={value} is not valid: expected {what is valid}"``; ``name`` defaults to the key's
    (pass the concrete name of an indexed key, ``ml.opt.decay.1.gamma``).
    """
    shown = value if isinstance(value, str) else format_value(value)
    name = name or key.name
    try:
        typed = _convert(key, value)
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(f"{name}={shown!s} is not valid: expected {_WHAT[key.type]}") from None
    if typed is None:
        return None
    if key.type == "float" and not math.isfinite(typed):  # NaN passes every comparison check
        raise ConfigError(f"{name}={shown} is not valid: expected a finite number")
    if key.choices and key.type == "str":
        match = {c.lower(): c for c in key.choices}.get(typed.lower())
        if match is None:
            hint = _did_you_mean(difflib.get_close_matches(typed, key.choices, n=3, cutoff=0.4))
            raise ConfigError(
                f"{name}={shown} is not valid: expected one of {', '.join(key.choices)}{hint}"
            )
        typed = match
    if key.check is not None:
        # A list key's check sees the whole list (e.g. "strictly increasing").
        problem = key.check(typed)
        if problem:
            raise ConfigError(f"{name}={shown} is not valid: expected {problem}")
    return typed


def _validate(key: Key, value: Any, where: str, name: str | None = None) -> Any:
    """:func:`validate`, with the message prefixed by where the value came from."""
    try:
        return validate(key, value, name)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _show_default(value: Any) -> str:
    """A default as a job file would write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


# --- key lookup --------------------------------------------------------------------------------


class KeyIndex:
    """Declarations by name: exact names plus ``<i>``/``<table>`` patterns, nearest-name
    suggestions and the error for an unknown key. A name is declared at most once."""

    def __init__(self, keys: Iterable[Key]) -> None:
        self.exact: dict[str, Key] = {}
        self.patterns: list[tuple[re.Pattern[str], Key]] = []
        for k in keys:
            if k.name in self.exact or any(k.name == p.name for _, p in self.patterns):
                raise ValueError(f"key {k.name} is declared twice")
            if "<i>" in k.name or "<table>" in k.name:
                rx = re.escape(k.name).replace("<i>", r"(\d+)")
                rx = rx.replace("<table>", r"([A-Za-z_][A-Za-z0-9_]*)")
                self.patterns.append((re.compile("^" + rx + "$"), k))
            else:
                self.exact[k.name] = k

    def find(self, name: str) -> Key | None:
        """The declaration of ``name`` (``ml.opt.decay.1.gamma`` finds ``ml.opt.decay.<i>.gamma``)."""
        k = self.exact.get(name)
        if k is not None:
            return k
        for rx, pk in self.patterns:
            if rx.match(name):
                return pk
        return None

    def all(self) -> list[Key]:
        """Every declaration, exact names first."""
        return list(self.exact.values()) + [k for _, k in self.patterns]

    def suggest(self, name: str) -> list[str]:
        """Up to three declared names close to ``name``, closest first."""
        # Indexed names are suggested with the index the user typed, when there is one.
        m = re.search(r"\.(\d+)\.", name)
        names = list(self.exact)
        for _, k in self.patterns:
            names.append(k.name.replace("<i>", m.group(1)) if m else k.name)
        # (keys are lower case: ML.LEARN.RATE is compared as ml.learn.rate, an exact match)
        by_lower = {n.lower(): n for n in names}
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=_CLOSE)
        return [by_lower[n] for n in close]

    def unknown(self, name: str, where: str = "", listing: str = LISTING) -> ConfigError:
        """The error for an undeclared ``name``: where, the closest names, where to look."""
        prefix = f"{where}: " if where else ""
        return ConfigError(
            f"{prefix}unknown key {name}{_did_you_mean(self.suggest(name))}; {listing}"
        )

    def unknown_all(self, found: Sequence[tuple[str, str]], listing: str = LISTING) -> ConfigError:
        """One error naming every undeclared (where, name) of ``found``."""
        if len(found) == 1:
            return self.unknown(found[0][1], found[0][0], listing)
        items = "; ".join(
            f"{where}: {name}{_did_you_mean(self.suggest(name)[:1])}"
            for where, name in found[:_LISTED]
        )
        more = f"; and {len(found) - _LISTED} more" if len(found) > _LISTED else ""
        return ConfigError(f"{len(found)} unknown keys: {items}{more}; {listing}")


def _did_you_mean(close: Sequence[str]) -> str:
    """ " (did you mean X? also close: Y, Z)", closest first; empty when nothing is close."""
    if not close:
        return ""
    more = f" also close: {', '.join(close[1:])}" if len(close) > 1 else ""
    return f" (did you mean {close[0]}?{more})"


# --- the typed configuration -------------------------------------------------------------------


class Config(Mapping[str, Any]):
    """A read-only, typed configuration: every declared key has a value (maybe None = unset).

    ``source(name)`` tells where a value came from: ``default``, ``<file>:<line>`` or
    ``command line``. Keys matching an indexed declaration (``ml.opt.decay.0.gamma``) are present
    only when set.
    """

    def __init__(
        self,
        values: Mapping[str, Any],
        sources: Mapping[str, str],
        keys: Sequence[Key] = (),
    ) -> None:
        self._values = dict(values)
        self._sources = dict(sources)
        self._keys = {k.name: k for k in keys}

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"configuration key {name} is not declared") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def source(self, name: str) -> str:
        """Where the value of ``name`` came from."""
        return self._sources.get(name, "default")

    def is_set(self, name: str) -> bool:
        """True when the file or the command line gave this key a value."""
        return self.source(name) != "default"

    def declarations(self) -> list[Key]:
        """Every key this configuration was loaded with."""
        return list(self._keys.values())

    def declaration(self, name: str) -> Key | None:
        """The declaration of a (non-indexed) key, when known."""
        return self._keys.get(name)

    def with_overrides(self, overrides: Mapping[str, Any], source: str = "program") -> Config:
        """A copy with some values replaced (typed and checked), marked as set by ``source``."""
        index = KeyIndex(self._keys.values()) if self._keys else None
        values = dict(self._values)
        sources = dict(self._sources)
        for name, value in overrides.items():
            key = index.find(name) if index else None
            if index is not None and key is None:
                raise index.unknown(name, "override")
            values[name] = _validate(key, value, "override", name) if key is not None else value
            sources[name] = source
        return Config(values, sources, list(self._keys.values()))

    def to_properties(self) -> dict[str, str]:
        """The values as ``.properties`` strings (None left out)."""
        return {k: format_value(v) for k, v in self._values.items() if v is not None}

    def __repr__(self) -> str:
        set_keys = {k: v for k, v in self._values.items() if self.is_set(k)}
        return f"Config({set_keys!r})"


def format_value(value: Any) -> str:
    """A typed value as it would be written in a .properties file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(format_value(v) for v in value)
    return str(value)


def _read_file(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"configuration file {path} does not exist")
    if p.is_dir():
        raise ConfigError(f"configuration file {path} is a directory, not a .properties file")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"configuration file {path} cannot be read: {e.strerror}") from None
    try:
        # (-sig: a byte-order mark, as Windows editors save, would start the first key)
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        # Java's classic Properties encoding; \uXXXX escapes carry anything else.
        return raw.decode("latin-1")


def _parse_set(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    k, v = item.split("=", 1)
    k = k.strip()
    if not k:
        raise ConfigError(f"--set {item!r}: the key is empty; expected key=value")
    return k, v.strip()


def load_config(
    path: str | os.PathLike[str] | None,
    sets: Iterable[str] | Mapping[str, Any] = (),
    keys: Iterable[Key] = (),
    *,
    listing: str = "",
) -> Config:
    """Merge defaults < file < overrides into a typed, checked :class:`Config`.

    ``sets`` is either ``["key=value", ...]`` (from repeated ``--set``) or a mapping (from the
    Python API). Unknown keys are rejected with the closest valid names, and ``listing`` (where
    the valid keys are listed; by default the CLI's list of every key).
    """
    key_list = list(keys)
    index = KeyIndex(key_list)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for k in index.exact.values():
        values[k.name] = (
            _validate(k, k.default, f"default of {k.name}") if k.default is not None else None
        )

    unknown: list[tuple[str, str]] = []  # (where, name): every one reported at once
    if path is not None:
        text = _read_file(path)
        first: dict[str, int] = {}
        for e in parse_properties(text, str(path)):
            where = f"{path}:{e.line}"
            key = index.find(e.key)
            if key is None:
                unknown.append((where, e.key))
                continue
            if e.key in first:
                # Java's Properties keeps the last silently; here it is an error (a file that
                # sets a key twice was edited by two hands, and either value may be the meant one).
                raise ConfigError(
                    f"{where}: {e.key} is given twice in this file (first at line "
                    f"{first[e.key]}): keep one (--set on the command line overrides a file)"
                )
            first[e.key] = e.line
            # An empty value in a file means "unset" where unset is nothing (a path, a list):
            # Angel's templates leave such keys empty. A key whose default is a value (a rate,
            # a model, a format) is refused: `ml.learn.rate =` trained at the default before,
            # silently, and is more likely a value lost than a default meant.
            if e.value == "":
                if key.default not in (None, ""):
                    raise ConfigError(
                        f"{where}: {e.key} has no value; give one, or remove the line to use "
                        f"the default ({_show_default(key.default)})"
                    )
                values[e.key] = (
                    _validate(key, key.default, where) if key.default is not None else None
                )
                sources[e.key] = where
                continue
            values[e.key] = _validate(key, e.value, where, e.key)
            sources[e.key] = where

    items = sets.items() if isinstance(sets, Mapping) else (_parse_set(s) for s in sets)
    for name, raw in items:
        # (the command line's --set KEY=VALUE and Angel's --KEY VALUE alike: both reach here)
        where = "command line" if not isinstance(sets, Mapping) else "override"
        key = index.find(name)
        if key is None:
            unknown.append((where, name))
            continue
        if raw is None:
            # (None read back as "unset": it dropped a file's value for the default, silently)
            raise ConfigError(
                f"{where}: {name}=None: give a value; to use the default "
                f"({_show_default(key.default) if key.default is not None else 'unset'}) "
                "leave the key out"
            )
        values[name] = _validate(key, raw, where, name)
        sources[name] = "command line" if where == "command line" else "program"
    if unknown:
        if path is not None and not first and len(unknown) >= _NOT_A_JOB:
            # (a data file given as the job: one message per line of it, unreadable)
            raise ConfigError(
                f"configuration file {path} does not look like a .properties job: none of its "
                f"{len(unknown)} entries is a known key (first: {unknown[0][0]}: "
                f"{printable(unknown[0][1][:40])}); {listing or LISTING}"
            )
        raise index.unknown_all(unknown, listing or LISTING)
    return Config(values, sources, key_list)
