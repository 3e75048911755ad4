"""A device tier's swap at a shard (learners/worker/device_tier.py): write back whole rows,
then read whole rows, in pieces, so that the shard server answers a step call between two
pieces instead of after the whole swap (on an H200 node a swap took 8-9 ms of the shard's time
a step, and the worker's dense call waited for it: docs/device-tier.md); and the reads before
the write-backs of rows they do not read (:func:`split_writes`), so that the server answers
before it writes those back."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping

import numpy as np

from angelps.push_checks import check_keys
from angelps.storage.table_rows import Table

__all__ = [
    "MARKS_MAX",
    "SWAP_PIECE_BYTES",
    "answer_steps",
    "check_swap",
    "read_steps",
    "split_writes",
    "swap_steps",
    "write_steps",
]

#: Bytes of rows a swap moves between two pauses: a step call that arrives during a swap waits
#: for about one piece (bench/swap_lane.py on 2 cores, 66,000 rows each way of FM's two tables:
#: 3.1 ms behind a swap, with 1 MiB pieces 5.1 ms, whole 13.6 ms; 64 KiB pieces made the swap
#: 1.6x slower).
SWAP_PIECE_BYTES = 1 << 18
#: The largest id range whose swaps :func:`split_writes` checks (a byte an id, for the check).
MARKS_MAX = 1 << 26


def swap_steps(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
    piece_bytes: int = SWAP_PIECE_BYTES,
) -> Generator[None, None, dict[str, np.ndarray]]:
    """Write ``writes`` (table -> (unique keys, whole rows with their optimizer slots)), then
    read the whole rows of ``reads`` (table -> unique keys; rows missing are created), in
    pieces of about ``piece_bytes``, pausing (``yield``) after each; returns the rows read.
    Everything is checked before any row is written (:func:`check_swap`)."""
    checked = check_swap(table, writes, reads)
    yield from write_steps(table, writes, piece_bytes)
    return (yield from read_steps(table, checked, piece_bytes))


def check_swap(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Check a swap before any row is written (``table``: a table by name, KeyError for an
    unknown one): the keys of every write-back and read, the write-backs' blocks; returns the
    keys read, checked (int64)."""
    for name, (keys, block) in writes.items():
        t = table(name)
        k = check_keys(t.spec, keys)
        t.check_owned(k)
        if block.shape != (len(k), t.width) or block.dtype != t.dtype:
            raise ValueError(
                f"table {name!r}: a write-back of {len(k)} rows needs a "
                f"[{len(k)}, {t.width}] {t.dtype} block, got {block.shape} {block.dtype}"
            )
    checked = {}
    for name, keys in reads.items():
        t = table(name)
        checked[name] = check_keys(t.spec, keys)
        t.check_owned(checked[name])
    return checked


def write_steps(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    piece_bytes: int = SWAP_PIECE_BYTES,
) -> Generator[None, None, None]:
    """A swap's write-backs (checked), in pieces, pausing after each. No slot is held across
    a pause: each piece looks its keys up, so work that moves rows during a pause (expiry at
    a backup) leaves the swap correct."""
    for name, (keys, block) in writes.items():
        t = table(name)
        rows = _piece_rows(t, piece_bytes)
        for a in range(0, len(keys), rows):
            t.put_rows(keys[a : a + rows], block[a : a + rows])
            yield


def read_steps(
    table: Callable[[str], Table],
    checked: Mapping[str, np.ndarray],
    piece_bytes: int = SWAP_PIECE_BYTES,
) -> Generator[None, None, dict[str, np.ndarray]]:
    """A swap's reads (keys checked), in pieces, pausing after each; returns the rows."""
    out = {}
    for name, k in checked.items():
        t = table(name)
        rows = _piece_rows(t, piece_bytes)
        if len(k) <= rows:
            out[name] = t.take_rows(k)
            yield
            continue
        got = np.empty((len(k), t.width), dtype=t.dtype)
        for a in range(0, len(k), rows):
            got[a : a + rows] = t.take_rows(k[a : a + rows])
            yield
        out[name] = got
    return out


def split_writes(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    checked: Mapping[str, np.ndarray],
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A swap's write-backs split into those to write before its reads and those that may
    follow them (the server answers in between): a row both written back and read (a tier
    evicts a row the next batch does not read, but its write-back waits for the next swap,
    whose batch may read it) goes first, and is written again with the others after (the same
    values); every write-back of a table of unknown id range or one over :data:`MARKS_MAX` ids
    (found with a mark per id), and of a swap that reads nothing, goes first only."""
    if not checked:
        return dict(writes), {}
    first: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    later: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, (keys, block) in writes.items():
        read = checked.get(name)
        if read is None or not len(read) or not len(keys):
            later[name] = (keys, block)
            continue
        rows = table(name).spec.rows
        if not 0 < rows <= MARKS_MAX:
            first[name] = (keys, block)
            continue
        marks = np.zeros(rows, dtype=bool)  # (calloc: only the pages marked are touched)
        marks[read] = True
        at = np.flatnonzero(marks[keys])
        if len(at):
            first[name] = (keys.take(at), block.take(at, axis=0))
        # Every write-back follows (those also read, again: the same rows, a small share of
        # them), rather than the rest split off (two copies of the block, 2 ms a swap).
        later[name] = (keys, block)
    return first, later


def answer_steps(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
    lent: bool = False,
    piece_bytes: int = SWAP_PIECE_BYTES,
) -> Generator[None, None, tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]]:
    """A swap up to its answer, in pieces, pausing after each: checked, its write-backs split
    (:func:`split_writes`), those of rows it reads written, its rows read; returns the rows
    and the write-backs left to write once the answer is sent (:func:`write_steps`).
    ``lent``: the write-backs' arrays are the caller's again once it has the answer (a body
    in memory shared with the client): those left are copied first."""
    checked = check_swap(table, writes, reads)
    yield
    first, later = split_writes(table, writes, checked)
    yield
    if lent:
        for name, (keys, block) in list(later.items()):
            # (a subset split off is a copy already; the arrays of the body are views of it)
            later[name] = (
                keys if keys.flags.owndata else keys.copy(),
                block if block.flags.owndata else block.copy(),
            )
            yield
    yield from write_steps(table, first, piece_bytes)
    rows = yield from read_steps(table, checked, piece_bytes)
    return rows, later


def _piece_rows(t: Table, piece_bytes: int) -> int:
    """Rows of ``t`` in a piece of about ``piece_bytes`` (at least 1,024)."""
    return max(1024, piece_bytes // (t.width * t.dtype.itemsize))
