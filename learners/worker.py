"""One training worker: its part of the data, the model's dense layers, and a PS client handle.

``TrainWorker`` is a plain class (testable in one process); :func:`remote_worker_class` wraps it
in a Ray actor. The driver (:class:`learners.learner.GraphLearner`) calls ``run_steps`` in
chunks so it can show progress; every optimizer update inside a chunk is:

    for each of ml.grad.accum.steps micro-batches:
        dedup ids → pull rows → forward → (loss / accum).backward() → keep the row gradients
    merge row gradients; all-reduce dense gradients (W > 1); skip the update everywhere if any
    gradient is not finite; clip; push row gradients × 1/W with this update's lr; step the dense
    optimizer with the same lr; advance the scheduler (per-batch decay) once.

Under BSP the shard applies one optimizer update on the sum of the W pushes, so ×1/W makes it
the mean gradient of the global batch (batch × W × accum samples).
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from angelps.config import ConfigError
from learners.models import BaseModel, SparseInput, TableDecl, build_model

__all__ = ["StepStats", "TrainWorker", "remote_worker_class"]


@dataclass
class StepStats:
    """What one ``run_steps`` chunk did (summed over its updates)."""

    updates: int = 0
    skipped: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    pull_s: float = 0.0
    compute_s: float = 0.0
    push_s: float = 0.0
    wait_s: float = 0.0
    elapsed_s: float = 0.0
    last_lr: float = 0.0


class _Dedup:
    """Ids → (unique ids sorted, slot of each id) without ``np.unique``'s argsort.

    ``np.unique(return_inverse=True)`` argsorts (3.4 ms for 53k ids). Two cheaper ways:

    * a presence mask over the feature range: mark, ``flatnonzero``, remap (0.3 ms for 26k ids
      over 148 features) - but the scan is O(range) (7.8 ms over 15M features);
    * sort the ids (a plain sort, 0.45 ms for 53k), drop repeats, then map every id to its slot
      through a remap table over the range, touched only at the batch's ids (O(n)).

    The mask is used while the range is at most 8x the ids of the batch, the sort otherwise; with
    no bounded range (hashed ids), each id finds its slot by binary search in the sorted ids.
    """

    _MASK_FACTOR = 8

    def __init__(self, num_features: int) -> None:
        self.num_features = num_features
        # The remap table is 8 bytes per feature of address space (calloc: touched pages only);
        # beyond 2^28 features (2 GiB of it) the binary search is used instead.
        self.bounded = 0 < num_features <= 1 << 28
        self.mask: np.ndarray | None = None
        self.remap: np.ndarray | None = None

    def __call__(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = ids.size
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if not self.bounded:
            uniq = np.unique(ids)
            return uniq.astype(np.int64, copy=False), np.searchsorted(uniq, ids).astype(np.int64)
        if self.remap is None:
            # np.zeros is calloc: pages of the remap table are materialised only where touched.
            self.remap = np.zeros(self.num_features, dtype=np.int64)
        if self.num_features <= self._MASK_FACTOR * n:
            if self.mask is None:
                self.mask = np.zeros(self.num_features, dtype=bool)
            self.mask[ids] = True
            uniq = np.flatnonzero(self.mask)
            self.mask[uniq] = False
        else:
            srt = np.sort(ids)
            keep = np.empty(n, dtype=bool)
            keep[0] = True
            np.not_equal(srt[1:], srt[:-1], out=keep[1:])
            uniq = srt[keep]
        self.remap[uniq] = np.arange(uniq.size, dtype=np.int64)
        return uniq.astype(np.int64, copy=False), self.remap[ids]


class _Resolved:
    """A future whose value is already here (rows prefetched by the previous ``run_steps``)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


def _merge_rows(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Sum row gradients of the same id across micro-batches."""
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate([p[0] for p in parts])
    grads = np.concatenate([p[1] for p in parts])
    uniq, inv = np.unique(ids, return_inverse=True)
    out = np.zeros((uniq.size, grads.shape[1]), dtype=grads.dtype)
    np.add.at(out, inv, grads)
    return uniq, out


def dense_optimizer(
    params: list[nn.Parameter], spec: Mapping[str, Any]
) -> torch.optim.Optimizer | None:
    """The worker-side torch optimizer of dense layers: the same formulas as the PS optimizer.

    ``spec`` is an ``OptimizerSpec.to_dict()`` (``ml.fclayer.optimizer`` and ``ml.opt.*``);
    angelps.optim documents each server-side optimizer as its torch.optim equivalent, which
    is used here. The learning rate is set before every update from the scheduler.
    """
    if not params:
        return None
    name = str(spec.get("name", "sgd")).lower()
    l2 = float(spec.get("l2", 0.0))
    eps = float(spec.get("eps", 1e-8))
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.0, weight_decay=l2)
    if name == "momentum":
        m = float(spec.get("momentum", 0.9))
        return torch.optim.SGD(params, lr=0.0, momentum=m, weight_decay=l2)
    if name == "adam":
        betas = (float(spec.get("beta1", 0.9)), float(spec.get("beta2", 0.99)))
        return torch.optim.Adam(params, lr=0.0, betas=betas, eps=eps, weight_decay=l2)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=0.0, eps=eps, weight_decay=l2)
    if name == "rmsprop":
        rho = float(spec.get("rho", 0.9))
        return torch.optim.RMSprop(params, lr=0.0, alpha=rho, eps=eps, weight_decay=l2)
    raise ConfigError(
        f"ml.fclayer.optimizer={spec.get('name')} cannot run on the workers (valid for "
        "worker-side dense layers: SGD, Momentum, Adam, AdaGrad, RMSProp)"
    )


class TrainWorker:
    """A worker's whole state: data part, model, dense optimizer, scheduler copy, PS handle."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        worker_id: int,
        num_workers: int,
        setup: Mapping[str, Any],
    ) -> None:
        from learners import data as data_mod

        self.conf = dict(conf)
        self.worker_id = worker_id
        self.num_workers = num_workers
        torch.set_num_threads(int(setup.get("torch_threads", 1)))
        self.data_mod = data_mod
        self.read_stats = data_mod.ReadStats()
        self.stream = bool(conf.get("ml.data.stream", False)) and not setup.get("no_data")
        self._train_summary: dict[str, int] | None = None
        if setup.get("no_data"):
            # A worker for prediction/evaluation of a saved model: data comes per call.
            self.train = self.valid = data_mod.Batch.empty()
        elif self.stream:
            # Inputs larger than memory: one counting pass now (rows, id range; the small
            # validation split is kept), then every epoch reads its batches from disk.
            self.train = data_mod.Batch.empty()
            self.valid, self._train_summary = self._scan(conf)
        else:
            self.train, self.valid = data_mod.load_train_valid(
                conf, worker_id=worker_id, num_workers=num_workers, stats=self.read_stats
            )
        self.ps: Any = None
        self.model: BaseModel | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.sched: Any = None
        self._iter: Any = None
        # The first batch of the next run_steps, with its rows already pulled (by the fused call
        # of the previous run_steps's last update), and the epoch whose iterator it came from.
        self._ready: tuple[Any, SparseInput, Tensor | None, dict[str, np.ndarray], Any] | None = (
            None
        )
        self._ready_epoch = -1
        self._epoch = -1

    # --- set-up -----------------------------------------------------------------------------

    def _scan(self, conf: Mapping[str, Any]) -> tuple[Any, dict[str, int]]:
        """Stream this worker's part once: the validation rows and the training rows' counts."""
        d = self.data_mod
        valid_path = conf.get("angel.validate.data.path")
        split = not valid_path and float(conf.get("ml.data.validate.ratio", 0.05) or 0.0) > 0
        period = d.split_period(conf)
        rows = nnz = 0
        max_id, min_nnz, max_nnz = -1, 1 << 62, 0
        valid_parts = []
        for chunk in d.read_file(
            str(conf["angel.train.data.path"]),
            conf,
            worker_id=self.worker_id,
            num_workers=self.num_workers,
            chunk_rows=int(conf.get("ml.data.chunk.rows", 65536)),
            stats=self.read_stats,
        ):
            if split:
                mask = chunk.row_index % period == 0
                valid_parts.append(chunk.take(mask))
                chunk = chunk.take(~mask)
            counts = np.diff(chunk.indptr)
            if counts.size:
                rows += int(counts.size)
                nnz += int(chunk.ids.size)
                max_id = max(max_id, int(chunk.ids.max()) if chunk.ids.size else -1)
                min_nnz, max_nnz = min(min_nnz, int(counts.min())), max(max_nnz, int(counts.max()))
        if valid_path:
            valid = d.load_file(
                str(valid_path),
                conf,
                worker_id=self.worker_id,
                num_workers=self.num_workers,
                stats=self.read_stats,
            )
        else:
            valid = d.concat(valid_parts) if valid_parts else d.Batch.empty()
        summary = {
            "rows": rows,
            "nnz": nnz,
            "max_id": max_id,
            "min_nnz": min_nnz if rows else 0,
            "max_nnz": max_nnz,
        }
        return valid, summary

    def _minibatches(self, epoch: int, shuffle: bool) -> Any:
        if self.stream:
            return iter(
                self.data_mod.iter_stream_minibatches(
                    self.conf,
                    self.batch_size,
                    shuffle=shuffle,
                    seed=self.seed,
                    epoch=epoch,
                    worker_id=self.worker_id,
                    num_workers=self.num_workers,
                )
            )
        return iter(
            self.data_mod.iter_minibatches(
                self.train, self.batch_size, shuffle=shuffle, seed=self.seed, epoch=epoch
            )
        )

    def data_summary(self) -> dict[str, Any]:
        """Sizes and id range of this worker's data (the driver sizes the tables from them)."""
        out: dict[str, Any] = {}
        for name, part in (("train", self.train), ("valid", self.valid)):
            if name == "train" and self._train_summary is not None:
                out[name] = dict(self._train_summary)
                continue
            counts = np.diff(np.asarray(part.indptr))
            ids = np.asarray(part.ids)
            out[name] = {
                "rows": int(counts.size),
                "nnz": int(ids.size),
                "max_id": int(ids.max()) if ids.size else -1,
                "min_nnz": int(counts.min()) if counts.size else 0,
                "max_nnz": int(counts.max()) if counts.size else 0,
            }
        out["skipped_lines"] = int(self.read_stats.bad_lines)
        return out

    def dense_digest(self) -> list[float]:
        """Sum and sum of squares of every worker-side parameter (replicas must agree)."""
        assert self.model is not None
        return [
            float(sum(float(p.double().sum()) for p in self.model.parameters())),
            float(sum(float(p.double().pow(2).sum()) for p in self.model.parameters())),
        ]

    def dense_param_count(self) -> int:
        """Number of worker-side (dense) parameters of the model."""
        assert self.model is not None
        return int(sum(p.numel() for p in self.model.parameters()))

    def setup_model(self, setup: Mapping[str, Any]) -> list[TableDecl]:
        """Build the model (same seed on every worker, so dense layers start identical)."""
        self.num_features = int(setup["num_features"])
        self.num_fields = setup.get("num_fields")
        self.batch_size = int(setup["batch_size"])
        self.accum = int(setup["accum_steps"])
        self.seed = int(setup["seed"])
        self.shuffle = bool(setup["shuffle"])
        self.clip = float(setup["clip_norm"])
        self.on_batch = bool(setup["decay_on_batch"])
        self.frozen = {s.lower() for s in setup.get("frozen", [])}
        self.device = torch.device("cpu")
        if setup.get("device", "cpu") == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(
                    "angel.worker.device=cuda but this worker sees no CUDA device "
                    "(set angel.worker.device=cpu)"
                )
            self.device = torch.device("cuda")
        # Mixed precision on CUDA only: fp16 autocast with a dynamic loss scale (GradScaler's
        # rule: halve on a non-finite gradient and skip the update, double after 2000 good ones).
        self.amp = bool(setup.get("amp", False)) and self.device.type == "cuda"
        self.loss_scale = 2.0**16 if self.amp else 1.0
        self.good_steps = 0
        self.model = build_model(self.conf, self.num_features, self.num_fields, seed=self.seed)
        self.model.to(self.device)
        self.tables = self.model.tables()
        self.dedup = _Dedup(self.num_features)
        # Frozen dense layers keep requires_grad=False: no gradient, no optimizer state.
        for name, module in self.model.dense_modules().items():
            if name.lower() in self.frozen:
                for p in module.parameters():
                    p.requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        # angel.dense.placement=ps: every MLP parameter is a dense PS table (as Angel), pulled
        # whole before each forward and pushed after each backward; no all-reduce, no
        # worker-side optimizer. Init U(±1/√fan_in), the scale of torch's nn.Linear default.
        self.ps_dense: list[tuple[str, nn.Parameter]] = []
        if setup.get("dense_placement", "worker") == "ps":
            params = dict(self.model.named_parameters())
            for pname, p in params.items():
                # A bias takes the fan-in of its layer's weight (as nn.Linear).
                w = params.get(pname[: -len("bias")] + "weight") if pname.endswith("bias") else p
                fan_in = w.shape[1] if w is not None and w.dim() > 1 else p.shape[0]
                name = "dense." + pname
                self.tables.append(
                    TableDecl(
                        name,
                        int(p.shape[0]),
                        int(p[0].numel()) if p.dim() > 1 else 1,
                        False,
                        "fclayer",
                        1.0 / math.sqrt(max(fan_in, 1)),
                        "uniform",
                    )
                )
                self.ps_dense.append((name, p))
                if not p.requires_grad:
                    self.frozen.add(name.lower())
            trainable = []
        self.opt = dense_optimizer(trainable, setup.get("dense_optimizer", {}))
        self.push_tables = [t for t in self.tables if t.name.lower() not in self.frozen]
        self.task = self.model.task
        # Fused push_pull needs the PS client's push_pull_async (test doubles may lack it).
        self.fused = bool(setup.get("fused", True))
        torch.manual_seed(self.seed + 7919 * (self.worker_id + 1))
        return self.tables

    def set_ps(self, ps: Any) -> None:
        """The PS client handle of this worker (``PSClient.for_worker(i)``)."""
        self.ps = ps

    def setup_dist(self, master_addr: str, master_port: int) -> None:
        """Join the gloo process group the dense all-reduce runs in (as Ray Train sets it up)."""
        if self.num_workers <= 1 or dist.is_initialized():
            return
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.worker_id,
            world_size=self.num_workers,
        )

    @staticmethod
    def free_port() -> tuple[str, int]:
        """An address and a free TCP port on this node, for worker 0 to host the process group."""
        import socket

        import ray

        addr = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            return addr, int(s.getsockname()[1])

    # --- the step ---------------------------------------------------------------------------

    def _request(self, batch: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Dedup the batch ids: (slot of each id, the rows to pull from every table)."""
        ids = np.asarray(batch.ids, dtype=np.int64)
        uniq, slots = self.dedup(ids)
        req = {
            t.name: (uniq if t.sparse else np.arange(t.rows, dtype=np.int64)) for t in self.tables
        }
        return slots, req

    def _prepare(
        self, batch: Any, slots: np.ndarray, labels: bool = True
    ) -> tuple[SparseInput, Tensor | None]:
        """Everything of a batch's input that does not need its rows: the CSR structure (and
        the matrices of the fast backward) and the labels. Built while the rows are in flight."""
        x = SparseInput.from_csr(
            batch.indptr,
            slots,
            np.asarray(batch.values, dtype=np.float32),
            {},
            self._fields_of(batch),
            device=self.device,
        )
        return x, (self._labels(batch) if labels else None)

    def _attach(self, x: SparseInput, pulled: Mapping[str, np.ndarray]) -> SparseInput:
        """The pulled rows as leaf tensors (the worker-side copies of dense PS tables updated)."""
        if self.ps_dense:
            with torch.no_grad():
                for name, p in self.ps_dense:
                    v = torch.from_numpy(np.asarray(pulled[name], dtype=np.float32))
                    p.copy_(v.view_as(p))
        for t in self.tables:
            # A copy: rows that came through the object store are read-only.
            r = torch.from_numpy(np.array(pulled[t.name], dtype=np.float32, copy=True))
            r = r.to(self.device)
            x.rows[t.name] = r.requires_grad_(
                t.name.lower() not in self.frozen and torch.is_grad_enabled()
            )
        return x

    def _input(
        self, batch: Any, labels: bool = True
    ) -> tuple[SparseInput, Tensor | None, dict[str, np.ndarray], float]:
        """Dedup the batch ids, pull their rows, wrap them as leaf tensors."""
        slots, req = self._request(batch)
        t0 = time.perf_counter()
        pulled = self.ps.pull_many(req)
        pull_s = time.perf_counter() - t0
        x, y = self._prepare(batch, slots, labels)
        return self._attach(x, pulled), y, req, pull_s

    def _fields_of(self, batch: Any) -> int | None:
        f = self.num_fields
        if f is None:
            return None
        counts = np.diff(np.asarray(batch.indptr))
        if counts.size and (counts.min() != f or counts.max() != f):
            if self.model is not None and self.model.needs_fields:
                bad = int(np.flatnonzero(counts != f)[0])
                row = batch.row_index[bad] if getattr(batch, "row_index", None) is not None else bad
                raise ValueError(
                    f"sample {int(row)} has {int(counts[bad])} non-zeros but ml.fm.field.num={f}: "
                    f"{self.model.angel_name} needs exactly one id per field"
                )
            return None
        return f

    def _labels(self, batch: Any) -> Tensor:
        y = np.asarray(batch.labels, dtype=np.float32)
        if self.task == "binary":
            y = np.asarray(self.data_mod.binary_labels01(y), dtype=np.float32)
        assert self.model is not None
        return self.model.prepare_labels(torch.from_numpy(np.ascontiguousarray(y))).to(self.device)

    def begin_epoch(self, epoch: int, sched: Any) -> int:
        """Start an epoch: a fresh (seeded) shuffle of this worker's part, and the scheduler.

        ``sched`` is the driver's ``StepSizeScheduler`` (a copy arrives here); under per-batch
        decay this copy advances once per applied update and ``run_steps`` returns its state.
        Returns the number of batches of this worker's part.
        """
        if self._ready is None or self._ready_epoch != epoch:
            # (a batch prefetched for another epoch is dropped: its iterator is not this one)
            self._ready = None
            self._iter = self._minibatches(epoch, self.shuffle)
        self._epoch = epoch
        self.sched = sched
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        rows = (
            self._train_summary["rows"]
            if self._train_summary is not None
            else int(np.asarray(self.train.indptr).size - 1)
        )
        return math.ceil(rows / self.batch_size)

    def run_steps(
        self,
        n_updates: int,
        epoch_lr: float | None,
        prefetch: bool = False,
        next_epoch: int | None = None,
    ) -> dict[str, Any]:
        """Run ``n_updates`` optimizer updates (each of ``accum`` micro-batches).

        ``prefetch``: another ``run_steps`` follows (of this epoch, or of ``next_epoch`` when
        given), so the last update's push also pulls the rows of that call's first batch, in
        one fused call per shard, instead of a push now and a pull then. The call is waited
        for before returning: every push is applied when ``run_steps`` returns (the driver may
        validate or save next), and the rows are those after the last update, which is what
        the next step would pull anyway.
        """
        assert self.model is not None and self._iter is not None
        stats = StepStats()
        t_start = time.perf_counter()
        self.model.train()
        # The next update's first micro-batch, prepared while this update's push is in
        # flight: one fused push_pull call per shard per step instead of a push and a pull.
        pending: tuple[Any, SparseInput, Tensor | None, dict[str, np.ndarray], Any] | None = None
        if self._ready is not None:
            pending, self._ready = self._ready, None
        for u in range(n_updates):
            lr = float(epoch_lr) if epoch_lr is not None else float(self.sched.peek())
            parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {
                t.name: [] for t in self.push_tables
            }
            for _m in range(self.accum):
                t0 = time.perf_counter()
                if pending is not None:
                    batch, x, y, req, fut = pending
                    pending = None
                    pulled = fut.result()
                    stats.wait_s += time.perf_counter() - t0
                    x = self._attach(x, pulled)
                else:
                    batch = self._next_batch()
                    x, y, req, pull_s = self._input(batch)
                    stats.pull_s += pull_s
                t0 = time.perf_counter()
                assert y is not None
                with torch.autocast("cuda", dtype=torch.float16, enabled=self.amp):
                    scores = self.model(x)
                loss = self.model.loss(scores.float(), y)
                # The loss is divided by the accumulation steps so k micro-batches of b equal one
                # batch of k·b (seed 002: otherwise the step is k times too large).
                if loss.requires_grad:  # everything frozen: nothing to differentiate
                    (loss * (self.loss_scale / self.accum)).backward()
                for t in self.push_tables:
                    rg = x.rows[t.name].grad
                    if rg is not None:
                        parts[t.name].append((req[t.name], self._unscaled(rg)))
                for name, p in self.ps_dense:
                    if p.grad is not None and name in parts:
                        pg = self._unscaled(p.grad.detach().reshape(p.shape[0], -1))
                        parts[name].append((req[name], pg))
                        p.grad = None
                stats.compute_s += time.perf_counter() - t0
                stats.loss_sum += float(loss.detach()) * batch_rows(batch)
                stats.samples += batch_rows(batch)
            t0 = time.perf_counter()
            grads = {name: _merge_rows(p) for name, p in parts.items() if p}
            ok, coef = self._finish_grads(grads)
            stats.compute_s += time.perf_counter() - t0
            if not ok:
                # A non-finite gradient anywhere: no worker pushes, the dense optimizer does not
                # step and the schedule does not advance (a skipped update is not an update).
                stats.skipped += 1
                if self.amp:
                    self.loss_scale /= 2.0
                    self.good_steps = 0
                if self.opt is not None:
                    self.opt.zero_grad(set_to_none=True)
                # Still end this worker's step at the PS, so BSP peers are not kept waiting.
                self.ps.clock()
                continue
            scale = coef / self.num_workers
            t0 = time.perf_counter()
            update = {k: (ids, g * scale) for k, (ids, g) in grads.items()}
            last = u + 1 == n_updates
            if self.fused and (not last or prefetch):
                # Ray runs one caller's calls to an actor in order, so the rows returned are
                # those after this push (and, under BSP, after every worker's push).
                if last and next_epoch is not None:
                    self._iter = self._minibatches(next_epoch, self.shuffle)
                    self._epoch = self._ready_epoch = next_epoch
                elif last:
                    self._ready_epoch = self._epoch
                nb = self._next_batch()
                n_slots, n_req = self._request(nb)
                fut = self.ps.push_pull_async(update, lr, n_req)
                # While the call is in flight: the next batch's input minus its rows.
                nx, ny = self._prepare(nb, n_slots)
                pending = (nb, nx, ny, n_req, fut)
            else:
                self._push(update, lr)
            stats.push_s += time.perf_counter() - t0
            if self.opt is not None:
                for group in self.opt.param_groups:
                    group["lr"] = lr
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            stats.updates += 1
            stats.last_lr = lr
            if self.amp:
                self.good_steps += 1
                if self.good_steps % 2000 == 0:
                    self.loss_scale *= 2.0
            if self.on_batch:
                self.sched.advance()
        if pending is not None:
            # The last update's fused call (prefetch): wait for it here, after the dense step.
            t0 = time.perf_counter()
            nb, nx, ny, n_req, fut = pending
            self._ready = (nb, nx, ny, n_req, _Resolved(fut.result()))
            stats.wait_s += time.perf_counter() - t0
        stats.elapsed_s = time.perf_counter() - t_start
        out = stats.__dict__.copy()
        out["sched_state"] = self.sched.state_dict()
        return out

    def _next_batch(self) -> Any:
        batch = next(self._iter, None)
        if batch is None:
            # This worker's part ran short of the common step count; start it over so that
            # every worker pushes once per step (BSP).
            self._iter = self._minibatches(self._epoch + 100_000, True)
            batch = next(self._iter)
        return batch

    def _unscaled(self, g: Tensor) -> np.ndarray:
        """A row gradient as float32 numpy on the host, the loss scale divided out."""
        g = g.detach().float()
        if self.loss_scale != 1.0:
            g = g / self.loss_scale
        return g.cpu().numpy().copy() if g.is_cuda else g.numpy().copy()

    def _push(self, grads: Mapping[str, tuple[np.ndarray, np.ndarray]], lr: float) -> None:
        self.ps.push_many(dict(grads), lr=lr)

    def _finish_grads(self, grads: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[bool, float]:
        """All-reduce dense gradients, agree on finiteness, and compute the clip coefficient.

        With W > 1 workers this is one collective per update: the dense gradients and a count
        of workers whose sparse gradients are not finite travel in the same all-reduce (a NaN
        in a dense gradient reaches every worker through the sum). Clipping adds a second one.
        """
        assert self.model is not None
        dense = [p.grad for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        if self.loss_scale != 1.0:
            for g in dense:
                g.div_(self.loss_scale)
        w = self.num_workers
        sparse_sq = sum(float(np.square(g, dtype=np.float64).sum()) for _, g in grads.values()) / (
            w * w
        )
        bad = 0.0 if math.isfinite(sparse_sq) else 1.0
        if w > 1:
            like = dense[0] if dense else torch.zeros(1)
            flag = torch.tensor([bad], dtype=like.dtype, device=like.device)
            flat = _all_reduce(torch.cat([*(g.reshape(-1) for g in dense), flag]))
            bad = float(flat[-1])
            flat /= w
            off = 0
            for g in dense:
                n = g.numel()
                g.copy_(flat[off : off + n].view_as(g))
                off += n
        # One fused pass over the dense gradients (as clip_grad_norm_): the per-tensor float64
        # square-and-sum it replaces cost ~15% of a DeepFM step at batch 256. NaN or inf in any
        # gradient makes its norm non-finite. After the all-reduce every worker holds the same
        # dense gradients, so every worker reaches the same verdict.
        dense_sq = (
            float(torch.stack(torch._foreach_norm(dense)).double().pow(2).sum()) if dense else 0.0
        )
        finite = bad == 0 and math.isfinite(dense_sq)
        coef = 1.0
        if finite and self.clip > 0:
            # Sparse: this worker's share of the pushed gradient; under W > 1 the norm of the
            # summed sparse gradient is not known on any one worker, so the largest share
            # stands in for it (every worker then applies the same, smallest coefficient).
            if w > 1:
                t = torch.tensor([sparse_sq], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                sparse_sq = float(t[0])
            norm = math.sqrt(sparse_sq * w + dense_sq)
            coef = min(1.0, self.clip / (norm + 1e-6))
        if finite and coef < 1.0:
            for g in dense:
                g.mul_(coef)
        return finite, coef

    # --- evaluation -------------------------------------------------------------------------

    def evaluate_part(self, which: str = "valid", chunk: int = 4096) -> dict[str, Any]:
        """Predictions, labels and the mean loss on this worker's validation (or train) part."""
        part = self.valid if which == "valid" else self.train
        return self.predict_batch(part, chunk)

    def predict_batch(self, data: Any, chunk: int = 4096) -> dict[str, Any]:
        """Predict every row of ``data`` in chunks, under ``torch.inference_mode``."""
        assert self.model is not None
        self.model.eval()
        n = int(np.asarray(data.indptr).size - 1)
        preds: list[np.ndarray] = []
        scores_out: list[np.ndarray] = []
        loss_sum = 0.0
        has_labels = getattr(data, "labels", None) is not None and n > 0
        with torch.inference_mode():
            for lo in range(0, n, chunk):
                b = data.take(np.arange(lo, min(n, lo + chunk)))
                x, y, _req, _ = self._input(b, labels=has_labels)
                with torch.autocast("cuda", dtype=torch.float16, enabled=self.amp):
                    scores = self.model(x).float()
                preds.append(self.model.predict(scores).cpu().numpy())
                if self.task == "multiclass":
                    # multiclass metrics need the class probabilities
                    scores_out.append(torch.softmax(scores, dim=1).cpu().numpy())
                if has_labels:
                    assert y is not None
                    loss_sum += float(self.model.loss(scores, y)) * batch_rows(b)
        self.model.train()
        labels = np.asarray(data.labels, dtype=np.float32) if has_labels else None
        if labels is not None and self.task == "binary":
            labels = np.asarray(self.data_mod.binary_labels01(labels), dtype=np.float32)
        return {
            "pred": np.concatenate(preds) if preds else np.zeros(0, dtype=np.float32),
            "prob": np.concatenate(scores_out) if scores_out else None,
            "labels": labels,
            "loss_sum": loss_sum,
            "rows": n,
            "row_index": np.asarray(data.row_index)
            if getattr(data, "row_index", None) is not None
            else None,
        }

    def predict_file(self, path: str) -> dict[str, Any]:
        """Read a file (this worker's part) and predict it."""
        data = self.data_mod.load_file(
            path, self.conf, worker_id=self.worker_id, num_workers=self.num_workers
        )
        return self.predict_batch(data, int(self.conf.get("ml.minibatch.size", 4096)) * 32)

    # --- checkpoints of the worker-side state -------------------------------------------------

    def dense_state(self) -> bytes:
        """Dense layers, dense optimizer state and RNG state as one ``.npz`` (no pickle)."""
        assert self.model is not None
        arrays: dict[str, np.ndarray] = {}
        for k, v in self.model.state_dict().items():
            arrays[f"model/{k}"] = v.detach().cpu().numpy()
        meta: dict[str, Any] = {"param_groups": [], "state_keys": {}}
        if self.opt is not None:
            sd = self.opt.state_dict()
            meta["param_groups"] = sd["param_groups"]
            for idx, st in sd["state"].items():
                keys = []
                for name, val in st.items():
                    if isinstance(val, Tensor):
                        arrays[f"opt/{idx}/{name}"] = val.detach().cpu().numpy()
                        keys.append([name, "tensor"])
                    else:
                        meta.setdefault("scalars", {})[f"{idx}/{name}"] = val
                        keys.append([name, "scalar"])
                meta["state_keys"][str(idx)] = keys
        meta["loss_scale"] = self.loss_scale
        meta["good_steps"] = self.good_steps
        arrays["rng/torch"] = torch.get_rng_state().numpy()
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    def rng_state(self) -> bytes:
        """This worker's torch RNG state (dropout): each worker has its own stream."""
        return bytes(torch.get_rng_state().numpy().tobytes())

    def set_rng_state(self, state: bytes) -> None:
        torch.set_rng_state(torch.from_numpy(np.frombuffer(state, dtype=np.uint8).copy()))

    def load_dense_state(self, blob: bytes) -> None:
        """Restore what :meth:`dense_state` wrote."""
        assert self.model is not None
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(bytes(arrays.pop("meta")).decode())
        model_sd = {
            k[len("model/") :]: torch.from_numpy(v.copy())
            for k, v in arrays.items()
            if k.startswith("model/")
        }
        self.model.load_state_dict(model_sd)
        if self.opt is not None and meta["param_groups"]:
            state: dict[int, dict[str, Any]] = {}
            for idx, keys in meta["state_keys"].items():
                st: dict[str, Any] = {}
                for name, kind in keys:
                    if kind == "tensor":
                        st[name] = torch.from_numpy(arrays[f"opt/{idx}/{name}"].copy())
                    else:
                        st[name] = meta["scalars"][f"{idx}/{name}"]
                state[int(idx)] = st
            # Hyper-parameters come from the configuration; the checkpoint gives the lr.
            groups = [
                {**cur, "lr": saved["lr"]}
                for cur, saved in zip(
                    self.opt.state_dict()["param_groups"], meta["param_groups"], strict=True
                )
            ]
            self.opt.load_state_dict({"state": state, "param_groups": groups})
        torch.set_rng_state(torch.from_numpy(arrays["rng/torch"].copy()))
        self.loss_scale = float(meta.get("loss_scale", self.loss_scale))
        self.good_steps = int(meta.get("good_steps", 0))

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _all_reduce(t: Tensor) -> Tensor:
    """Sum over workers (gloo works on host tensors; a CUDA tensor makes the round trip)."""
    if t.is_cuda:
        host = t.cpu()
        dist.all_reduce(host)
        return host.to(t.device)
    dist.all_reduce(t)
    return t


def batch_rows(batch: Any) -> int:
    return int(np.asarray(batch.indptr).size - 1)


def remote_worker_class(num_cpus: float = 1, num_gpus: float = 0) -> Any:
    """``TrainWorker`` as a Ray actor class (imported lazily so the plain class needs no Ray)."""
    import ray

    opts: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if not os.environ.get("OMP_NUM_THREADS"):
        # One OpenMP thread: spinning extra threads costs throughput on few cores.
        opts["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": "1"}}
    return ray.remote(**opts)(TrainWorker)
