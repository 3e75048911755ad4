"""Why a text line does not match its format: the first wrong field, in words.

The text parser tells good lines from bad ones with one regular expression per line
(:mod:`learners.data.text`); for a bad line, :func:`why_bad` finds the field that breaks the
format and says what is wrong with it ("feature id -3 is negative (libsvm ids start at 1)"), so
the message names the problem and not only the shape the line should have. It runs on bad lines
only (a Python loop over them is fine) and returns None when it cannot tell, in which case the
message gives the expected shape alone.
"""

from __future__ import annotations

import re

__all__ = ["why_bad"]

_NUM = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_INT = re.compile(r"\d+")
_NEG_INT = re.compile(r"-\d+")
_BASE = {"libsvm": 1, "dummy": 0}
_NOT_TEXT = "the line holds control characters or non-ASCII bytes (binary data?)"


def _number(token: str, what: str) -> str | None:
    """What is wrong with ``token`` as a number, or None."""
    if _NUM.fullmatch(token):
        return None
    if _NON_FINITE.fullmatch(token):
        return f"{what} is '{token}', not a finite number"
    return f"{what} is '{token}', not a number"


def _feature_id(token: str, kind: str, index_range: int = -1) -> str | None:
    """What is wrong with ``token`` as a feature id of ``kind``, or None."""
    if _INT.fullmatch(token):
        return None
    if kind == "dummy" and token != "":
        below = f" below ml.feature.index.range={index_range}" if index_range > 0 else ""
        return f"feature id '{token}' is not a valid dummy id (a non-negative integer{below})"
    if _NEG_INT.fullmatch(token):
        return f"feature id {token} is negative ({kind} ids start at {_BASE[kind]})"
    if token == "":
        return "a feature has no id"
    return f"feature id '{token}' is not an integer"


def _feature(token: str, kind: str, index_range: int = -1) -> str | None:
    """What is wrong with one feature token of ``kind``, or None."""
    if token == "":
        return "an empty field (two separators in a row)"
    if kind == "dense":
        return _number(token, "a value")
    if kind == "dummy":
        if ":" in token:
            return f"feature '{token}' is not an id (dummy lines hold ids without values)"
        return _feature_id(token, kind, index_range)
    if ":" not in token:
        return f"feature '{token}' has no ':<value>'"
    fid, _, value = token.partition(":")
    if value == "":
        return f"feature '{token}' has no value"
    return _feature_id(fid, kind) or _number(value, f"the value of feature {fid}")


def _fields(line: str, sep: str, whitespace: bool) -> list[str]:
    if whitespace:
        return line.split()
    fields = re.split(sep, line.strip())
    # Java's String.split drops trailing empty fields, as the format's regular expression does.
    while fields and fields[-1] == "":
        fields.pop()
    return fields


def why_bad(
    raw: bytes,
    kind: str,
    has_label: bool,
    sep: str,
    whitespace: bool,
    *,
    sid: bool = False,
    index_range: int = -1,
) -> str | None:
    """The first problem of a line (its bytes) that failed its format's regular expression, or
    None; ``sep`` is the regular expression between fields, ``whitespace`` whether fields are
    separated by whitespace only. ``sid``: the line's sample id is already cut off (a label
    that is not a number is then not a sample id); ``index_range``: ml.feature.index.range
    (<= 0: not set)."""
    body = raw.decode("latin-1").rstrip("\r\n")
    if not body.isascii() or any(c < " " and c not in "\t\r\f\v" for c in body):
        return _NOT_TEXT
    fields = _fields(body, sep, whitespace)
    if not fields:
        return None
    if has_label:
        problem = _number(fields[0], "the label")
        if problem and problem.endswith(", not a number"):
            if _feature(fields[0], kind, index_range) is None:  # a feature where the label goes
                after = " after the sample id" if sid else ""
                return f"{problem} (no label{after}? set ml.data.has.label=false)"
            if not sid:  # Angel's predict files start with a sample id
                return f"{problem} (a sample id first? set ml.data.sid=true)"
        if problem:
            return problem
        fields = fields[1:]
    for token in fields:
        problem = _feature(token, kind, index_range)
        if problem:
            return problem
    return None


def _fits_dense(fields: list[str], index_range: int) -> bool:
    """Whether numbers ``fields`` (a line's, label cut off) are a dense row rather than ids: as
    many as ml.feature.index.range (give or take one: a label read or not), or, without it,
    mostly not ids (negative, fractional) or repeating (a line holds an id once)."""
    if index_range > 0:
        return abs(len(fields) - index_range) <= 1
    ids = [f for f in fields if _INT.fullmatch(f)]
    return 2 * len(ids) <= len(fields) or len(set(map(int, ids))) < len(ids)


def looks_like(
    raw: bytes, kind: str, has_label: bool, sep: str, whitespace: bool, index_range: int = -1
) -> str | None:
    """The other text format (libsvm, dummy, dense) that a line bad for ``kind`` is good
    for, or None: the ml.data.type the input most likely has. Dense only for a line that
    fits a dense row (:func:`_fits_dense`): a dummy line with one bad id is no dense row."""
    body = raw.decode("latin-1").rstrip("\r\n")
    if not body.strip():
        return None
    for other in ("libsvm", "dummy", "dense"):
        if other == kind or why_bad(raw, other, has_label, sep, whitespace) is not None:
            continue
        if other == "dense":
            fields = _fields(body, sep, whitespace)[1 if has_label else 0 :]
            if not _fits_dense(fields, index_range):
                continue
        return other
    return None
