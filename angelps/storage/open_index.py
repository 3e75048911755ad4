"""An open-addressing key index that stores only int32 slots: key -> slot for a whole batch.

The keys themselves are not stored here: a sparse table already keeps the key of every slot
(:class:`angelps.storage.table_rows.Table`'s ``keys``), so a bucket holds ``slot + 1`` (0 =
empty) and a probe compares ``key_at(slot) == key``. That is 4 bytes a bucket where pandas'
khash (key, value and flags) takes about 32 bytes a row; with the load kept between
:data:`LOW_LOAD` and :data:`MAX_LOAD` the index costs 5.3-8 bytes a row.

Layout: ``cap`` buckets (any size, not a power of two, so growth can be by 1.5x); a key's home
bucket is the top 32 bits of ``key * 0x9E3779B97F4A7C15`` (Fibonacci hashing: consecutive keys
and keys spread over all of int64 both scatter) scaled to ``cap`` (Lemire's multiply-shift);
collisions go to the next bucket (linear probing, wrapping at ``cap``). Linear probing keeps a
key before the first empty bucket after its home, which is what lets a whole batch be probed
with numpy: the first round looks at every key's home bucket (most keys end there), the later
rounds look at a window of buckets per key still unresolved (2-D gathers), so the long tail of
a batch costs a few numpy calls instead of one Python round per bucket.

Insertion (of absent, unique keys: the table creates a row for each) claims the first empty
bucket by writing and reading back: where several keys of a batch want the same bucket, one
write wins and the others probe on. Deletion is a rebuild (expiry renumbers the slots).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["LOW_LOAD", "MAX_LOAD", "OpenIndex"]

#: The load (keys / buckets) that triggers growth, and the load right after growth.
MAX_LOAD = 0.75
LOW_LOAD = 0.5
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_WINDOW = 8  # buckets per key in the rounds of the tail
_SMALL = 1024  # open keys below which a round probes a window
_CHUNK = 1 << 22  # buckets rehashed at once when growing (bounds the temporary arrays)
_MIN_CAP = 64


class OpenIndex:
    """key -> slot, buckets of int32 ``slot + 1``; keys read through ``key_at(slots)``."""

    kind = "hash"

    def __init__(self, key_at: Callable[[np.ndarray], np.ndarray], size_hint: int = 0) -> None:
        self.key_at = key_at
        self.count = 0
        self.buckets = np.zeros(_capacity_for(size_hint), dtype=np.int32)

    @property
    def capacity(self) -> int:
        return len(self.buckets)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """The home bucket of each key (int64)."""
        h = keys.view(np.uint64) * _GOLDEN  # wraps modulo 2^64
        h >>= np.uint64(32)
        h *= np.uint64(len(self.buckets))
        h >>= np.uint64(32)
        return h.view(np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slots of ``keys`` (int64), -1 where absent."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.full(len(keys), -1, dtype=np.int64)
        if not len(keys) or not self.count:
            return out
        cap = len(self.buckets)
        b = self.buckets
        todo = np.arange(len(keys))
        pos = self._home(keys)
        want = keys
        # One bucket a key per round while many keys are open (most end at their home bucket).
        while len(todo) > _SMALL:
            s = b.take(pos)
            held = s != 0
            if not held.all():  # an empty bucket: the key is absent
                todo, pos, want, s = todo[held], pos[held], want[held], s[held]
            slots = s.astype(np.int64)
            slots -= 1
            match = self.key_at(slots) == want
            out[todo[match]] = slots[match]
            miss = ~match
            todo, pos, want = todo[miss], pos[miss] + 1, want[miss]
            pos[pos == cap] = 0
        # The tail: a window of buckets a key per round (2-D gathers).
        step = np.arange(_WINDOW, dtype=np.int64)
        while len(todo):
            win = pos[:, None] + step
            win[win >= cap] -= cap
            s = b.take(win)
            empty = s == 0
            slots = s.astype(np.int64)
            slots -= 1
            hit = np.zeros(s.shape, dtype=bool)
            full = ~empty
            hit[full] = self.key_at(slots[full]) == np.broadcast_to(want[:, None], s.shape)[full]
            stop = hit | empty
            first = stop.argmax(axis=1)
            rows = np.arange(len(todo))
            done = stop[rows, first]
            found = hit[rows, first]
            out[todo[found]] = slots[rows[found], first[found]]
            keep = ~done
            todo, pos, want = todo[keep], pos[keep] + _WINDOW, want[keep]
            pos[pos >= cap] -= cap
        return out

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Map the (absent, unique) ``keys`` to ``slots``."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if not len(keys):
            return
        if int(np.max(slots)) >= np.iinfo(np.int32).max:
            raise ValueError(f"a shard's table holds at most {np.iinfo(np.int32).max - 1} rows")
        need = self.count + len(keys)
        if need > MAX_LOAD * len(self.buckets):
            self._grow(need)
        self._place(keys, np.asarray(slots, dtype=np.int64).astype(np.int32) + 1)
        self.count = need

    def _place(self, keys: np.ndarray, tags: np.ndarray) -> None:
        """Write ``tags`` (slot + 1) into the first free bucket of each key's probe sequence."""
        cap = len(self.buckets)
        b = self.buckets
        pos = self._home(keys)
        todo = np.arange(len(keys))
        step = np.arange(_WINDOW, dtype=np.int64)
        while len(todo):
            if len(todo) > _SMALL:  # one bucket a key
                cand = pos
                free = b.take(cand) == 0
                nxt = pos + 1
            else:  # the tail: the first empty bucket in a window
                win = pos[:, None] + step
                win[win >= cap] -= cap
                empty = b.take(win) == 0
                first = empty.argmax(axis=1)
                rows = np.arange(len(todo))
                free = empty[rows, first]
                cand = win[rows, first]
                nxt = np.where(free, cand, pos + _WINDOW)
            want = cand[free]
            t = tags[todo[free]]
            b[want] = t  # several keys may want one bucket: one write wins
            won = b.take(want) == t
            keep = np.ones(len(todo), dtype=bool)
            keep[np.flatnonzero(free)[won]] = False
            # The others go on past a taken bucket (the one they lost, or a full window).
            todo, pos = todo[keep], nxt[keep]
            pos[pos >= cap] -= cap

    def _grow(self, need: int) -> None:
        """Rehash into ``need / LOW_LOAD`` buckets, a chunk of old buckets at a time.

        A key's home is its hash scaled to the capacity, so the old buckets, read in order,
        hold the keys nearly in the order of their new homes (only a probe's displacement
        apart): sorted by new home within a chunk, they are laid as runs, each key at
        ``p_i = max(h_i, p_{i-1} + 1)`` (= ``i + cummax(h_j - j)``), every bucket from its home
        to its place full, as a probe needs. Four sequential passes a key, where probing them
        in took a dozen random ones (2.4 s at 36M keys). The few keys a run cannot take (homes
        behind a run already laid, places past the last bucket, the old table's leading run,
        which may hold keys wrapped from its end) are probed in after."""
        old = self.buckets
        cap = _capacity_for(need)
        new = np.zeros(cap, dtype=np.int32)
        self.buckets = new
        lead = int(np.argmax(old == 0))  # growth happens below MAX_LOAD: one is empty
        later = [old[:lead][old[:lead] != 0]]
        floor = 0  # the first bucket no run has passed yet
        for a in range(lead, len(old), _CHUNK):
            tags = old[a : a + _CHUNK]
            tags = tags[tags != 0]
            if not len(tags):
                continue
            home = self._home(self.key_at(tags.astype(np.int64) - 1))
            order = np.argsort(home, kind="stable")  # nearly sorted: a merge sort's best case
            home, tags = home[order], tags[order]
            behind = home < floor
            if behind.any():
                later.append(tags[behind])
                home, tags = home[~behind], tags[~behind]
            if not len(tags):
                continue
            i = np.arange(len(home), dtype=np.int64)
            home -= i
            np.maximum(home, floor, out=home)
            pos = np.maximum.accumulate(home)
            pos += i
            past = pos >= cap
            if past.any():
                later.append(tags[past])
                pos, tags = pos[~past], tags[~past]
            if len(pos):
                new[pos] = tags
                floor = int(pos[-1]) + 1
        rest = np.concatenate(later)
        if len(rest):
            self._place(self.key_at(rest.astype(np.int64) - 1), rest)

    def rebuild(self, keys: np.ndarray) -> None:
        """Only ``keys[i] -> i`` (after rows were removed and the rest renumbered)."""
        self.buckets = np.zeros(_capacity_for(len(keys)), dtype=np.int32)
        self.count = 0
        if len(keys):
            self.insert(keys, np.arange(len(keys), dtype=np.int64))

    def check_owned(self, name: str, keys: np.ndarray) -> None:
        """Any int64 key may be held."""

    def nbytes(self) -> int:
        return int(self.buckets.nbytes)


def _capacity_for(n: int) -> int:
    return max(_MIN_CAP, math.ceil(n / LOW_LOAD))
