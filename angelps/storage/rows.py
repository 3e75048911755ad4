"""Row storage by slot: ``[slots, width]`` of one dtype, each row's weights and optimizer state
side by side (one gather fetches both).

:class:`PagedRows` (host numpy) keeps the rows in pages of a fixed number of rows (about
:data:`PAGE_BYTES` each); the first page grows by doubling up to that size, so small tables stay
small, and after it growth only adds zeroed pages: it never copies the table. A page comes from
``np.zeros`` (calloc), so a slot's memory is faulted in when it is first written. A gather or
scatter over several pages groups the slots by page (a radix sort of 16-bit page numbers) and
works page by page. :class:`TorchRows` keeps one tensor on a torch device (a GPU shard), grown
by doubling; torch is imported when one is made (a CPU shard never loads it).

Both are a :class:`RowStore`: the same few operations on slot arrays: ``gather``, ``scatter``,
``write`` (a contiguous range), ``move`` (compaction after rows are removed), ``reserve``,
``truncate``; and a block of whole rows for the optimizer to update in place where the rows
live (``gather_block``, ``as_block``, ``scatter_block``: numpy on the host, a tensor on the
device), so a table never asks which one it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["PAGE_BYTES", "PagedRows", "RowStore", "TorchRows", "as_rows"]

#: Bytes of one page of rows (the page holds the largest power-of-two rows that fit).
PAGE_BYTES = 1 << 28
_FIRST = 1024  # rows of the first page when it is first allocated


class RowStore(Protocol):
    """``[capacity, width]`` rows of one dtype by slot, on the host or on a device."""

    width: int
    dtype: np.dtype

    @property
    def capacity(self) -> int: ...

    def nbytes(self, rows: int | None = None) -> int:
        """Bytes held; with ``rows``, of the first ``rows`` rows where that is less."""
        ...

    def reserve(self, n: int) -> None: ...

    def truncate(self, n: int) -> None: ...

    def block(self, a: int, b: int) -> Any:
        """Rows ``a:b`` as a view (numpy or tensor) for an initialisation in place."""
        ...

    def gather(self, slots: np.ndarray, cols: int | None = None) -> np.ndarray: ...

    def scatter(self, slots: np.ndarray, values: np.ndarray) -> None: ...

    def gather_into(self, slots: np.ndarray, out: np.ndarray) -> None:
        """``out[:] = rows[slots]`` (whole rows; ``out`` contiguous): a part of a gather split
        over threads (:mod:`angelps.storage.row_threads`) writes its own slice."""
        ...

    def write(self, start: int, values: np.ndarray) -> None: ...

    def read(self, start: int, end: int, cols: int | None = None) -> np.ndarray: ...

    def move(self, dst: np.ndarray, src: np.ndarray) -> None: ...

    def gather_block(self, slots: np.ndarray) -> Any:
        """The rows of ``slots`` where they live (numpy, or a tensor on the device)."""
        ...

    def as_block(self, values: np.ndarray) -> Any:
        """Host ``values`` (gradients) beside a :meth:`gather_block` result."""
        ...

    def scatter_block(self, slots: np.ndarray, block: Any) -> None:
        """Write back a block from :meth:`gather_block` (updated in place)."""
        ...


class PagedRows:
    """``[capacity, width]`` rows of ``dtype`` in pages of ``page_rows`` rows."""

    def __init__(self, width: int, dtype: Any, page_rows: int | None = None) -> None:
        self.width = width
        self.dtype = np.dtype(dtype)
        if page_rows is None:
            page_rows = 1 << max(4, (PAGE_BYTES // (width * self.dtype.itemsize)).bit_length() - 1)
        self.shift = page_rows.bit_length() - 1
        self.page_rows = 1 << self.shift
        self.mask = self.page_rows - 1
        self.pages: list[np.ndarray] = []

    @classmethod
    def fixed(cls, n: int, width: int, dtype: Any) -> PagedRows:
        """Exactly ``n`` zero rows in one page (a dense table's block)."""
        rows = cls(width, dtype, page_rows=1 << max(0, (n - 1).bit_length()))
        rows.pages = [np.zeros((n, width), dtype=rows.dtype)]
        return rows

    @property
    def capacity(self) -> int:
        if len(self.pages) <= 1:
            return len(self.pages[0]) if self.pages else 0
        return len(self.pages) * self.page_rows

    def nbytes(self, rows: int | None = None) -> int:
        """Bytes of the pages; with ``rows``, of the first ``rows`` rows alone: pages come
        from calloc, so the OS backs only the part written (a new page's unwritten tail
        takes no memory, whatever its size)."""
        if rows is None:
            return sum(p.nbytes for p in self.pages)
        return min(rows, self.capacity) * self.width * self.dtype.itemsize

    def reserve(self, n: int) -> None:
        """Capacity for at least ``n`` rows (the rows added are zero)."""
        need = ((n - 1) >> self.shift) + 1 if n > 0 else 0
        if need == 0 or (need <= len(self.pages) and n <= self.capacity):
            return
        if len(self.pages) == 1 and len(self.pages[0]) < self.page_rows:
            first = self.pages[0]  # still doubling: copy the (small) first page
            rows = self.page_rows if need > 1 else min(self.page_rows, max(2 * len(first), n))
            grown = np.zeros((rows, self.width), dtype=self.dtype)
            grown[: len(first)] = first
            self.pages[0] = grown
        elif not self.pages:
            rows = self.page_rows if need > 1 else min(self.page_rows, max(_FIRST, n))
            self.pages.append(np.zeros((rows, self.width), dtype=self.dtype))
        while len(self.pages) < need:
            self.pages.append(np.zeros((self.page_rows, self.width), dtype=self.dtype))

    def truncate(self, n: int) -> None:
        """Drop the pages past the first ``n`` rows."""
        need = ((n - 1) >> self.shift) + 1 if n > 0 else 0
        del self.pages[need:]

    def block(self, a: int, b: int) -> np.ndarray:
        """A view of rows ``[a, b)`` inside one page (dense tables: one page)."""
        return self.pages[0][a:b]

    def _by_page(self, slots: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        """``order`` grouping ``slots`` by page, and (page, start, end) runs of ``order``."""
        page = (slots >> self.shift).astype(np.uint16)
        order = np.argsort(page, kind="stable")  # a radix sort for 16-bit values
        counts = np.bincount(page, minlength=len(self.pages))
        ends = np.cumsum(counts)
        runs = [(int(p), int(ends[p] - counts[p]), int(ends[p])) for p in np.flatnonzero(counts)]
        return order, runs

    def gather(self, slots: np.ndarray, cols: int | None = None) -> np.ndarray:
        """Rows ``slots`` (their first ``cols`` columns), a new contiguous array.

        Whole rows are taken (``take`` of a strided column slice was 20x slower here) and the
        columns cut afterwards."""
        if len(self.pages) == 1:
            out = self.pages[0].take(slots, axis=0)
        else:
            out = np.empty((len(slots), self.width), dtype=self.dtype)
            self.gather_into(slots, out)
        if cols is None or cols == self.width:
            return out
        return np.ascontiguousarray(out[:, :cols])

    def gather_into(self, slots: np.ndarray, out: np.ndarray) -> None:
        if len(self.pages) == 1:
            # (mode "clip": with "raise" numpy copies through a buffer the size of ``out``)
            self.pages[0].take(slots, axis=0, out=out, mode="clip")
            return
        order, runs = self._by_page(slots)
        flat = as_rows(out)
        for p, a, b in runs:
            sel = order[a:b]
            np.put(flat, sel, as_rows(self.pages[p].take(slots[sel] & self.mask, axis=0)))

    def take1(self, slots: np.ndarray) -> np.ndarray:
        """Column 0 of rows ``slots`` as a 1-D array (a one-column store such as a table's
        keys: the key index reads them on every probe, so no sort by page, a mask per page)."""
        if len(self.pages) == 1:
            return self.pages[0][:, 0].take(slots)
        out = np.empty(len(slots), dtype=self.dtype)
        page = slots >> self.shift
        for p, rows in enumerate(self.pages):
            sel = page == p
            if sel.any():
                out[sel] = rows[:, 0].take(slots[sel] & self.mask)
        return out

    def scatter(self, slots: np.ndarray, values: np.ndarray) -> None:
        """``rows[slots] = values`` (``np.put`` of whole rows: 3x faster than ``a[i] = v``)."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if len(self.pages) == 1:
            np.put(as_rows(self.pages[0]), slots, as_rows(values))
            return
        order, runs = self._by_page(slots)
        for p, a, b in runs:
            sel = order[a:b]
            np.put(
                as_rows(self.pages[p]), slots[sel] & self.mask, as_rows(values.take(sel, axis=0))
            )

    def write(self, start: int, values: np.ndarray) -> None:
        """``rows[start : start + len(values)] = values`` (capacity must be there)."""
        pos = 0
        while pos < len(values):
            slot = start + pos
            p, off = slot >> self.shift, slot & self.mask
            take = min(len(values) - pos, len(self.pages[p]) - off)
            self.pages[p][off : off + take] = values[pos : pos + take]
            pos += take

    def read(self, start: int, end: int, cols: int | None = None) -> np.ndarray:
        """A contiguous copy of ``rows[start:end]`` (their first ``cols`` columns)."""
        if len(self.pages) == 1:
            return np.array(self.pages[0][start:end, :cols])
        # Page by page (a slice of each): a table's keys and a backup's snapshot are read so,
        # with no slot array and no sort by page.
        out = np.empty((max(end - start, 0), self.width if cols is None else cols), self.dtype)
        pos = start
        while pos < end:
            p, off = pos >> self.shift, pos & self.mask
            take = min(end - pos, self.page_rows - off)
            out[pos - start : pos - start + take] = self.pages[p][off : off + take, :cols]
            pos += take
        return out

    def move(self, dst: np.ndarray, src: np.ndarray) -> None:
        """``rows[dst] = rows[src]`` where ``dst[i] <= src[i]`` and both increase (compaction):
        in chunks, so no second copy of the table is made."""
        chunk = self.page_rows
        for a in range(0, len(src), chunk):
            self.scatter(dst[a : a + chunk], self.gather(src[a : a + chunk]))

    def gather_block(self, slots: np.ndarray) -> np.ndarray:
        return self.gather(slots)

    def as_block(self, values: np.ndarray) -> np.ndarray:
        return values

    def scatter_block(self, slots: np.ndarray, block: np.ndarray) -> None:
        self.scatter(slots, block)


class TorchRows:
    """``[capacity, width]`` rows as one tensor on ``device``, grown by doubling."""

    def __init__(self, width: int, dtype: Any, device: str) -> None:
        import torch

        self._torch = torch
        self.width = width
        self.dtype = np.dtype(dtype)
        self.device = self._torch.device(device)
        self.t = self._torch.zeros((0, width), dtype=_torch_dtype(self.dtype), device=self.device)

    @property
    def capacity(self) -> int:
        return int(self.t.shape[0])

    def nbytes(self, rows: int | None = None) -> int:
        """Bytes of the tensor, whatever ``rows``: device memory is held whole."""
        return int(self.t.numel() * self.t.element_size())

    def reserve(self, n: int) -> None:
        cap = self.capacity
        if n <= cap:
            return
        rows = max(n, 2 * cap, _FIRST)
        grown = self._torch.zeros((rows, self.width), dtype=self.t.dtype, device=self.device)
        grown[:cap] = self.t
        self.t = grown

    def truncate(self, n: int) -> None:
        """Rows past ``n`` stay allocated (device memory is grown by doubling only)."""

    def block(self, a: int, b: int) -> torch.Tensor:
        return self.t[a:b]

    def _idx(self, slots: np.ndarray) -> torch.Tensor:
        return self._torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)

    def gather_t(self, slots: np.ndarray) -> torch.Tensor:
        return self.t.index_select(0, self._idx(slots))

    def scatter_t(self, slots: np.ndarray, values: torch.Tensor) -> None:
        self.t.index_copy_(0, self._idx(slots), values)

    def gather(self, slots: np.ndarray, cols: int | None = None) -> np.ndarray:
        out = self.gather_t(slots)
        return host(out if cols is None else out[:, :cols])

    def scatter(self, slots: np.ndarray, values: np.ndarray) -> None:
        self.scatter_t(slots, self.tensor(values))

    def gather_into(self, slots: np.ndarray, out: np.ndarray) -> None:
        out[:] = self.gather(slots)

    def tensor(self, values: np.ndarray) -> torch.Tensor:
        return self._torch.from_numpy(np.ascontiguousarray(values)).to(self.device)

    def write(self, start: int, values: np.ndarray) -> None:
        self.t[start : start + len(values)] = self.tensor(values)

    def read(self, start: int, end: int, cols: int | None = None) -> np.ndarray:
        return host(self.t[start:end, :cols])

    def move(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.scatter_t(dst, self.gather_t(src))

    def gather_block(self, slots: np.ndarray) -> torch.Tensor:
        return self.gather_t(slots)

    def as_block(self, values: np.ndarray) -> torch.Tensor:
        return self.tensor(values)

    def scatter_block(self, slots: np.ndarray, block: torch.Tensor) -> None:
        self.scatter_t(slots, block)


def as_rows(a: np.ndarray) -> np.ndarray:
    """A contiguous 2-D array as a 1-D array of opaque rows (one element a row)."""
    return a.view(np.dtype((np.void, a.shape[1] * a.dtype.itemsize))).reshape(-1)


def host(t: torch.Tensor) -> np.ndarray:
    """A host numpy copy (never a view of the table, also for tensors already on the CPU)."""
    return t.to("cpu", copy=True).contiguous().numpy()  # type: ignore[no-any-return]


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    import torch

    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
