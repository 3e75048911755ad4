"""One training worker: its part of the data, the model's dense layers, and a PS client handle.

``TrainWorker`` is a plain class (testable in one process); :mod:`learners.worker.actor` builds
it inside a Ray actor and :class:`learners.worker.group.WorkerGroup` starts W of them. The driver
(:class:`learners.job.train_loop.TrainingLoop`) calls ``run_steps`` in chunks so it can show progress;
every optimizer update inside a chunk is (:meth:`TrainWorker._update`):

    for each of ml.grad.accum.steps micro-batches:
        dedup ids → pull rows → forward → (loss / accum).backward() → keep the row gradients
    merge row gradients; all-reduce dense gradients (W > 1); skip the update everywhere if any
    gradient is not finite; clip; push row gradients × 1/W with this update's rates (step
    sizes and momentum, :mod:`learners.job.rate_plan`); step the dense optimizer with its rates;
    advance this worker's rate plan once (it is the driver's, sent once: :meth:`set_rates`).

Under BSP the shard applies one optimizer update on the sum of the W pushes, so ×1/W makes it
the mean gradient of the global batch (batch × W × accum samples).

A worker receives typed options only: the :class:`~learners.job.loop_options.TrainPlan`, the data options,
then (:meth:`TrainWorker.build`) the :class:`~learners.models.config.ModelConfig` and the
:class:`~learners.job.job_size.JobSize`, and its PS client handle (:meth:`TrainWorker.set_ps`).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from angelconf.config import ConfigError
from angelps import OptimizerSpec, PSClient
from angelps.dedup import Dedup, merge_rows
from angelps.optim import DenseOptimizer
from angelps.rates import Step
from decay import StepSizeScheduler
from learners.data import Batch, DataOptions, binary_labels01
from learners.job.job_size import JobSize
from learners.job.loop_options import TrainPlan
from learners.job.rate_plan import RatePlan, UpdateRates
from learners.models.config import ModelConfig
from learners.models.sparse_input import SparseInput
from learners.models.table_decl import TableDecl
from learners.models.zoo import BaseModel, build_model
from learners.worker.batch_rows import BatchInput
from learners.worker.cache import RowCache, Split, fill_rows, split_request, worker_cache
from learners.worker.data_part import DataPart
from learners.worker.dense import (
    dense_tables_on_ps,
    finish_grads,
    free_port,
    join_group,
)
from learners.worker.dense_checkpoint import DenseCheckpoint
from learners.worker.device import to_host
from learners.worker.device_step import LossSum, SideStream, unscaled
from learners.worker.held_step import HoldsTables, Peeked
from learners.worker.predict import Predicts
from learners.worker.step_profile import StepProfile
from learners.worker.step_stats import Prefetched, Resolved, RowMap, Rows, StepStats, num_rows

__all__ = ["StepStats", "TrainWorker"]


class TrainWorker(HoldsTables, DenseCheckpoint, Predicts):
    """A worker's whole state: data part, model, dense optimizer, scheduler copy, PS handle.

    Life cycle: construct (reads the data part) → ``data_summary`` (the driver sizes the job) →
    ``build`` (model, same seed on every worker) → ``set_ps`` → ``setup_dist`` (W > 1)
    → ``set_rates`` → per epoch ``begin_epoch`` then ``run_steps`` chunks → ``validate``."""

    def __init__(
        self,
        plan: TrainPlan,
        data: DataOptions,
        worker_id: int,
        num_workers: int,
        read_data: bool = True,
    ) -> None:
        """``read_data=False``: a worker for prediction/evaluation of a saved model, whose data
        comes per call. ``data``: the job's data options."""
        self.plan = plan
        self.worker_id = worker_id
        self.num_workers = num_workers
        torch.set_num_threads(plan.torch_threads)
        self.part = DataPart(data, worker_id, num_workers, plan.stream, read_data)
        self.ps: PSClient | None = None
        self.model: BaseModel | None = None
        self.opt: DenseOptimizer | None = None
        self.sched: RatePlan | None = None
        self._iter: Iterator[Batch] | None = None
        # The next batches with their rows in flight (angel.worker.prefetch.depth of them at
        # most); between run_steps, the first batch of the next one, its rows already pulled
        # (by the fused call of the previous run_steps's last update), and its epoch.
        self._ready: collections.deque[Prefetched] = collections.deque()
        self.cache: RowCache | None = None
        self._ready_epoch = -1
        self._epoch = -1
        self._peeked: Peeked | None = None  # (learners/worker/held_step.py)
        self._last_rates = UpdateRates.fixed(0.0)
        self._losses = LossSum()  # (read once per run_steps: no host sync per step)
        self.profile = StepProfile.of(plan, worker_id)  # (angel.worker.profile.*)

    def data_summary(self) -> dict[str, Any]:
        """Sizes and id range of this worker's data (the driver sizes the tables from them)."""
        return self.part.summary()

    # --- set-up -----------------------------------------------------------------------------

    def build(
        self, model_cfg: ModelConfig, size: JobSize, dense_spec: OptimizerSpec
    ) -> list[TableDecl]:
        """Build the model (same seed on every worker, so dense layers start identical) and
        its dense optimizer; return the PS tables the model reads."""
        plan = self.plan
        self.num_features = size.num_features
        self.num_fields = size.num_fields
        self.batch_size = size.batch_size
        self.frozen = set(plan.frozen)
        self.device = torch.device("cpu")
        if plan.device == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(
                    "angel.worker.device=cuda but this worker sees no CUDA device "
                    "(set angel.worker.device=cpu)"
                )
            self.device = torch.device("cuda")
        # Mixed precision on CUDA only: fp16 autocast with a dynamic loss scale (GradScaler's
        # rule: halve on a non-finite gradient and skip the update, double after 2000 good ones).
        self.amp = plan.amp and self.device.type == "cuda"
        self.loss_scale = 2.0**16 if self.amp else 1.0
        self.good_steps = 0
        self.model = build_model(model_cfg, seed=plan.seed)
        self.model.to(self.device)
        self.tables = self.model.tables()
        self.dedup = Dedup(self.num_features)
        # Frozen dense layers keep requires_grad=False: no gradient, no optimizer state.
        for name, module in self.model.dense_modules().items():
            if name.lower() in self.frozen:
                for p in module.parameters():
                    p.requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.ps_dense: list[tuple[str, nn.Parameter]] = []
        if plan.dense_placement == "ps":
            self.ps_dense = dense_tables_on_ps(self.model, self.tables, self.frozen)
            trainable = []
        self.opt = self.model.dense_optimizer(trainable, dense_spec) if trainable else None
        self.push_tables = [t for t in self.tables if t.name.lower() not in self.frozen]
        self.inputs = BatchInput(
            self.model,
            self.tables,
            self.frozen,
            self.device,
            self.num_fields,
            self.ps_dense,
            self.dedup,
        )
        self.task = self.model.task
        self.part.check_labels(self._check_labels)  # (a bad one named by file and line)
        self._side = SideStream(self.device)  # (where the next batch is built: CUDA)
        self.hold_tables([], "hash")
        torch.manual_seed(plan.seed + 7919 * (self.worker_id + 1))
        return self.tables

    def _check_labels(self, y: np.ndarray) -> None:
        """The labels ``y`` as a step checks them (binary: -1/+1 or 0/1; the model's own
        check otherwise, as its loss takes them); ValueError where one is not."""
        assert self.model is not None
        if self.task == "binary":
            binary_labels01(y)
        else:
            self.model.prepare_labels(torch.from_numpy(np.ascontiguousarray(y, np.float32)))

    def dense_param_count(self) -> int:
        """Number of worker-side (dense) parameters of the model."""
        assert self.model is not None
        return int(sum(p.numel() for p in self.model.parameters()))

    def set_ps(self, ps: PSClient) -> None:
        """The PS client handle of this worker (``PSClient.for_worker(i)``); a fresh worker
        cache with it (its clocks are this client's)."""
        self.ps = ps
        feed = self.plan.feed
        if feed.cache and self.model is not None:
            tables = [(t.name, t.cols, t.sparse) for t in self.tables]
            optimizers = {name: spec.optimizer for name, spec in ps.specs.items()}
            self.cache = worker_cache(
                feed, tables, self.num_features, self.num_workers, self.device, optimizers
            )

    def setup_dist(self, master_addr: str, master_port: int) -> None:
        """Join the process group of the dense all-reduce (:func:`learners.worker.dense.join_group`)."""
        join_group(master_addr, master_port, self.worker_id, self.num_workers, self.plan.collective)

    @staticmethod
    def free_port() -> tuple[str, int]:
        """An address and a free TCP port on this node, for worker 0 to host the process group."""
        return free_port()

    # --- the step ---------------------------------------------------------------------------

    def _input(
        self, batch: Batch, labels: bool = True
    ) -> tuple[SparseInput, Tensor | None, dict[str, np.ndarray], float]:
        """Dedup the batch ids, pull their rows, wrap them as leaf tensors."""
        assert self.ps is not None
        slots, req = self.inputs.request(batch)
        t0 = time.perf_counter()
        want, sp = self._cache_split(req, self.ps.step_count)
        pulled = self._with_held(self._cache_fill(sp, self.ps.pull_many(want)), req)
        pull_s = time.perf_counter() - t0
        x, y = self.inputs.prepare(batch, slots, labels)
        return self.inputs.attach(x, pulled), y, req, pull_s

    def _cache_split(
        self, req: dict[str, np.ndarray], clock: int, use_clock: int | None = None
    ) -> tuple[dict[str, np.ndarray], Split | None]:
        """The rows to pull for ``req`` once the worker cache has served what it may (and
        without the tables this worker group holds)."""
        return split_request(self.cache, self._from_ps(req), clock, use_clock)

    def _cache_fill(self, sp: Split | None, pulled: Mapping[str, np.ndarray]) -> RowMap:
        """The batch's rows: pulled ones and (with a split) those the cache served."""
        return fill_rows(self.cache, sp, pulled)

    def set_rates(self, rates: RatePlan | StepSizeScheduler) -> None:
        """The job's :class:`~learners.job.rate_plan.RatePlan` (a bare schedule is taken as the
        job's only one): sent by the driver when the job starts and again only when a
        metric-driven schedule changed it. It gives each update's step sizes and momenta; this
        worker advances it once per applied update and at each new epoch, so it is never sent
        back (the driver keeps its own copy in step from the updates ``run_steps`` reports)."""
        if isinstance(rates, StepSizeScheduler):
            rates = RatePlan(rates, on_batch=self.plan.decay_on_batch)
        self.sched = rates

    def begin_epoch(self, epoch: int, rates: RatePlan | StepSizeScheduler | None = None) -> int:
        """Start an epoch: a fresh (seeded) shuffle of this worker's part, and the rate plan
        moved to the epoch (per-epoch decay counts the epoch that ended). ``rates``: set the
        plan first (:meth:`set_rates`; a bare schedule starts at this epoch). Returns the
        number of batches of this worker's part."""
        if rates is not None:
            self.set_rates(rates)
            if isinstance(rates, StepSizeScheduler):
                assert self.sched is not None
                self.sched.epoch = epoch  # (it starts here: no epoch of it ended)
        if self.sched is None:
            raise RuntimeError("begin_epoch: no rate plan yet (set_rates first)")
        if not self._ready or self._ready_epoch != epoch:
            # (a batch prefetched for another epoch is dropped: its iterator is not this one)
            self._ready = collections.deque()
            self._iter = self._minibatches(epoch, self.part.opts.use_shuffle)
            self._peeked = None
        self._epoch = epoch
        self.sched.start_epoch(epoch)
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        return math.ceil(self.part.train_rows() / self.batch_size)

    def run_steps(
        self,
        n_updates: int,
        epoch_lr: float | None,
        prefetch: bool = False,
        next_epoch: int | None = None,
    ) -> StepStats:
        """Run ``n_updates`` optimizer updates (each of ``accum`` micro-batches).

        ``epoch_lr``: a fixed step size for every update; None (what the learner passes): this
        worker's copy of the rate plan gives each update's.

        ``prefetch``: another ``run_steps`` follows (of this epoch, or of ``next_epoch`` when
        given), so the last update's push also pulls the rows of that call's first batch, in
        one fused call per shard, instead of a push now and a pull then. The call is waited
        for before returning: every push is applied when ``run_steps`` returns (the driver may
        validate or save next), and the rows are those after the last update, which is what
        the next step would pull anyway."""
        assert self.model is not None and self._iter is not None and self.ps is not None
        assert self.sched is not None
        stats = StepStats()
        t_start = time.perf_counter()
        moved = self.ps.bytes_moved + self.held.bytes_moved
        self.model.train()
        self.held.train(True)
        # The next updates' first micro-batches, prepared while their rows are in flight: the
        # next one's come with this update's push (one fused push_pull call per shard per
        # step); under SSP up to angel.worker.prefetch.depth batches are in flight.
        queue, self._ready = self._ready, collections.deque()
        depth = self.plan.feed.prefetch_depth
        for u in range(n_updates):
            rates = self.sched.rates() if epoch_lr is None else UpdateRates.fixed(epoch_lr)
            last = u + 1 == n_updates
            # batches in flight after this update: this chunk's, then the next chunk's first
            want = 1 if last and prefetch else min(depth, n_updates - u - 1)
            # (a batch two updates ahead is peeked at within this epoch only: between epochs
            # the driver may validate, save or stop)
            fetch = want if self.plan.fused else 0
            peek = u + 2 < n_updates or (prefetch and next_epoch is None)
            self.profile.tick()
            self._update(rates, queue, stats, fetch, last, next_epoch, peek)
        self.profile.pause()  # (the driver's work between chunks is left out)
        # The last update's fused call (prefetch): wait for it here, after the dense step.
        t0 = time.perf_counter()
        self._ready = collections.deque(p._replace(rows=Resolved(p.rows.result())) for p in queue)
        stats.wait_s += time.perf_counter() - t0
        stats.elapsed_s = time.perf_counter() - t_start
        stats.bytes_moved = self.ps.bytes_moved + self.held.bytes_moved - moved
        stats.loss_sum = self._losses.take()
        if self.cache is not None:
            cs = self.cache.take_stats()
            stats.cache_on, stats.cache_lookups, stats.cache_hits = True, cs.lookups, cs.hits
        self._tier_stats(stats)
        if stats.updates:  # momentum, lr/<table>, ... of the last update (rate_plan.py)
            stats.last_rates = self._last_rates.record()
        return stats

    def _update(
        self,
        rates: UpdateRates,
        queue: collections.deque[Prefetched],
        stats: StepStats,
        want: int,
        last: bool,
        next_epoch: int | None,
        peek: bool = False,
    ) -> None:
        """One optimizer update at ``rates`` on the first batch of ``queue`` (or a batch
        pulled now); its push also pulls the rows of the next batch while fewer than ``want``
        are in flight (appended to ``queue``, prepared, their rows in flight); ``peek``: the
        batch after that one is of this epoch too."""
        assert self.ps is not None and self.sched is not None
        plan, parts = self.plan, self._accumulate(queue, stats)
        t0 = time.perf_counter()
        grads = {name: merge_rows(p) for name, p in parts.items() if p}
        assert self.model is not None
        every: dict[str, tuple[Any, Any]] = {**grads, **self.held.merged()}
        ok, coef = finish_grads(self.model, every, self.loss_scale, self.num_workers, plan.clip)
        stats.compute_s += time.perf_counter() - t0
        if not ok:
            self.held.clear()
            self._skip(stats)
            return
        scale = coef / self.num_workers
        t0 = time.perf_counter()
        update = {k: (ids, g * scale) for k, (ids, g) in grads.items()}
        if self.cache is not None:
            self.cache.note_push(update, rates.push, self.ps.step_count)
        # The tables the workers hold (updated by their owners) first: the device, or the
        # update thread of one worker, applies it while the next batch is built below.
        self.held.apply(scale, rates.push)
        if len(queue) < want:
            # Ray runs one caller's calls to an actor in order, so the rows returned are
            # those after this push (and, under BSP, after every worker's push).
            self._push_and_fetch(update, rates.push, last, next_epoch, queue, want, peek)
        else:
            self.ps.push_many(update, lr=rates.push)
        stats.push_s += time.perf_counter() - t0
        if self.opt is not None:
            self.opt.step(rates.dense_lr, rates.dense_momentum)
            self.opt.zero_grad(set_to_none=True)
        stats.updates += 1
        stats.last_lr = rates.lr
        self._last_rates = rates
        if self.amp:
            self.good_steps += 1
            if self.good_steps % 2000 == 0:
                self.loss_scale *= 2.0
        self.sched.advance()

    def _accumulate(
        self, queue: collections.deque[Prefetched], stats: StepStats
    ) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
        """Forward and backward of ``accum`` micro-batches: the row gradients of each table
        (one part per micro-batch); dense gradients accumulate in the parameters."""
        assert self.model is not None
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {
            t.name: [] for t in self.push_tables
        }
        grads: list[tuple[str, np.ndarray, Tensor]] = []
        for m in range(self.plan.accum):
            t0 = time.perf_counter()
            if m == 0 and queue:
                batch, x, y, req, rows = queue.popleft()
                self._side.hand_over(x, y, req)
                pulled = rows.result()
                stats.wait_s += time.perf_counter() - t0
                pulled = self._held_rows(pulled, req, stats)
                self._ask_ahead()  # (this update's reads are done)
                x = self.inputs.attach(x, pulled)
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
            # batch of k·b (otherwise the step is k times too large).
            if loss.requires_grad:  # everything frozen: nothing to differentiate
                (loss * (self.loss_scale / self.plan.accum)).backward()
            for t in self.push_tables:
                rg = x.rows[t.name].grad
                if rg is not None and t.name in self.held:
                    self.held.add_grad(t.name, req[t.name], unscaled(rg, self.loss_scale))
                elif rg is not None:
                    grads.append((t.name, req[t.name], unscaled(rg, self.loss_scale)))
            for name, p in self.ps_dense:
                if p.grad is not None and name in parts:
                    pg = unscaled(p.grad.detach().reshape(p.shape[0], -1), self.loss_scale)
                    grads.append((name, req[name], pg))
                    p.grad = None
            stats.compute_s += time.perf_counter() - t0
            stats.samples += num_rows(batch)
            self._losses.add(loss, num_rows(batch))
        # Down to the host together: on a GPU one synchronisation per update (none when every
        # table is held by the workers); the losses stay on the device (LossSum).
        for (name, ids, _), g in zip(grads, to_host([g for _, _, g in grads]), strict=True):
            parts[name].append((ids, g))
        return parts

    def _skip(self, stats: StepStats) -> None:
        """A non-finite gradient anywhere: no worker pushes, the dense optimizer does not step
        and the schedule does not advance (a skipped update is not an update)."""
        assert self.ps is not None
        stats.skipped += 1
        if self.amp:
            self.loss_scale /= 2.0
            self.good_steps = 0
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        # Still end this worker's step at the PS, so BSP peers are not kept waiting.
        self.ps.clock()

    def _push_and_fetch(
        self,
        update: Mapping[str, tuple[np.ndarray, np.ndarray]],
        lr: Step,
        last: bool,
        next_epoch: int | None,
        queue: collections.deque[Prefetched],
        want: int,
        peek: bool = False,
    ) -> None:
        """Push ``update`` and pull the next micro-batch's rows in one fused call per shard,
        then (SSP, the first update of a chunk) pull more batches until ``want`` are in flight.
        With ``peek`` (the batch after is of this epoch), one worker with device tiers also
        takes that batch and its ids now and asks for its misses (else :meth:`_accumulate`).

        The next micro-batch is of this chunk, or (``last``) of the next ``run_steps``: of this
        epoch, or of ``next_epoch``, whose iterator starts here. A batch ``k`` places down the
        queue is computed ``k`` clocks after the next one: its pull says so (``ahead``), and
        the shard serves it with SSP's waits for that clock."""
        assert self.ps is not None
        if last and next_epoch is not None:
            self._iter = self._minibatches(next_epoch, self.part.opts.use_shuffle)
            self._peeked = None  # (none is taken at an epoch's end: it would be of the last)
            self._epoch = self._ready_epoch = next_epoch
        elif last:
            self._ready_epoch = self._epoch
        clock = self.ps.step_count + 1  # after this push
        first = True
        while len(queue) < want:
            nb, n_slots, n_req = self._take_next()
            ahead = len(queue)
            pull, sp = self._cache_split(n_req, clock, clock + ahead)
            if first:
                fut = (
                    self.ps.push_pull_async(update, lr, pull, ahead=ahead)
                    if ahead
                    else self.ps.push_pull_async(update, lr, pull)
                )
                first = False
            else:
                fut = self.ps.pull_many_async(pull)
            rows: Rows = fut if sp is None else fut.map(partial(self._cache_fill, sp))
            if not queue:  # the device tiers' misses of this batch (and the next) come meanwhile
                peek = self._prefetch_held(n_req, peek and want == 1)
            # While the calls are in flight: the next batch's input minus its rows.
            with self._side.scope():
                nx, ny = self.inputs.prepare(nb, n_slots)
            queue.append(Prefetched(nb, nx, ny, n_req, rows))
        if peek and want == 1:
            self._peek()

    def _minibatches(self, epoch: int, shuffle: bool) -> Iterator[Batch]:
        return self.part.minibatches(self.batch_size, epoch, shuffle, self.plan.seed)

    def _next_batch(self) -> Batch:
        if self._peeked is not None:  # (taken ahead: the next one all the same)
            peeked, self._peeked = self._peeked[0], None
            return peeked
        assert self._iter is not None
        batch = next(self._iter, None)
        if batch is None:
            # This worker's part ran short of the common step count; start it over so that
            # every worker pushes once per step (BSP).
            self._iter = self._minibatches(self._epoch + 100_000, True)
            batch = next(self._iter)
        return batch

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
