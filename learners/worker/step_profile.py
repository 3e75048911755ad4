"""torch's profiler over a few optimizer updates of a worker (``angel.worker.profile.updates``).

A worker on a GPU is bound by its training thread's host work: the torch calls it makes and
the CUDA runtime calls under them (launches, copies, synchronisations), most of it with the
GIL released, where a Python sampler sees only the line that called. This profiles updates
``skip .. skip + updates - 1`` of the worker (counted from its first), on the training thread
(torch's profiler records the thread that started it; the update thread's calls are not in
it), and writes two files under ``angel.log.path``:

* ``profile-worker<k>.txt``: a table of every operator and CUDA runtime call (``cudaLaunchKernel``,
  ``cudaMemcpyAsync``, ``cudaStreamSynchronize``, ...) by self CPU time, per update;
* ``profile-worker<k>.json``: per update, the operators called and their self CPU time, the
  CUDA runtime's calls by name, and the twenty costliest entries.

The driver's work between two chunks of updates (progress, validation) is left out: the
profiler stops at a chunk's end and starts again with the next chunk's first update.

The CPU runs the same code (the counts of a GPU step's torch calls, measured where there is no
GPU); a profile costs those updates some speed, so a benchmark's figures leave it off.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from learners.job.loop_options import TrainPlan

__all__ = ["StepProfile"]


class StepProfile:
    """Counts a worker's updates and profiles ``updates`` of them after the first ``skip``."""

    def __init__(self, updates: int, skip: int, out_dir: str, worker_id: int) -> None:
        self.updates, self.skip = updates, skip
        self.path = os.path.join(out_dir, f"profile-worker{worker_id}")
        self.seen = 0  # (updates begun so far)
        self._prof: profile | None = None
        self._in_prof = 0  # (updates of the profile running)
        self._done = 0  # (updates profiled before it)
        #: entry name -> [calls, self CPU microseconds] over the updates profiled
        self._totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        #: the summary written, once the profile is done
        self.summary: dict[str, Any] | None = None

    @classmethod
    def of(cls, plan: TrainPlan, worker_id: int) -> StepProfile:
        """Worker ``worker_id``'s, as ``plan`` says (``angel.worker.profile.*``)."""
        feed = plan.feed
        return cls(feed.profile_updates, feed.profile_skip, plan.log_dir, worker_id)

    def tick(self) -> None:
        """One update begins (call before each): starts, or ends, the profile at its bounds."""
        if self.updates <= 0 or self.summary is not None:
            return
        if self._prof is not None and self._done + self._in_prof == self.updates:
            self.pause()
            return
        if self._prof is None and self.seen >= self.skip:
            acts = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(ProfilerActivity.CUDA)
            self._prof = profile(activities=acts)
            self._prof.__enter__()
        self.seen += 1
        if self._prof is not None:
            self._in_prof += 1

    def pause(self) -> None:
        """Stop the profile in progress (a chunk ended, or its last update did): its counts
        are added up; the files are written once every update asked for is profiled."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # (the updates' work done, so their records are complete)
        prof.__exit__(None, None, None)
        for e in prof.key_averages():
            t = self._totals[e.key]
            t[0] += e.count
            t[1] += e.self_cpu_time_total
        self._done, self._in_prof = self._done + self._in_prof, 0
        if self._done >= self.updates:
            self._write()

    def _write(self) -> None:
        n = max(self._done, 1)
        per = {k: (c / n, us / n) for k, (c, us) in self._totals.items()}
        ops = {k: v for k, v in per.items() if k.startswith("aten::")}
        order = sorted(per, key=lambda k: per[k][1], reverse=True)
        self.summary = {
            "updates": self._done,
            "ops_per_update": sum(c for c, _ in ops.values()),
            "op_self_cpu_us_per_update": sum(us for _, us in ops.values()),
            "self_cpu_us_per_update": sum(us for _, us in per.values()),
            "cuda_runtime_calls_per_update": {
                k: c for k, (c, _) in per.items() if k.startswith("cuda")
            },
            "top": [
                {"name": k, "calls_per_update": per[k][0], "self_cpu_us_per_update": per[k][1]}
                for k in order[:20]
            ],
        }
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path + ".json", "w", encoding="utf-8") as f:
            json.dump(self.summary, f, indent=1)
        lines = [
            f"{self._done} updates of the training thread, torch {torch.__version__}; per update:",
            f"{'self CPU us':>12} {'calls':>8}  name",
            *(f"{per[k][1]:12.1f} {per[k][0]:8.1f}  {k}" for k in order),
        ]
        with open(self.path + ".txt", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
