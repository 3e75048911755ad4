"""A device tier's swap at a shard (learners/worker/device_tier.py): write back whole rows,
then read whole rows, in pieces, so that the shard server answers a step call between two
pieces instead of after the whole swap (on a GPU node a swap took 3-4 ms of the shard's time
a step, and the worker's dense call waited for it: docs/device-tier.md)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping

import numpy as np

from angelps.push_checks import check_keys
from angelps.storage.table_rows import Table

__all__ = ["SWAP_PIECE_BYTES", "swap_steps"]

#: Bytes of rows a swap moves between two pauses: a step call that arrives during a swap waits
#: for about one piece (bench/swap_lane.py on 2 cores, 66,000 rows each way of FM's two tables:
#: 3.1 ms behind a swap, with 1 MiB pieces 5.1 ms, whole 13.6 ms; 64 KiB pieces made the swap
#: 1.6x slower).
SWAP_PIECE_BYTES = 1 << 18


def swap_steps(
    table: Callable[[str], Table],
    writes: Mapping[str, tuple[np.ndarray, np.ndarray]],
    reads: Mapping[str, np.ndarray],
    piece_bytes: int = SWAP_PIECE_BYTES,
) -> Generator[None, None, dict[str, np.ndarray]]:
    """Write ``writes`` (table -> (unique keys, whole rows with their optimizer slots)), then
    read the whole rows of ``reads`` (table -> unique keys; rows missing are created), in
    pieces of about ``piece_bytes``, pausing (``yield``) after each; returns the rows read.
    Everything is checked before any row is written (``table``: a table by name, KeyError
    for an unknown one). No slot is held across a pause: each piece looks its keys up, so
    work that moves rows during a pause (expiry at a backup) leaves the swap correct."""
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
    for name, (keys, block) in writes.items():
        t = table(name)
        rows = _piece_rows(t, piece_bytes)
        for a in range(0, len(keys), rows):
            t.put_rows(keys[a : a + rows], block[a : a + rows])
            yield
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


def _piece_rows(t: Table, piece_bytes: int) -> int:
    """Rows of ``t`` in a piece of about ``piece_bytes`` (at least 1,024)."""
    return max(1024, piece_bytes // (t.width * t.dtype.itemsize))
