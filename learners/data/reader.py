"""The reader over an input's files: one worker's part of it, chunk by chunk, in any format.

Worker parts. Lines (Parquet rows) are indexed over the whole input (all files of a directory,
in name order) and grouped in blocks of ``P`` consecutive lines, ``P = ceil(1 /
ml.data.validate.ratio)`` (``P = 1`` when the ratio is 0; :func:`split_period`). Worker ``w`` of
``W`` reads the lines of the blocks ``b`` with ``b % W == w``, so every worker holds its share of
the validation lines (the first of every block, :mod:`learners.data.split`) whatever ``W``.

An input without a line (an empty file, a directory of empty files) is a :class:`DataError`. A
chunk never holds more than ``chunk_rows`` rows; a malformed line goes to
:func:`learners.data.problems.reject` (raise, or skip and count); labels go through
``ml.data.label.trans.class`` last.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from angelps.file_store import files_for
from learners.data.batch import Batch, concat
from learners.data.labels import label_transform
from learners.data.options import DataOptions, split_period
from learners.data.parquet import open_parquet, parse_record_batch
from learners.data.problems import DataError, ReadStats, printable, reject
from learners.data.text import TextParser, line_blocks

__all__ = ["Reader", "input_files", "line_of", "load_file", "read_file"]


def input_files(path: str) -> list[str]:
    """The files of an input path: the file itself, or a directory's visible files in name order.

    Text files may be compressed (``.gz``, ``.bz2``, ``.zst``, ``.lz4``: detected by suffix).
    A URL (``s3://...``) is listed through ``pyarrow.fs`` by the same rule
    (:func:`angelps.file_store.files_for` chooses).
    """
    store = files_for(path)
    try:
        if store.is_dir(path):
            names = [n for n in store.files_in(path) if not n.startswith((".", "_"))]
            if not names:
                raise DataError(f"{path}: the input directory has no data files")
            return [store.join(path, n) for n in names]
        if not store.exists(path):
            raise DataError(f"{path}: no such input file or directory")
    except OSError as e:
        raise DataError(f"{path}: cannot list the input ({printable(str(e))})") from None
    return [path]


def _readable(file: str, blocks: Iterator[tuple[pa.Array, int]]) -> Iterator[tuple[pa.Array, int]]:
    """``blocks``, with a file that cannot be read (permissions, a broken compressed stream) as a
    DataError naming it."""
    try:
        yield from blocks
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{file}: cannot read the file ({printable(str(e))})") from None


@dataclass
class Reader:
    """One read of one input (all its files) by one worker; iterating yields its chunks.

    ``chunk_rows`` defaults to ``opts.chunk_rows``. ``transform=False`` keeps the labels as
    read (the converter writes them so). Chunks may be empty.
    """

    path: str
    opts: DataOptions
    worker_id: int = 0
    num_workers: int = 1
    chunk_rows: int | None = None
    stats: ReadStats = field(default_factory=ReadStats)
    transform: bool = True
    block_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(
                f"worker_id={self.worker_id} is not valid for num_workers={self.num_workers}"
            )
        self.rows = self.opts.chunk_rows if self.chunk_rows is None else self.chunk_rows
        if self.rows < 1:
            raise ValueError(f"chunk_rows={self.rows} is not valid: expected an integer >= 1")
        self.period = split_period(self.opts)

    def __iter__(self) -> Iterator[Batch]:
        offset = 0  # line index of the current file's first line within the whole input
        files = input_files(self.path)
        for file in files:
            if self.opts.kind == "parquet":
                offset += yield from self._parquet(file, offset)
            else:
                offset += yield from self._text(file, offset, TextParser(self.opts))
        if offset == 0:
            what = "rows" if self.opts.kind == "parquet" else "lines"
            where = "the file holds" if files == [self.path] else f"its {len(files)} files hold"
            raise DataError(
                f"{self.path}: the input is empty: {where} no {what} "
                f"(expected {self.opts.kind} data)"
            )

    def _pieces(self, first_index: int, n: int) -> Iterator[np.ndarray]:
        """Positions (0..n-1) of this worker's lines among n lines starting at line index
        ``first_index``, at most ``chunk_rows`` at a time.

        Whole blocks of P lines go to one worker, so n lines may hold more than chunk_rows of
        this worker's lines: they come in pieces.
        """
        idx = np.arange(first_index, first_index + n, dtype=np.int64)
        if self.num_workers == 1:
            mine = idx - first_index
        else:
            mine = np.flatnonzero((idx // self.period) % self.num_workers == self.worker_id)
        for k in range(0, mine.size, self.rows):
            yield mine[k : k + self.rows]

    def _finish(self, batch: Batch, bad: list[str]) -> Batch:
        reject(bad, skip=self.opts.skip_bad_lines, stats=self.stats)
        opts = self.opts
        if self.transform and len(batch) and opts.label_trans.lower() != "notrans":
            batch.labels = label_transform(batch.labels, opts.label_trans, opts.label_threshold)
        # what the labels went through, for messages that name a label as the file has it
        batch.label_trans = opts.label_trans if self.transform else "NoTrans"
        self.stats.rows += len(batch)
        return batch

    def _text(self, file: str, offset: int, parser: TextParser) -> Generator[Batch, None, int]:
        """Parsed chunks of this worker's lines of ``file``; returns the file's line count."""
        seen = 0
        step = self.rows * self.num_workers
        for lines, first in _readable(file, line_blocks(file, self.block_bytes)):
            for start in range(0, len(lines), step):
                part = lines.slice(start, step)
                for pos in self._pieces(offset + first + start, len(part)):
                    mine = part.take(pa.array(pos)) if pos.size != len(part) else part
                    self.stats.lines += len(mine)
                    parsed = parser.parse(file, mine, first + start + pos, offset)
                    self.stats.blank_lines += parsed.blank_lines
                    yield self._finish(parsed.batch, parsed.bad)
            seen = first + len(lines)
        return seen

    def _parquet(self, file: str, offset: int) -> Generator[Batch, None, int]:
        """Parsed chunks of this worker's rows of ``file``; returns the file's row count."""
        pf, columns = open_parquet(file, self.opts)
        first = 0
        for rb in pf.iter_batches(batch_size=self.rows * self.num_workers, columns=columns):
            start = first
            first += rb.num_rows
            for pos in self._pieces(offset + start, rb.num_rows):
                part = rb.take(pa.array(pos))
                self.stats.lines += part.num_rows
                parsed = parse_record_batch(file, part, start + pos, offset, self.opts)
                yield self._finish(parsed.batch, parsed.bad)
        return int(pf.metadata.num_rows)


def line_of(path: str, opts: DataOptions, row_index: int) -> str:
    """Where row ``row_index`` of the input ``path`` is (a :class:`Batch`'s ``row_index``:
    its line position over the input's files in name order): ``FILE:LINE`` (1-based), or
    ``FILE, row N`` in Parquet. Reads the files before it to count their lines: for an error's
    message, not for a hot path."""
    start = 0
    for file in input_files(path):
        if opts.kind == "parquet":
            n = int(open_parquet(file, opts)[0].metadata.num_rows)
        else:
            n = 0
            for lines, first in line_blocks(file, 8 << 20):
                n = first + len(lines)
        if row_index < start + n:
            pos = row_index - start + 1
            return f"{file}, row {pos}" if opts.kind == "parquet" else f"{file}:{pos}"
        start += n
    return f"{path}, row index {row_index}"


def read_file(
    path: str,
    opts: DataOptions,
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    chunk_rows: int | None = None,
    stats: ReadStats | None = None,
) -> Iterator[Batch]:
    """Stream this worker's part of an input (a file or a directory) as batches of at most
    ``chunk_rows`` rows (``opts.chunk_rows`` when not given), none empty.

    The format comes from ``ml.data.type``; labels go through ``ml.data.label.trans.class``.
    A malformed line raises :class:`DataError` naming the file and line, or is skipped and
    counted in ``stats`` with ``ml.data.skip.bad.lines=true``.
    """
    reader = Reader(
        path, opts, worker_id, num_workers, chunk_rows, stats if stats is not None else ReadStats()
    )
    for batch in reader:
        if len(batch):
            yield batch


def load_file(
    path: str,
    opts: DataOptions,
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    stats: ReadStats | None = None,
) -> Batch:
    """This worker's part of an input, in memory (e.g. for prediction or evaluation)."""
    return concat(
        list(read_file(path, opts, worker_id=worker_id, num_workers=num_workers, stats=stats))
    )
