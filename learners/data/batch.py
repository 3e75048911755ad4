"""The CSR mini-batch every reader hands out, and :func:`concat`.

Invariants of a :class:`Batch`: ``indptr`` starts at 0, is non-decreasing and ends at ``nnz``;
``ids``/``indptr``/``row_index`` are int64, ``labels``/``values`` float32; ``row_index`` is a
row's 0-based line position in its whole input (over all files of a directory, in name order),
so it survives any ``take``/``concat`` and tells the validation split and the prediction order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Batch", "concat"]


@dataclass(eq=False)  # numpy fields: compare with np.array_equal, not ==
class Batch:
    """A mini-batch in CSR form (numpy only).

    Row ``r`` has the features ``ids[indptr[r]:indptr[r+1]]`` with ``values`` alongside, in file
    order. ``labels`` are after the label transform (NaN when the input has no labels), the
    ``ml.data.label.trans.class`` named by ``label_trans`` (None when not known: rows a reader
    did not read), so that a message can name a label as its input has it.
    ``row_index`` is each row's 0-based line position in its input (over all files of a
    directory, in name order): the order predictions are written in, and the data position.
    """

    labels: np.ndarray  # float32 [n]
    indptr: np.ndarray  # int64 [n+1]
    ids: np.ndarray  # int64 [nnz]
    values: np.ndarray  # float32 [nnz]
    row_index: np.ndarray  # int64 [n]
    label_trans: str | None = None  # the transform the labels went through; None: not known

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def nnz(self) -> int:
        """Number of stored features."""
        return int(self.ids.shape[0])

    @classmethod
    def empty(cls) -> Batch:
        """A batch with no rows."""
        return cls(
            labels=np.zeros(0, np.float32),
            indptr=np.zeros(1, np.int64),
            ids=np.zeros(0, np.int64),
            values=np.zeros(0, np.float32),
            row_index=np.zeros(0, np.int64),
        )

    def row_lengths(self) -> np.ndarray:
        """Number of features of each row, int64 [n]."""
        return np.diff(self.indptr)

    def take(self, rows: np.ndarray) -> Batch:
        """The rows ``rows`` (indices or a boolean mask), in that order, CSR rebuilt."""
        rows = np.asarray(rows)
        if rows.dtype == np.bool_:
            if rows.shape != (len(self),):
                raise ValueError(
                    f"Batch.take: boolean mask of shape {rows.shape}, expected ({len(self)},)"
                )
            rows = np.flatnonzero(rows)
        rows = rows.astype(np.int64, copy=False)
        starts = self.indptr[rows]
        counts = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        # Source position of every kept feature: its row's start plus its offset in the row.
        gather = np.arange(indptr[-1], dtype=np.int64) + np.repeat(starts - indptr[:-1], counts)
        return Batch(
            labels=self.labels[rows],
            indptr=indptr,
            ids=self.ids[gather],
            values=self.values[gather],
            row_index=self.row_index[rows],
            label_trans=self.label_trans,
        )

    def slice(self, start: int, stop: int) -> Batch:
        """Rows ``start .. stop-1`` as views (no copy; what ``take`` of a range returns)."""
        a, b = int(self.indptr[start]), int(self.indptr[stop])
        return Batch(
            labels=self.labels[start:stop],
            indptr=self.indptr[start : stop + 1] - a,
            ids=self.ids[a:b],
            values=self.values[a:b],
            row_index=self.row_index[start:stop],
            label_trans=self.label_trans,
        )

    def field_ids(self, num_fields: int) -> np.ndarray:
        """Ids as an ``[n, F]`` array when every row has exactly ``F`` features (FM-style models)."""
        lengths = self.row_lengths()
        bad = np.flatnonzero(lengths != num_fields)
        if bad.size:
            r = int(bad[0])
            raise ValueError(
                f"row at line index {int(self.row_index[r])} has {int(lengths[r])} features, expected "
                f"exactly ml.fm.field.num={num_fields} (one per field); {bad.size} of {len(self)} "
                "rows differ"
            )
        return self.ids.reshape(len(self), num_fields)

    def to_dense(self, num_features: int) -> np.ndarray:
        """The rows as a dense float32 ``[n, num_features]`` array (duplicate ids are summed)."""
        if self.nnz and int(self.ids.max()) >= num_features:
            raise ValueError(
                f"feature id {int(self.ids.max())} does not fit a dense row of {num_features} "
                "features (set ml.feature.index.range)"
            )
        out = np.zeros((len(self), num_features), np.float32)
        rows = np.repeat(np.arange(len(self)), self.row_lengths())
        np.add.at(out, (rows, self.ids), self.values)
        return out


def concat(batches: Sequence[Batch]) -> Batch:
    """The rows of all batches, in order, as one batch."""
    batches = [b for b in batches if len(b)] or list(batches[:1])
    if not batches:
        return Batch.empty()
    if len(batches) == 1:
        return batches[0]
    nnz = np.cumsum([0] + [b.nnz for b in batches[:-1]])
    trans = {b.label_trans for b in batches}  # one transform, or not known
    indptr = np.concatenate(
        [batches[0].indptr[:1]] + [b.indptr[1:] + o for b, o in zip(batches, nnz, strict=True)]
    )
    return Batch(
        labels=np.concatenate([b.labels for b in batches]),
        indptr=indptr.astype(np.int64, copy=False),
        ids=np.concatenate([b.ids for b in batches]),
        values=np.concatenate([b.values for b in batches]),
        row_index=np.concatenate([b.row_index for b in batches]),
        label_trans=trans.pop() if len(trans) == 1 else None,
    )


def first_repeats(ids: np.ndarray, counts: np.ndarray) -> dict[int, int]:
    """``{row: smallest id the row holds more than once}`` for the rows that repeat an id, of
    ``ids`` laid out as CSR with ``counts`` features per row.

    O(nnz) when every row's ids ascend (the usual case); only the other rows are sorted.
    """
    if ids.size < 2:
        return {}
    row_of = np.repeat(np.arange(counts.size), counts)
    suspect = (row_of[1:] == row_of[:-1]) & (ids[1:] <= ids[:-1])
    if not suspect.any():
        return {}
    picked = np.isin(row_of, row_of[1:][suspect])
    r, i = row_of[picked], ids[picked]
    order = np.lexsort((i, r))
    r, i = r[order], i[order]
    dup = (r[1:] == r[:-1]) & (i[1:] == i[:-1])
    out: dict[int, int] = {}
    for row, fid in zip(r[1:][dup].tolist(), i[1:][dup].tolist(), strict=True):
        out.setdefault(int(row), int(fid))
    return out
