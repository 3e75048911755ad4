"""A device tier's swap at a shard (learners/worker/device_tier.py): write back whole rows,
then read whole rows. The data plane runs a swap on a thread of its own, off the shard's event
loop (:mod:`angelps.server.data_plane`), its lookups, gathers and scatters cut into parts over
``angel.ps.swap.threads`` threads (:mod:`angelps.storage.row_threads`): on an H200 node a
swap took 8-9 ms of the shard's time a step, bound by memory latency (docs/device-tier.md).
It reads before it writes back the rows it does not read (:func:`split_writes`), so that the
server answers before it writes those back (:func:`answer`, then :func:`write_back`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import numpy as np

from angelps.dedup import strictly_increasing
from angelps.push_checks import check_keys
from angelps.storage.row_threads import RowThreads, each
from angelps.storage.table_rows import Table

__all__ = [
    "MARKS_MAX",
    "answer",
    "check_swap",
    "read_rows",
    "split_writes",
    "swap",
    "write_back",
]

#: The most marks :func:`split_writes` makes for a swap (a byte each): ids of a larger range
#: are hashed to that many.
MARKS_MAX = 1 << 22


def swap(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
    par: RowThreads | None = None,
) -> dict[str, np.ndarray]:
    """Write ``writes`` (table -> (unique keys, whole rows with their optimizer slots)), then
    read the whole rows of ``reads`` (table -> unique keys; rows missing are created), over
    ``par``'s threads; returns the rows read. Everything is checked before any row is written
    (:func:`check_swap`)."""
    checked = check_swap(table, writes, reads, par)
    write_back(table, writes, par)
    return read_rows(table, checked, par)


def check_swap(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
    par: RowThreads | None = None,
) -> dict[str, np.ndarray]:
    """Check a swap before any row is written (``table``: a table by name, ValueError for an
    unknown one): the keys of every write-back and read (in range, held by this shard, each
    once: the threads of a swap write rows of distinct keys), the write-backs' blocks, each
    array on a thread of ``par`` where given (the first error in order raised); returns the
    keys read, checked (int64)."""
    wt = {name: table(name) for name in writes}
    rt = {name: table(name) for name in reads}

    def check_write(name: str, keys: np.ndarray, block: np.ndarray, unique: bool) -> None:
        t = wt[name]
        k = check_keys(t.spec, keys)
        t.check_owned(k)
        if unique:
            _check_unique(name, "write-back", k, t.spec.rows)
        if block.shape != (len(k), t.width) or block.dtype != t.dtype:
            raise ValueError(
                f"table {name!r}: a write-back of {len(k)} rows needs a "
                f"[{len(k)}, {t.width}] {t.dtype} block, got {block.shape} {block.dtype}"
            )

    def read(name: str, keys: np.ndarray) -> np.ndarray:
        t = rt[name]
        k = check_keys(t.spec, keys)
        t.check_owned(k)
        _check_unique(name, "read", k, t.spec.rows)
        return k

    # A tier's book writes its tables back with one key array (equal arrays once decoded): its
    # keys' uniqueness, a sort of 35,000 keys in 0.5 ms, is checked for the first table only.
    firsts = _firsts([keys for keys, _ in writes.values()])
    tasks: list[Callable[[], np.ndarray | None]] = [
        partial(check_write, name, keys, block, first)
        for (name, (keys, block)), first in zip(writes.items(), firsts, strict=True)
    ]
    tasks += [partial(read, name, keys) for name, keys in reads.items()]
    done = each(par, tasks)[len(writes) :]
    return {name: k for name, k in zip(reads, done, strict=True) if k is not None}


def _firsts(arrays: list[np.ndarray]) -> list[bool]:
    """For each array, whether no array before it is equal to it."""
    seen: list[np.ndarray] = []
    out = []
    for a in arrays:
        first = not any(_same(b, a) for b in seen)
        if first:
            seen.append(a)
        out.append(first)
    return out


def _check_unique(name: str, what: str, keys: np.ndarray, rows: int = 0) -> None:
    """ValueError naming a key that ``keys`` (checked: in ``[0, rows)`` where ``rows`` > 0)
    holds more than once."""
    if strictly_increasing(keys):  # (what a tier reads: its ids sorted)
        return
    if 0 < rows <= min(32 * len(keys), MARKS_MAX):
        # A mark per id is cheaper than a sort where the ids are dense enough: 0.19 against
        # 0.47 ms for 35,000 of 10^6 ids (a tier's write-backs, in the order it evicts them).
        marks = np.zeros(rows, dtype=bool)
        marks[keys] = True
        if np.count_nonzero(marks) == len(keys):
            return
    ordered = np.sort(keys)
    same = ordered[1:] == ordered[:-1]
    if same.any():
        raise ValueError(
            f"table {name!r}: a swap's {what} names key {int(ordered[1:][same][0])} more than once"
        )


def write_back(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    par: RowThreads | None = None,
) -> None:
    """A swap's write-backs (checked), over ``par``'s threads; a table written back with the
    keys of the one before it is given that one's slots to check first (:func:`_hint`)."""
    last: tuple[np.ndarray, Table] | None = None
    for name, (keys, block) in writes.items():
        t = table(name)
        t.put_rows(keys, block, par, _hint(last, keys))
        last = (keys, t)


def read_rows(
    table: Callable[[str], Table],
    checked: Mapping[str, np.ndarray],
    par: RowThreads | None = None,
    outs: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """A swap's reads (keys checked), over ``par``'s threads; returns the rows, gathered
    into ``outs[table]`` where given (the reply's place in memory shared with the client)."""
    outs = outs or {}
    got: dict[str, np.ndarray] = {}
    last: tuple[np.ndarray, Table] | None = None
    for name, k in checked.items():
        t = table(name)
        got[name] = t.take_rows(k, par, outs.get(name), _hint(last, k))
        last = (k, t)
    return got


def _hint(last: tuple[np.ndarray, Table] | None, keys: np.ndarray) -> np.ndarray | None:
    """The slots the table before read or wrote for the same ``keys`` (the tables of a device
    tier's book are swapped with one key array, and created alike: their slots agree), to be
    checked before the index is probed: a swap of 200,000 of 30M keys held, read and written
    back for two tables, 75.5 ms with four probes of the index."""
    if last is None or last[1].located is None or not _same(last[0], keys):
        return None
    return last[1].located


def split_writes(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    checked: Mapping[str, np.ndarray],
    par: RowThreads | None = None,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A swap's write-backs split into those to write before its reads and those that may
    follow them (the server answers in between): a row both written back and read (a tier
    evicts a row the next batch does not read, but its write-back waits for the next swap,
    whose batch may read it) goes first, and is written again with the others after (the same
    values); every write-back of a swap that reads nothing follows. Those rows are found with
    a mark per id where the table's id range is small, else through a filter of at most
    :data:`MARKS_MAX` marks (:func:`_both`), for any id range."""
    if not checked:
        return dict(writes), {}
    first: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    later: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    # (the tables of a tier's book are written back and read with the same ids: their rows
    # both written and read are found once)
    last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    for name, (keys, block) in writes.items():
        read = checked.get(name)
        if read is None or not len(read) or not len(keys):
            later[name] = (keys, block)
            continue
        if last is not None and _same(last[0], keys) and _same(last[1], read):
            at = last[2]
        else:
            at = _both(table(name).spec.rows, keys, read, par)
            last = (keys, read, at)
        if len(at):
            first[name] = (keys.take(at), block.take(at, axis=0))
        # Every write-back follows (those also read, again: the same rows, a small share of
        # them), rather than the rest split off (two copies of the block, 2 ms a swap).
        later[name] = (keys, block)
    return first, later


def _both(rows: int, keys: np.ndarray, read: np.ndarray, par: RowThreads | None) -> np.ndarray:
    """Positions in ``keys`` (unique) of those also in ``read`` (unique), both in ``[0,
    rows)`` where ``rows`` > 0: with a mark per id where the range has at most :func:`_marks`
    ids, else with that many marks of the ids' hashes, whose hits are then looked for in
    ``read`` (a filter: about one in 30 of the others hits). Marking and testing run in parts
    over ``par``'s threads (each marks or tests its own slice)."""
    size = _marks(len(read))
    exact = 0 < rows <= size
    if exact:
        size, hk, hr = rows, keys, read
    else:
        # (a multiplicative hash: ids routed to one shard by their low bits fill every mark)
        shift = np.uint64(64 - (size.bit_length() - 1))
        hk = _hash(keys, shift)
        hr = _hash(read, shift)
    marks = np.zeros(size, dtype=bool)  # (calloc: only the pages marked are touched)
    hit = np.empty(len(keys), dtype=bool)

    def mark(a: int, b: int) -> None:
        marks[hr[a:b]] = True

    def test(a: int, b: int) -> None:
        np.take(marks, hk[a:b], out=hit[a:b], mode="clip")

    if par is None:
        mark(0, len(read))
        test(0, len(keys))
    else:
        par.run(len(read), mark)
        par.run(len(keys), test)
    at = np.flatnonzero(hit)
    if exact or not len(at):
        return at
    maybe = keys.take(at)
    ordered = read if strictly_increasing(read) else np.sort(read)
    pos = np.searchsorted(ordered, maybe)
    np.minimum(pos, len(ordered) - 1, out=pos)
    return at[ordered.take(pos) == maybe]


def _hash(keys: np.ndarray, shift: np.uint64) -> np.ndarray:
    """Fibonacci hashing of ``keys`` into ``64 - shift`` bits (ids of any range and sign)."""
    return ((np.asarray(keys, dtype=np.int64).view(np.uint64) * _GOLDEN) >> shift).view(np.int64)


#: Fibonacci hashing's multiplier (2^64 / the golden ratio), for :func:`_both`'s filter.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _marks(n: int) -> int:
    """The marks of :func:`_both`'s filter for ``n`` ids read: a power of two, about 32 for
    each id, at least 2^16 and at most :data:`MARKS_MAX` (a byte each, zeroed pages only
    where marked)."""
    return 1 << min(max((32 * max(n, 1) - 1).bit_length(), 16), MARKS_MAX.bit_length() - 1)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (len(a) == len(b) and bool(np.array_equal(a, b)))


def answer(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
    lent: bool = False,
    par: RowThreads | None = None,
    outs: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A swap up to its answer: checked, its write-backs split (:func:`split_writes`), those
    of rows it reads written, its rows read; returns the rows and the write-backs left to
    write once the answer is sent (:func:`write_back`). ``lent``: the write-backs' arrays are
    the caller's again once it has the answer (a body in memory shared with the client):
    those left are copied first. ``outs``: as for :func:`read_rows`."""
    checked = check_swap(table, writes, reads, par)
    first, later = split_writes(table, writes, checked, par)
    if lent:
        for name, (keys, block) in list(later.items()):
            # (a subset split off is a copy already; the arrays of the body are views of it)
            later[name] = (
                keys if keys.flags.owndata else keys.copy(),
                block if block.flags.owndata else block.copy(),
            )
    write_back(table, first, par)
    return read_rows(table, checked, par, outs), later
