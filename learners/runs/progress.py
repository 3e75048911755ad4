"""The whole-job progress bar, and the chunks of updates that keep it moving.

One bar counts every optimizer update of the job (``epoch 3/10 ... 45% 520/1150 upd
[00:12<00:15, 11.0k samples/s, loss 0.3312, lr 0.0141]``), so its estimate is the job's, not the
epoch's. It moves several times a second: the driver hands the workers chunks of updates sized
to take about :data:`CHUNK_TARGET_S` (:class:`Chunker`); and a ticker thread redraws it every
:data:`TICK_S` whatever the driver waits for (a slow update, validation, a checkpoint), so its
clock never stops. Lines printed meanwhile go above the bar (:meth:`JobBar.write`). The bar is
closed (its line cleared, the ticker stopped) at the end, on Ctrl-C and on any error: the learner
closes it in a ``finally``.

A chunk never crosses a multiple of ``angel.log.every.steps``, so metrics.jsonl still gets one
step line per that many updates (:func:`merge_chunks` sums the chunks of one line).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import shutil
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from angelconf.config import Key, non_negative
from learners.worker.chunk_stats import StepStats

__all__ = [
    "CHUNK_TARGET_S",
    "KEYS",
    "PROGRESS_EVERY",
    "TICK_S",
    "Chunker",
    "JobBar",
    "PlainProgress",
    "TrainProgress",
    "merge_chunks",
]

PROGRESS_EVERY = Key(
    "angel.log.progress.seconds",
    "float",
    30.0,
    "Where the console is not a terminal (ray job logs, a file, CI): seconds between plain "
    "progress lines (updates done, elapsed and left, samples/s, loss, lr); 0: none. A terminal "
    "gets the redrawn bar instead.",
    check=non_negative,
)
KEYS = [PROGRESS_EVERY]

#: seconds a chunk of updates should take: the bar moves several times a second
CHUNK_TARGET_S = 0.25
#: seconds between redraws of the bar's clock while a chunk runs
TICK_S = 0.5
_SUMMED = (
    "updates",
    "skipped",
    "samples",
    "loss_sum",
    "pull_s",
    "compute_s",
    "push_s",
    "wait_s",
    "cache_lookups",
    "cache_hits",
    "bytes_moved",
    "tier_lookups",
    "tier_hits",
    "tier_misses",
    "tier_writebacks",
    "tier_wait_s",
    "tier_wait_shards_s",
    "tier_ahead_wait_s",
    "tier_wait_update_s",
)


def tier_note(outs: Sequence[StepStats]) -> str:
    """The device tiers' hit rate over the workers' chunks ("" without a tier), for the
    progress line."""
    lookups = sum(o.tier_lookups for o in outs)
    if not any(o.tier_on for o in outs) or not lookups:
        return ""
    return f"tier hits {100.0 * sum(o.tier_hits for o in outs) / lookups:.0f}%"


@dataclass
class TrainProgress:
    """Where training stands: the epochs done, and early stopping's best metric so far."""

    next_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    #: the epoch (0-based) of ``best``
    best_epoch: int | None = None
    since_best: int = 0
    samples: int = 0
    train_s: float = 0.0
    stopped_early: bool = False

    def watch(self, epoch: int, value: float | None, lower_is_better: bool) -> bool:
        """Count epochs since the watched metric last improved; True when ``epoch`` is the
        best so far."""
        if value is None or not math.isfinite(value):
            return False
        sign = -1.0 if lower_is_better else 1.0
        if self.best is None or sign * value > sign * self.best:
            self.best, self.best_epoch, self.since_best = value, epoch, 0
            return True
        self.since_best += 1
        return False

    def epoch_of_best(self) -> int | None:
        """The epoch of ``best`` in the history (for checkpoints that did not record it)."""
        for row in self.history:
            if self.best is not None and self.best in row.values():
                return int(row["epoch"])
        return None


class Chunker:
    """How many updates the next ``run_steps`` call runs: about :data:`CHUNK_TARGET_S` of work
    (from the time per update measured so far), at most up to the next multiple of
    ``log_every`` and the end of the epoch."""

    def __init__(self, log_every: int, target_s: float = CHUNK_TARGET_S) -> None:
        self.log_every = log_every
        self.target_s = target_s
        self.per_update_s: float | None = None

    def next(self, done: int, updates: int) -> int:
        """The size of the chunk that starts after ``done`` of ``updates`` updates."""
        to_line = self.log_every - done % self.log_every
        limit = min(to_line, updates - done)
        if self.per_update_s is None:
            return min(limit, 1)  # measure one update first
        return max(1, min(limit, int(self.target_s / max(self.per_update_s, 1e-9))))

    def observe(self, n: int, seconds: float) -> None:
        """A chunk of ``n`` updates took ``seconds`` (wall time at the driver)."""
        per = seconds / max(n, 1)
        self.per_update_s = (
            per if self.per_update_s is None else 0.7 * self.per_update_s + 0.3 * per
        )


def merge_chunks(acc: Sequence[StepStats] | None, outs: Sequence[StepStats]) -> list[StepStats]:
    """Each worker's answers of several ``run_steps`` chunks as one: counts and times summed,
    the last step size and rates of the latest chunk that made an update."""
    if acc is None:
        return [dataclasses.replace(o) for o in outs]
    merged = []
    for a, o in zip(acc, outs, strict=True):
        m = dataclasses.replace(a, **{k: getattr(a, k) + getattr(o, k) for k in _SUMMED})
        m.elapsed_s = a.elapsed_s + o.elapsed_s
        if o.updates:
            m.last_lr = o.last_lr
            m.last_rates = o.last_rates
        merged.append(m)
    return merged


def _si(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e4 else f"{x:.0f}"


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel that can show tqdm's notebook widget (IPython
    already loaded by the kernel, ipywidgets installed)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or importlib.util.find_spec("ipywidgets") is None:
        return False
    shell = getattr(ipython, "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


class JobBar:
    """A tqdm bar over all the job's updates (``done`` of them already made, on a resume);
    ``notebook``: tqdm's notebook widget instead of a text bar."""

    def __init__(
        self,
        total: int,
        done: int,
        epochs: int,
        updates_per_epoch: int,
        file: IO[str] | None,
        ncols: int | None = None,
        notebook: bool = False,
    ) -> None:
        self.epochs, self.updates_per_epoch = epochs, updates_per_epoch
        from tqdm import tqdm  # here: the key modules import this one, and load no tqdm

        self._lock = threading.Lock()
        self._stop = threading.Event()
        if notebook:
            from tqdm.notebook import tqdm as widget

            # the widget draws its own bar: no width, no terminal format
            self.bar = widget(total=total, desc=self._desc(done), initial=done, unit="upd")
        else:
            self.bar = tqdm(
                total=total,
                desc=self._desc(done),
                initial=done,
                unit="upd",
                file=file if file is not None else sys.stderr,
                leave=False,
                # a fixed width (80 where the terminal does not say): readable, never zero
                # (a pty without a size, as some container runtimes make, says 0 columns)
                ncols=ncols or min(shutil.get_terminal_size().columns or 80, 120),
                mininterval=0.2,
                bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} upd "
                "[{elapsed}<{remaining}{postfix}]",
            )
        self._ticker = threading.Thread(target=self._tick_loop, name="angelps-bar", daemon=True)
        self._ticker.start()

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_S):
            self.tick()

    def _desc(self, done: int) -> str:
        epoch = min(done // max(self.updates_per_epoch, 1) + 1, self.epochs)
        return f"epoch {epoch}/{self.epochs}"

    def update(
        self, n: int, samples: int, seconds: float, loss: float, lr: float, note: str = ""
    ) -> None:
        """``n`` more updates of ``samples`` rows in ``seconds``; the epoch's mean loss so far
        and the step size now; ``note``: more to show (a device tier's hit rate)."""
        rate = samples / max(seconds, 1e-9)
        with self._lock:
            self.bar.set_postfix_str(
                f"{_si(rate)} samples/s, loss {loss:.4f}, lr {lr:.3g}"
                + (f", {note}" if note else ""),
                refresh=False,
            )
            self.bar.set_description_str(self._desc(self.bar.n + n), refresh=False)
            self.bar.update(n)

    def tick(self) -> None:
        """Redraw the bar (its clock moves while the driver waits)."""
        with self._lock:
            if not self.bar.disable:
                self.bar.refresh()

    def write(self, text: str, file: IO[str] | None = None) -> None:
        """A line above the bar (on stdout, or ``file``), the bar redrawn below it."""
        with self._lock:
            self.bar.clear()
            print(text, file=file or sys.stdout, flush=True)
            self.bar.refresh()

    def close(self) -> None:
        """Stop the ticker and remove the bar's line; idempotent."""
        self._stop.set()
        if self._ticker.is_alive() and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=2 * TICK_S)
        with self._lock:
            if not self.bar.disable:
                self.bar.close()


def _clock(seconds: float) -> str:
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class PlainProgress:
    """The bar's content as a plain line every ``every_s`` seconds, for output that is not a
    terminal (a redrawn bar there is one unreadable line of carriage returns)::

        progress: epoch 3/10  45% 520/1150 updates [00:12<00:15]  11.0k samples/s  loss 0.3312  lr 0.0141

    Lines come at updates only (no thread): a job that waits prints nothing new. A line's
    samples/s are those of every chunk since the line before (not of the last chunk alone: on a
    10^8-id job one chunk that met a shard's index growing showed 1.6k samples/s against about
    30k over the 30 s around it)."""

    def __init__(
        self,
        total: int,
        done: int,
        epochs: int,
        updates_per_epoch: int,
        every_s: float,
        file: IO[str] | None = None,
        clock: Any = None,
    ) -> None:
        import time

        self.total, self.n, self.start_n = total, done, done
        self.epochs, self.updates_per_epoch, self.every_s = epochs, updates_per_epoch, every_s
        self.file = file
        self._now = clock or time.monotonic
        self._t0 = self._last = self._now()
        self._samples, self._seconds = 0, 0.0  # (the chunks' since the last line)

    def update(
        self, n: int, samples: int, seconds: float, loss: float, lr: float, note: str = ""
    ) -> None:
        """As :meth:`JobBar.update`; prints a line when ``every_s`` has passed since the last."""
        self.n += n
        self._samples += samples
        self._seconds += seconds
        now = self._now()
        if now - self._last < self.every_s:
            return
        self._last = now
        samples, seconds = self._samples, self._seconds
        self._samples, self._seconds = 0, 0.0
        elapsed = now - self._t0
        made = self.n - self.start_n
        left = elapsed / made * (self.total - self.n) if made else 0.0
        epoch = min((self.n - 1) // max(self.updates_per_epoch, 1) + 1, self.epochs)
        pct = 100.0 * self.n / max(self.total, 1)
        print(
            f"progress: epoch {epoch}/{self.epochs}  {pct:3.0f}% {self.n}/{self.total} updates "
            f"[{_clock(elapsed)}<{_clock(left)}]  {_si(samples / max(seconds, 1e-9))} samples/s"
            f"  loss {loss:.4f}  lr {lr:.3g}" + (f"  {note}" if note else ""),
            file=self.file or sys.stdout,
            flush=True,
        )

    def tick(self) -> None:
        """Nothing to redraw."""

    def write(self, text: str, file: IO[str] | None = None) -> None:
        print(text, file=file or sys.stdout, flush=True)

    def close(self) -> None:
        """Nothing to clear."""
