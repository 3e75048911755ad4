"""The host cost of one upload to a CUDA device: a new pinned block from torch's caching host
allocator for each (angelps before learners/worker/pinned.py) against a reused pinned buffer
(``to_device`` now), for the sizes of a step's uploads (labels, a batch's ids, a device tier's
missed rows), one thread alone and two threads at once (a worker's training and update threads).

Each figure is the median over repeats of the host microseconds one upload takes (staging
and queueing the copy; the GPU copies meanwhile), with the stream kept busy by a matrix
product every few uploads, as a training step keeps it.

    python bench/pinned_upload.py [--calls N] [--repeats R] [--json PATH]

Needs a CUDA device (it says so and exits 2 otherwise).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learners.worker.device import to_device

#: bytes of the uploads measured: a batch's labels, a field model's batch ids (8,192 x 26),
#: a device tier's missed rows (66k rows of 24 floats), a large one
SIZES = [32 << 10, 1_703_936, 6_336_000, 32 << 20]


def fresh_block(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """The upload as it was: a new pinned block for each."""
    h = torch.empty(a.shape, dtype=torch.int64, pin_memory=True)
    h.numpy()[...] = a
    return h.to(device, non_blocking=True)


def per_call_us(
    up: Callable[[np.ndarray, torch.device], torch.Tensor], nbytes: int, calls: int, threads: int
) -> float:
    """Host microseconds an upload takes, each of ``threads`` threads making ``calls``."""
    dev = torch.device("cuda")
    busy = torch.randn(1024, 1024, device=dev)
    a = np.arange(nbytes // 8, dtype=np.int64)
    times: list[float] = []

    def run() -> None:
        t0 = time.perf_counter()
        for i in range(calls):
            up(a, dev)
            if i % 4 == 0:
                torch.mm(busy, busy)
        times.append((time.perf_counter() - t0) / calls)

    for _ in range(2):  # (warm: the allocators' pools, the rings)
        up(a, dev)
    torch.cuda.synchronize()
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    torch.cuda.synchronize()
    return 1e6 * statistics.mean(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/pinned_upload.py needs a CUDA device; none is available here")
        return 2
    rows = []
    for nbytes in SIZES:
        for threads in (1, 2):
            got = {}
            for name, up in (("fresh_block", fresh_block), ("reused_buffer", to_device)):
                runs = [per_call_us(up, nbytes, args.calls, threads) for _ in range(args.repeats)]
                got[name] = statistics.median(runs)
            rows.append(
                {"bytes": nbytes, "threads": threads, **{f"{k}_us": v for k, v in got.items()}}
            )
            print(
                f"{nbytes:>10} B  {threads} thread(s): new pinned block {got['fresh_block']:8.1f} us,"
                f" reused buffer {got['reused_buffer']:8.1f} us"
            )
    if args.json:
        meta = {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(),
            "python": platform.python_version(),
            "calls": args.calls,
            "repeats": args.repeats,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
