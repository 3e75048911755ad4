"""The text formats (libsvm, dummy, dense): lines of bytes in, CSR batches and bad-line messages out.

Formats (``ml.data.type``), as Angel's ``DataParser`` (Angel-ML/angel:
angel-ps/mllib/.../core/utils/DataParser.scala):

============  ======================  ============================================  =========
type          line                    feature ids in :class:`Batch`                 value
============  ======================  ============================================  =========
``libsvm``    ``y i:v i:v ...``       ``i - 1`` (the file's ids are 1-based)        ``v``
``dummy``     ``y i i ...``           ``i`` (0-based in the file)                   1.0
``dense``     ``y v1 v2 ... vd``      ``0 .. d-1``                                  ``vj``
============  ======================  ============================================  =========

Text files are read in blocks of bytes and parsed with vectorized numpy and pyarrow kernels: one
regular expression per line tells the good lines from the bad ones (so a bad line is found with
its number without a Python loop), byte comparisons cut the good lines into tokens packed into
one Arrow string array, and three casts give labels, ids and values. Blank lines are skipped
silently; they still count as lines for the line numbers. A separator of several characters
(``ml.data.splitor`` is a regular expression, as in Angel) goes through a regex split instead.

The parser never raises for a bad line: :meth:`TextParser.parse` returns the good rows and one
message per bad line (``file:line: reason``, 1-based, in line order) for
:func:`learners.data.problems.reject`. A line has at most one message: its first problem.
A line the format's regular expression rejects is explained by
:func:`learners.data.diagnose.why_bad` (the first wrong field); the quoted line has its control
characters escaped. A feature id repeated within a line is a bad line (not summed): each id
appears at most once per line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from angelps import fs
from learners.data.batch import Batch, first_repeats
from learners.data.diagnose import looks_like, why_bad
from learners.data.options import DataOptions
from learners.data.problems import FORMAT_HINT, printable

__all__ = ["ParsedText", "TextFormat", "TextParser", "line_blocks"]

_WHITESPACE_SPLITORS = {r"\s+", r"\s", " ", "\t", r"\t", r"[ \t]+", r"[\s]+"}
_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_WS = r"[\t\n\f\r ]"  # RE2's \s, spelled out: measurably faster
# Feature token and its shape in messages, by format.
_TOKENS = {
    "libsvm": (rf"\d+:{_NUM}", "<id>:<value>"),
    "dummy": (r"\d+", "<id>"),
    "dense": (_NUM, "<value>"),
}


def _separator(kind: str, splitor: str) -> tuple[bool, str, bytes | None]:
    """(whitespace?, regex between fields, separator bytes when bytes comparisons can tokenize)."""
    whitespace = splitor in _WHITESPACE_SPLITORS
    sep = rf"{_WS}+" if whitespace else rf"{_WS}*(?:{splitor}){_WS}*"
    # Bytes that separate tokens besides whitespace, when bytes comparisons can tokenize.
    sep_bytes: bytes | None = b":" if kind == "libsvm" else b""
    if not whitespace:
        literal = re.sub(r"\\(.)", r"\1", splitor)
        # A one-character separator that cannot be part of a number tokenizes by bytes.
        if len(literal) == 1 and literal not in "0123456789+-.eE:" and " " < literal < "\x7f":
            sep_bytes = (sep_bytes or b"") + literal.encode()
        else:
            sep_bytes = None
    return whitespace, sep, sep_bytes


@dataclass(frozen=True)
class TextFormat:
    """What one text format's lines look like, compiled once per read."""

    kind: str
    has_label: bool
    whitespace: bool  # fields separated by whitespace only
    sep: str  # regex between fields
    sep_bytes: bytes | None  # non-whitespace separator bytes when bytes can tokenize (fast path)
    index_range: int
    field_num: int
    line_rx: str
    expected: str  # "'<label> <id>:<value> ...' (libsvm)", for error messages
    sid: bool = False  # a sample id first on each line (cut off before the line is matched)

    @classmethod
    def from_options(cls, opts: DataOptions) -> TextFormat:
        kind, splitor = opts.kind, opts.splitor
        whitespace, sep, sep_bytes = _separator(kind, splitor)
        token, shape = _TOKENS[kind]
        if opts.has_label:
            body = rf"{_NUM}(?:{sep}{token})*"
            expected = f"<label> {shape} ..."
        else:
            body = rf"{token}(?:{sep}{token})*"
            expected = f"{shape} ..."
        note = kind if whitespace else f"{kind}, separator {splitor!r}"
        if opts.sid:  # messages quote a line whole, its sample id included
            expected = f"<sid> {expected}"
        return cls(
            kind=kind,
            has_label=opts.has_label,
            whitespace=whitespace,
            sep=sep,
            sep_bytes=sep_bytes,
            index_range=opts.index_range,
            field_num=opts.field_num,
            # Blank lines match too; they are told apart by having no tokens.
            # Java's String.split drops a trailing empty field, so a trailing separator is fine.
            line_rx=rf"^{_WS}*(?:{body}(?:{sep})?)?{_WS}*$",
            expected=f"'{expected}' ({note})",
            sid=opts.sid,
        )


# --- lines and tokens --------------------------------------------------------------------------


def _lines_array(data: bytes, ends: np.ndarray) -> pa.Array:
    """A zero-copy binary array of the lines of ``data`` ending at the newline positions ``ends``."""
    offsets = np.empty(ends.size + 1, np.int32 if len(data) < 2**31 else np.int64)
    offsets[0] = 0
    offsets[1:] = ends + 1
    typ = pa.binary() if offsets.dtype == np.int32 else pa.large_binary()
    return pa.Array.from_buffers(typ, ends.size, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def line_blocks(file: str, block_bytes: int) -> Iterator[tuple[pa.Array, int]]:
    """(binary array of whole lines, index of the first line within the file), block by block."""
    first = 0
    carry = b""
    # compression="detect" reads .gz, .bz2, .zst, .lz4 by the file's suffix.
    # A URL (s3://...) is read through pyarrow.fs; a local path exactly as before.
    with fs.open_input_stream(file, compression="detect") as f:
        while True:
            buf = f.read(block_bytes)
            if not buf:
                break
            if first == 0 and not carry and buf.startswith(b"\xef\xbb\xbf"):
                buf = buf[3:]  # a UTF-8 byte order mark is not part of the first line
            data = carry + buf if carry else buf
            ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
            if ends.size == 0:
                carry = data
                continue
            stop = int(ends[-1]) + 1
            yield _lines_array(data, ends), first
            first += ends.size
            carry = data[stop:]
    if carry:
        yield _lines_array(carry, np.array([len(carry) - 1], np.int64)), first


def _tokenize(lines: pa.Array, seps: bytes) -> tuple[pa.Array, np.ndarray]:
    """Split lines at whitespace and at the bytes ``seps``: (all tokens, tokens per line).

    Only for lines that passed the format's regular expression: then every byte <= 0x20 is
    whitespace, and vectorized byte comparisons find the separators. The other bytes are packed
    together, so the tokens lie back to back in one buffer and the token offsets are the
    cumulative token lengths: one string array for all tokens, no Python loop.
    """
    n = len(lines)
    _, offsets_buf, data_buf = lines.buffers()
    large = pa.types.is_large_binary(lines.type)
    width = 8 if large else 4
    offsets = np.frombuffer(
        offsets_buf, np.int64 if large else np.int32, count=n + 1, offset=lines.offset * width
    )
    region = np.frombuffer(data_buf, np.uint8)[offsets[0] : offsets[n]]
    starts = (offsets - offsets[0]).astype(np.int64)
    keep = region > 32
    for c in seps:
        keep &= region != c
    # Token edges: where keep changes; a token begins at an even edge and ends at the next one.
    edge = np.empty(region.size + 1, bool)
    edge[0] = keep[0]
    edge[-1] = keep[-1]
    np.not_equal(keep[1:], keep[:-1], out=edge[1:-1])
    edges = np.flatnonzero(edge)
    # A line without a trailing separator (a file's last line) must not run into the next one.
    inner = starts[1:-1]
    forced = inner[keep[inner] & keep[inner - 1]]
    if forced.size:
        edges = np.sort(np.concatenate([edges, forced, forced]))
    begin, end = edges[0::2], edges[1::2]
    packed = region[keep]
    big = packed.size >= 2**31
    tok_off = np.zeros(begin.size + 1, np.int64 if big else np.int32)
    np.cumsum(end - begin, out=tok_off[1:])
    tokens = pa.Array.from_buffers(
        pa.large_string() if big else pa.string(),
        begin.size,
        [None, pa.py_buffer(tok_off), pa.py_buffer(packed)],
    )
    return tokens, np.diff(np.searchsorted(begin, starts)).astype(np.int64)


def _regex_tokenize(lines: pa.Array, fmt: TextFormat) -> tuple[pa.Array, np.ndarray]:
    """:func:`_tokenize` for separators bytes cannot find: a regex split, slower."""
    text = lines.cast(pa.string())
    if fmt.kind == "libsvm":
        text = pc.replace_substring(text, ":", " ")
    text = pc.replace_substring_regex(text, fmt.sep, " ")
    tokens = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(text))
    counts = pc.list_value_length(tokens).to_numpy().astype(np.int64)
    counts[pc.equal(pc.list_element(tokens, 0), "").to_numpy(zero_copy_only=False)] = 0
    flat = pc.list_flatten(tokens)
    return flat.filter(pc.not_equal(flat, "")), counts


def _decode(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="backslashreplace")


def _shorten(line: str, limit: int = 80) -> str:
    """A line as messages quote it: control characters escaped, at most ``limit`` characters."""
    line = printable(line.rstrip("\r\n"))
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _to_float(tokens: pa.Array) -> np.ndarray:
    return pc.cast(tokens, pa.float64()).to_numpy(zero_copy_only=False)


# --- parsing -----------------------------------------------------------------------------------


@dataclass
class _Lines:
    """The lines of a chunk still in play, with their 0-based line numbers in the file;
    ``whole``: the lines as the file has them, where ``lines`` lost their sample ids."""

    lines: pa.Array
    line_no: np.ndarray
    whole: pa.Array | None = None

    def keep(self, mask: np.ndarray) -> None:
        keep = pa.array(mask)
        self.lines = self.lines.filter(keep)
        self.line_no = self.line_no[mask]
        if self.whole is not None:
            self.whole = self.whole.filter(keep)

    def shown(self, r: int) -> str:
        """Line ``r`` as messages quote it: whole, as in the file."""
        lines = self.lines if self.whole is None else self.whole
        return _shorten(_decode(lines[r].as_py()))


@dataclass
class _Features:
    """The numbers of the good, non-blank lines of a chunk."""

    labels: np.ndarray  # float64 [n], NaN without labels
    nfeat: np.ndarray  # int64 [n], features per row
    indptr: np.ndarray  # int64 [n+1]
    ids: np.ndarray  # int64 [nnz], 0-based (libsvm ids already shifted)
    values: np.ndarray  # float64 [nnz]
    too_long: np.ndarray  # bool [nnz], id tokens too long for int64 (read as 0)

    @property
    def row_of(self) -> np.ndarray:
        return np.repeat(np.arange(self.nfeat.size), self.nfeat)

    def rows_with(self, feature_mask: np.ndarray) -> np.ndarray:
        """Rows (bool [n]) holding at least one feature of ``feature_mask``."""
        rows = np.zeros(self.nfeat.size, bool)
        rows[self.row_of[feature_mask]] = True
        return rows


class _Problems:
    """Problems by line (0-based in the file); a row flagged once keeps its first problem."""

    def __init__(self, lines: _Lines) -> None:
        self.lines = lines
        self.by_line: dict[int, str] = {}
        self.flagged = np.zeros(0, bool)  # by row of the parsed lines, sized by parse()

    def flag(self, rows: np.ndarray, reason: str | Callable[[int], str]) -> None:
        for r in np.flatnonzero(rows & ~self.flagged):
            line = int(self.lines.line_no[r])
            self.by_line[line] = reason(int(r)) if callable(reason) else reason
        self.flagged[rows] = True

    def messages(self, file: str) -> list[str]:
        return [f"{file}:{i + 1}: {self.by_line[i]}" for i in sorted(self.by_line)]


@dataclass
class ParsedText:
    """One parsed chunk: its good rows, one message per bad line, and the blank lines skipped."""

    batch: Batch
    bad: list[str]
    blank_lines: int


class TextParser:
    """Parses the chunks of one read; a dense input's row width carries from chunk to chunk."""

    def __init__(self, opts: DataOptions) -> None:
        self.fmt = TextFormat.from_options(opts)
        self.sid = opts.sid  # a sample id first on each line: read by the driver, not here
        # -1 until the first row fixes it, unless ml.feature.index.range gives it.
        self.dense_width = self.fmt.index_range if self.fmt.kind == "dense" else -1

    def parse(self, file: str, lines: pa.Array, line_no: np.ndarray, offset: int) -> ParsedText:
        """Parse ``lines`` (numbered ``line_no`` in ``file``, which starts at line index ``offset``)."""
        whole = None
        if self.sid:
            whole = lines
            lines = pc.replace_substring_regex(lines, r"^\s*\S+", "", max_replacements=1)
        chunk = _Lines(lines, line_no, whole)
        problems = _Problems(chunk)
        self._match(chunk, problems)
        flat, counts = self._tokens(chunk)
        blank = counts == 0
        if blank.any():
            # Blank lines have no tokens: dropping their rows leaves the tokens as they are.
            counts = counts[~blank]
            chunk.keep(~blank)
        if counts.size == 0:
            return ParsedText(Batch.empty(), problems.messages(file), int(blank.sum()))
        feats = self._features(flat, counts)
        problems.flagged = np.zeros(counts.size, bool)
        self._check(feats, problems)
        batch = Batch(
            labels=feats.labels.astype(np.float32),
            indptr=feats.indptr,
            ids=feats.ids.astype(np.int64, copy=False),
            values=feats.values.astype(np.float32),
            row_index=chunk.line_no + offset,
        )
        if problems.flagged.any():
            batch = batch.take(~problems.flagged)
        return ParsedText(batch, problems.messages(file), int(blank.sum()))

    def _match(self, chunk: _Lines, problems: _Problems) -> None:
        """Drop the lines the format's regular expression rejects, with their messages."""
        good = pc.match_substring_regex(chunk.lines, self.fmt.line_rx)
        good = good.to_numpy(zero_copy_only=False)
        if good.all():
            return
        fmt = self.fmt
        for r in np.flatnonzero(~good):
            line = int(chunk.line_no[r])
            raw = chunk.lines[int(r)].as_py() or b""
            why = why_bad(
                raw,
                fmt.kind,
                fmt.has_label,
                fmt.sep,
                fmt.whitespace,
                sid=fmt.sid,
                index_range=fmt.index_range,
            )
            shape = f"expected {fmt.expected}, got '{chunk.shown(int(r))}'"
            other = looks_like(
                raw, fmt.kind, fmt.has_label, fmt.sep, fmt.whitespace, fmt.index_range
            )
            if other is not None:  # a whole file in another format, most likely
                shape += f"; the line is {other}: {FORMAT_HINT}{other}?"
            problems.by_line[line] = f"{why}; {shape}" if why else shape
        chunk.keep(good)

    def _tokens(self, chunk: _Lines) -> tuple[pa.Array, np.ndarray]:
        """(all tokens, tokens per line) of the good lines."""
        if len(chunk.lines) == 0:
            return pa.array([], pa.string()), np.zeros(0, np.int64)
        # Good lines are ASCII (the regular expression admits nothing else), so valid UTF-8.
        if self.fmt.sep_bytes is not None:
            return _tokenize(chunk.lines, self.fmt.sep_bytes)
        return _regex_tokenize(chunk.lines, self.fmt)

    def _features(self, flat: pa.Array, counts: np.ndarray) -> _Features:
        """Labels, CSR layout, ids and values from the tokens (``counts`` per line, none blank)."""
        kind, n = self.fmt.kind, counts.size
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        first_feature = starts[:-1]
        if self.fmt.has_label:
            labels = _to_float(flat.take(pa.array(first_feature)))
            first_feature = first_feature + 1
            counts = counts - 1
        else:
            labels = np.full(n, np.nan)
        per = 2 if kind == "libsvm" else 1
        nfeat = counts // per
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(nfeat, out=indptr[1:])
        # Token position of every feature: its row's first feature token plus per * rank in row.
        rank = np.arange(indptr[-1], dtype=np.int64) - np.repeat(indptr[:-1], nfeat)
        pos = np.repeat(first_feature, nfeat) + per * rank
        too_long = np.zeros(rank.size, bool)
        if kind == "dense":
            return _Features(
                labels, nfeat, indptr, rank, _to_float(flat.take(pa.array(pos))), too_long
            )
        id_tok = flat.take(pa.array(pos))
        too_long = pc.greater(pc.utf8_length(id_tok), 18).to_numpy(zero_copy_only=False)
        if too_long.any():
            # Ids beyond int64 would fail the cast without telling where: flag those tokens.
            id_tok = pc.if_else(pa.array(too_long), "0", id_tok)
        ids = pc.cast(id_tok, pa.int64()).to_numpy()
        if kind == "libsvm":
            values = _to_float(flat.take(pa.array(pos + 1)))
            ids = ids - 1
        else:
            values = np.ones(ids.shape[0], np.float64)
        return _Features(labels, nfeat, indptr, ids, values, too_long)

    def _check(self, feats: _Features, problems: _Problems) -> None:
        """Flag the rows that parsed but break a rule, first problem first."""
        chunk = problems.lines
        if self.fmt.has_label:
            problems.flag(
                ~np.isfinite(feats.labels),
                lambda r: f"the label is not a finite number, got '{chunk.shown(r)}'",
            )
        vbad = ~np.isfinite(feats.values) | (np.abs(feats.values) > np.finfo(np.float32).max)
        if vbad.any():
            problems.flag(feats.rows_with(vbad), "a feature value is not a finite float32 number")
            # The row is dropped (or the read stops): zeros avoid an overflow in the cast.
            feats.values = np.where(vbad, 0.0, feats.values)
        if self.fmt.kind == "dense":
            self._check_dense_width(feats, problems)
        else:
            self._check_ids(feats, problems)
        field_num = self.fmt.field_num
        if field_num > 0:
            problems.flag(
                feats.nfeat != field_num,
                lambda r: (
                    f"expected exactly ml.fm.field.num={field_num} features, "
                    f"got {int(feats.nfeat[r])}"
                ),
            )

    def _check_ids(self, feats: _Features, problems: _Problems) -> None:
        kind, index_range = self.fmt.kind, self.fmt.index_range
        base = 1 if kind == "libsvm" else 0
        if feats.too_long.any():
            problems.flag(
                feats.rows_with(feats.too_long),
                "a feature id has more than 18 digits (ids must fit a 64-bit integer)",
            )
        if kind == "libsvm":
            problems.flag(
                feats.rows_with((feats.ids < 0) & ~feats.too_long),
                "feature id 0: libsvm ids start at 1 (ml.data.type=dummy reads 0-based ids)",
            )
        repeats = first_repeats(feats.ids, feats.nfeat)
        if repeats:
            rows = np.zeros(feats.nfeat.size, bool)
            rows[list(repeats)] = True
            problems.flag(
                rows,
                lambda r: (
                    f"feature id {repeats[r] + base} appears more than once "
                    "(a line holds each id at most once)"
                ),
            )
        if index_range <= 0:
            return
        over = feats.ids >= index_range
        if not over.any():
            return
        first_over: dict[int, int] = {}
        for r, i in zip(feats.row_of[over], feats.ids[over], strict=True):
            first_over.setdefault(int(r), int(i))
        problems.flag(
            feats.rows_with(over),
            lambda r: (
                f"feature id {first_over[r] + base} is outside ml.feature.index.range="
                f"{index_range} (valid ids in a {kind} file: {base}..{index_range - 1 + base})"
            ),
        )

    def _check_dense_width(self, feats: _Features, problems: _Problems) -> None:
        if self.dense_width < 0:
            self.dense_width = int(feats.nfeat[0])
        width = self.dense_width
        src = "ml.feature.index.range" if self.fmt.index_range > 0 else "the first row"
        problems.flag(
            feats.nfeat != width,
            lambda r: f"expected {width} values (as {src}), got {int(feats.nfeat[r])}",
        )
