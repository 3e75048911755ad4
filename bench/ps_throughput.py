"""Parameter-server throughput: sparse pull/push in keys/s and dense pull/push in GB/s, through
Ray shard actors and in-process (the same shards, routing and assembly with no Ray: the
ceiling), with the ratio of the two.

Usage:
    python bench/ps_throughput.py                     # the full grid (a few minutes)
    python bench/ps_throughput.py --quick             # a small grid
    python bench/ps_throughput.py --keys 65536 --widths 8 --shards 1 2 --out results.json

Sparse: every call moves ``k`` unique int64 keys drawn from a hashed id space, rows of width
``w`` (float32, SGD). A pull returns ``[k, w]`` rows; a push sends ``[k, w]`` gradients, and is
timed until the shards have applied it. Dense: ``pull_dense`` of a whole table and a push of
every row (``--dense-rows 0`` skips the dense measurements). Each point is the median of
``--reps`` timed calls after two warm-up calls.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from angelps.client.ps_client import PSClient
from angelps.client.routing import Routed, assemble
from angelps.options import PSOptions
from angelps.partition import Partitioner
from angelps.push_checks import check_keys, check_lr, check_push
from angelps.server.shard import ParameterShard
from angelps.table import OptimizerSpec, TableSpec


class InProcessPS:
    """The client's work (validation, dedup, routing, assembly) and the shards' work, in one
    process with no Ray: the ceiling a Ray deployment is compared with. As on the Ray path, a
    call is validated once, by the client (angelps.push_checks), and the shards take it as
    checked."""

    def __init__(self, tables: list[TableSpec], num_shards: int) -> None:
        self.specs = {t.name: t for t in tables}
        self.shards = [ParameterShard(i, num_shards, tables) for i in range(num_shards)]
        self.parts = {t.name: Partitioner(t, num_shards) for t in tables}
        self.clock = 0

    def pull(self, table: str, keys: np.ndarray) -> np.ndarray:
        r = Routed(self.specs[table], self.parts[table], check_keys(self.specs[table], keys))
        shards, values = [], []
        for s, shard in enumerate(self.shards):
            if r.count(s):
                values.append(shard.pull({table: r.uniq[r.index(s)]}, checked=True))
                shards.append(s)
        return assemble([r], shards, values)[table]

    def pull_dense(self, table: str) -> np.ndarray:
        return np.concatenate([s.pull({table: None})[table] for s in self.shards])

    def push(self, table: str, keys: np.ndarray, grads: np.ndarray, lr: float) -> None:
        spec = self.specs[table]
        checked = check_push(spec, keys, grads, "error")
        assert checked is not None
        r = Routed(spec, self.parts[table], checked[0])
        summed = r.sum_grads(checked[1])
        step = check_lr(lr)
        for s, shard in enumerate(self.shards):
            idx = r.index(s)
            shard.push(0, self.clock, {table: (r.uniq[idx], summed[idx])}, step, checked=True)
        self.clock += 1


def _paired(
    ray_fn: Callable[[], Any], local_fn: Callable[[], Any], reps: int
) -> tuple[float, float]:
    """Median seconds of ``ray_fn`` and ``local_fn``, timed alternately so that both see the
    same background load (this machine's 2 cores are shared); two warm-up calls each."""
    for _ in range(2):
        ray_fn()
        local_fn()
    t_ray, t_local = [], []
    for _ in range(reps):
        t = time.perf_counter()
        ray_fn()
        t_ray.append(time.perf_counter() - t)
        t = time.perf_counter()
        local_fn()
        t_local.append(time.perf_counter() - t)
    return statistics.median(t_ray), statistics.median(t_local)


def bench_sparse(
    keys_list: list[int],
    widths: list[int],
    shards_list: list[int],
    reps: int,
    transport: str = "socket",
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for n_shards in shards_list:
        for width in widths:
            spec = TableSpec(
                f"s{width}",
                rows=-1,
                cols=width,
                sparse=True,
                init="normal",
                optimizer=OptimizerSpec("sgd"),
            )
            client = PSClient.launch(
                [spec],
                PSOptions.from_config(
                    {
                        "angel.job.name": f"bench-{n_shards}-{width}",
                        "angel.ps.number": n_shards,
                        "angel.ps.transport": transport,
                    }
                ),
            )
            local = InProcessPS([spec], n_shards)
            try:
                for k in keys_list:
                    # Unique hashed-looking ids: a fixed pool, so rows exist after warm-up.
                    keys = np.unique(rng.integers(-(2**62), 2**62, int(k * 1.05)))[:k]
                    rng.shuffle(keys)
                    grads = rng.standard_normal((k, width)).astype(np.float32) * 1e-3

                    def ray_push(client=client, spec=spec, keys=keys, grads=grads) -> None:
                        client.push(spec.name, keys, grads, 0.01)
                        client.flush()

                    t_pull, l_pull = _paired(
                        lambda c=client, n=spec.name, k=keys: c.pull(n, k),
                        lambda c=local, n=spec.name, k=keys: c.pull(n, k),
                        reps,
                    )
                    t_push, l_push = _paired(
                        ray_push,
                        lambda c=local, n=spec.name, k=keys, g=grads: c.push(n, k, g, 0.01),
                        reps,
                    )
                    row = {
                        "kind": "sparse",
                        "shards": n_shards,
                        "width": width,
                        "keys": k,
                        "ray_pull_keys_per_s": k / t_pull,
                        "ray_push_keys_per_s": k / t_push,
                        "inproc_pull_keys_per_s": k / l_pull,
                        "inproc_push_keys_per_s": k / l_push,
                        "pull_ratio": l_pull / t_pull,
                        "push_ratio": l_push / t_push,
                    }
                    rows.append(row)
                    print(
                        f"sparse shards={n_shards} width={width:3d} keys={k:7d}  "
                        f"pull {k / t_pull / 1e6:7.2f} Mkeys/s ({row['pull_ratio']:5.0%} of "
                        f"{k / l_pull / 1e6:6.2f})  push {k / t_push / 1e6:7.2f} Mkeys/s "
                        f"({row['push_ratio']:5.0%} of {k / l_push / 1e6:6.2f})",
                        flush=True,
                    )
            finally:
                client.shutdown()
    return rows


def bench_dense(
    rows_list: list[int], shards_list: list[int], reps: int, transport: str = "socket"
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rng = np.random.default_rng(1)
    width = 16
    for n_shards in shards_list:
        for n_rows in rows_list:
            spec = TableSpec("d", rows=n_rows, cols=width, optimizer=OptimizerSpec("sgd"))
            client = PSClient.launch(
                [spec],
                PSOptions.from_config(
                    {
                        "angel.job.name": f"benchd-{n_shards}-{n_rows}",
                        "angel.ps.number": n_shards,
                        "angel.ps.transport": transport,
                    }
                ),
            )
            local = InProcessPS([spec], n_shards)
            keys = np.arange(n_rows)
            grads = rng.standard_normal((n_rows, width)).astype(np.float32) * 1e-3
            nbytes = n_rows * width * 4
            try:

                def ray_push(client=client, keys=keys, grads=grads) -> None:
                    client.push("d", keys, grads, 0.01)
                    client.flush()

                t_pull, l_pull = _paired(
                    lambda c=client: c.pull_dense("d"), lambda c=local: c.pull_dense("d"), reps
                )
                t_push, l_push = _paired(
                    ray_push, lambda c=local, k=keys, g=grads: c.push("d", k, g, 0.01), reps
                )
                # The raw memory ceiling: a plain copy of the same bytes.
                src = np.zeros((n_rows, width), np.float32)
                _, t_copy = _paired(lambda: None, lambda s=src: s.copy(), reps)
            finally:
                client.shutdown()
            row = {
                "kind": "dense",
                "shards": n_shards,
                "width": width,
                "rows": n_rows,
                "bytes": nbytes,
                "ray_pull_GBps": nbytes / t_pull / 1e9,
                "ray_push_GBps": nbytes / t_push / 1e9,
                "inproc_pull_GBps": nbytes / l_pull / 1e9,
                "inproc_push_GBps": nbytes / l_push / 1e9,
                "memcpy_GBps": nbytes / t_copy / 1e9,
                "pull_ratio": l_pull / t_pull,
                "push_ratio": l_push / t_push,
            }
            out.append(row)
            print(
                f"dense  shards={n_shards} rows={n_rows:8d} ({nbytes / 2**20:6.1f} MiB)  "
                f"pull {row['ray_pull_GBps']:5.2f} GB/s ({row['pull_ratio']:5.0%} of "
                f"{row['inproc_pull_GBps']:5.2f})  push {row['ray_push_GBps']:5.2f} GB/s "
                f"({row['push_ratio']:5.0%} of {row['inproc_push_GBps']:5.2f})  "
                f"memcpy {row['memcpy_GBps']:5.2f} GB/s",
                flush=True,
            )
    return out


def markdown(result: dict[str, Any]) -> str:
    """The tables of docs/benchmarks-ps.md from a result JSON."""
    lines = [
        "| shards | width | keys/call | pull Mkeys/s (Ray) | in-process | ratio "
        "| push Mkeys/s (Ray) | in-process | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result.get("sparse", []):
        lines.append(
            f"| {r['shards']} | {r['width']} | {r['keys']:,} "
            f"| {r['ray_pull_keys_per_s'] / 1e6:.2f} | {r['inproc_pull_keys_per_s'] / 1e6:.2f} "
            f"| {r['pull_ratio']:.0%} "
            f"| {r['ray_push_keys_per_s'] / 1e6:.2f} | {r['inproc_push_keys_per_s'] / 1e6:.2f} "
            f"| {r['push_ratio']:.0%} |"
        )
    dense = result.get("dense", [])
    if not dense:  # a run with --dense-rows 0
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "| shards | rows x 16 | MiB | pull GB/s (Ray) | in-process | ratio | push GB/s (Ray) "
        "| in-process | ratio | memcpy GB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in dense:
        lines.append(
            f"| {r['shards']} | {r['rows']:,} | {r['bytes'] / 2**20:.0f} "
            f"| {r['ray_pull_GBps']:.2f} | {r['inproc_pull_GBps']:.2f} | {r['pull_ratio']:.0%} "
            f"| {r['ray_push_GBps']:.2f} | {r['inproc_push_GBps']:.2f} | {r['push_ratio']:.0%} "
            f"| {r['memcpy_GBps']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--keys", type=int, nargs="+", default=[1024, 8192, 65536, 262144])
    p.add_argument("--widths", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument(
        "--dense-rows",
        type=int,
        nargs="+",
        default=[65536, 1048576],
        help="rows of the dense table (width 16) per point; 0 skips the dense measurements",
    )
    p.add_argument("--reps", type=int, default=7)
    p.add_argument(
        "--transport",
        choices=["socket", "ray"],
        default="socket",
        help="angel.ps.transport of the shards (default socket, the data plane)",
    )
    p.add_argument("--quick", action="store_true", help="keys 8192 65536, widths 8, shards 1 2")
    p.add_argument("--out", default="bench/results/ps_throughput.json")
    p.add_argument("--markdown", metavar="JSON", help="print the tables of a result file and exit")
    args = p.parse_args(argv)
    if args.markdown:
        with open(args.markdown, encoding="utf-8") as f:
            sys.stdout.write(markdown(json.load(f)))
        return 0
    if args.quick:
        args.keys, args.widths, args.shards, args.dense_rows = [8192, 65536], [8], [1, 2], [65536]
    if any(r < 0 for r in args.dense_rows):
        p.error(f"--dense-rows must be >= 0 (0 skips the dense part), got {args.dense_rows}")
    args.dense_rows = [r for r in args.dense_rows if r > 0]

    import ray

    ray.init(
        num_cpus=os.cpu_count() or 2,
        include_dashboard=False,
        namespace="angelps",
        _temp_dir=tempfile.mkdtemp(prefix="ray-bench-"),
        log_to_driver=False,
    )
    try:
        sparse = bench_sparse(args.keys, args.widths, args.shards, args.reps, args.transport)
        dense = bench_dense(args.dense_rows, args.shards, args.reps, args.transport)
    finally:
        ray.shutdown()
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "numpy": np.__version__,
            "ray": ray.__version__,
        },
        "reps": args.reps,
        "transport": args.transport,
        "sparse": sparse,
        "dense": dense,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    big = [r for r in sparse if r["keys"] >= 65536]
    if big:
        worst = min(min(r["pull_ratio"], r["push_ratio"]) for r in big)
        med = statistics.median([r["pull_ratio"] for r in big] + [r["push_ratio"] for r in big])
        print(
            f"calls of >= 64k keys: median {med:.0%} of the in-process ceiling, worst {worst:.0%}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
