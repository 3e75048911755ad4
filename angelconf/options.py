"""Option objects filled from their keys: a dataclass field names its :class:`Key`, one function
reads them all.

A typed option object (``DataOptions``, ``TrainPlan``, ``ModelConfig``, ...) declares each field
that holds one key's value as ``name: int = field(metadata=keyed(KEY))`` (or
``key_field(KEY)``, the same with the key's default as the field's); :func:`read_keys` then reads every
such field from a job configuration (``Key.read``: the value, or the declared default), converted
to the key's type and checked by the key itself (:func:`angelconf.config.validate`), so an option
object built from a plain mapping (the Python API, tests) fails with the same message as a
loaded file. The mapping from key to field is stated once, on the field, instead of in a
hand-written ``x=KEY.read(conf)`` line; values derived from several keys stay in the object's own
``from_config``. :func:`check_keys` runs the same checks on an object built directly (its
``__post_init__``), so the keys' checks are never written a second time.

Standard library and :mod:`angelconf.config` only, like the rest of the package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from angelconf.config import Key, _convert, validate

__all__ = ["check_keys", "key_field", "keyed", "keyed_fields", "read_keys"]

_KEY = "key"
_CONVERT = "convert"


def keyed(key: Key, convert: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """The metadata of a dataclass field that holds ``key``'s value:
    ``epochs: int = field(metadata=keyed(EPOCHS))``. ``convert`` turns the key's typed value
    into the field's (a list into a tuple, "" into None)."""
    return {_KEY: key, _CONVERT: convert}


def key_field(key: Key, *, convert: Callable[[Any], Any] | None = None) -> Any:
    """A dataclass field that holds ``key``'s value and defaults to the key's declared default,
    for option objects that may be built directly (the default still lives only in the key)."""
    metadata = keyed(key, convert)
    default = convert_default(key, convert)
    if isinstance(default, (dict, list, set)):  # a mutable default: one per object
        return dataclasses.field(
            default_factory=lambda: convert_default(key, convert), metadata=metadata
        )
    return dataclasses.field(default=default, metadata=metadata)


def convert_default(key: Key, convert: Callable[[Any], Any] | None) -> Any:
    """``key``'s declared default, converted to the field's type."""
    return key.default if convert is None else convert(key.default)


def keyed_fields(cls: Any) -> Iterator[tuple[str, Key, Callable[[Any], Any] | None]]:
    """``(field name, key, convert)`` of every field of the dataclass ``cls`` that names a key."""
    for f in dataclasses.fields(cls):
        key = f.metadata.get(_KEY)
        if key is not None:
            yield f.name, key, f.metadata.get(_CONVERT)


def read_keys(cls: Any, conf: Mapping[str, Any], *, check: bool = True) -> dict[str, Any]:
    """The values of ``cls``'s keyed fields in ``conf`` (a loaded Config, or a plain mapping of
    typed values where an absent or None key takes its declared default), by field name.

    Each value is converted to its key's type and, with ``check``, checked by its key: a
    :class:`ConfigError` naming the key, the value and what is valid (``ml.data.type=csv is not
    valid: expected one of ...``). ``check=False`` for an object whose own ``__post_init__``
    states the checks in its own words (a value of the wrong type still fails as the key says).
    """
    out: dict[str, Any] = {}
    for name, key, convert in keyed_fields(cls):
        value = key.read(conf)
        if check:
            value = validate(key, value)
        else:
            try:
                value = _convert(key, value)
            except (ValueError, TypeError, OverflowError):
                validate(key, value)  # raises the key's own message
                raise
        out[name] = value if convert is None else convert(value)
    return out


def check_keys(obj: Any) -> None:
    """Check every keyed field of the dataclass instance ``obj`` with its key (a ``__post_init__``
    of an object that may be built directly); a field without a ``convert`` takes the key's
    spelling of its value (a choice matched case-insensitively: ``Dummy`` -> ``dummy``)."""
    for name, key, convert in keyed_fields(type(obj)):
        value = getattr(obj, name)
        if value is None:
            continue
        typed = validate(key, list(value) if isinstance(value, tuple) else value)
        if convert is None and typed != value:
            object.__setattr__(obj, name, typed)
