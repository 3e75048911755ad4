"""The actors of one job: Ray started or joined, the placement reserved, the workers and the
shards started, and all of them stopped again.

:class:`JobActors` is one part of :class:`learners.job.learner.GraphLearner`: it holds the job's
options and its running actors; the training loop (learners/job/train_loop.py) and the start of a
saved model (learners/job/inference.py) use the same steps and read the same state.
"""

from __future__ import annotations

import atexit
import shutil
import weakref
from collections.abc import Callable

import ray

from angelconf.config import Config
from angelps import OptimizerSpec, PSClient, TableSpec
from angelps.file_store import files_for
from angelps.server.launch import start_shards, wait_started
from learners.job import cluster, failover, terminate
from learners.job.job_options import JobOptions
from learners.job.job_size import JobSize
from learners.job.placement import Layout, release, reserve
from learners.job.preflight import tables_up_front
from learners.job.sparse_placement import Placed, place_tables
from learners.job.startup import Phases, plural
from learners.models.config import ModelConfig, job_model_info
from learners.models.table_decl import table_specs
from learners.worker.group import WorkerGroup, get

__all__ = ["JobActors"]


class JobActors:
    """Ray, the placement, the workers and the shards of one job, with the options they are
    started from (changed by :class:`~learners.job.inference.Inference` to a saved model's)."""

    def __init__(self, conf: Config, address: str | None = None, quiet: bool = False) -> None:
        """``conf``: the job (Angel's keys applied); ``address``: --address (None:
        RAY_ADDRESS, else a private local Ray); ``quiet``: no start-up lines."""
        self.conf = conf
        #: the job's options by section, built once from ``conf`` (learners.job.job_options)
        self.options = JobOptions.from_config(conf)
        self.plan = self.options.loop
        self.ps_options = self.options.resources.ps
        self.address = address
        self.phases = Phases(quiet)
        #: whether this job started (or joined) Ray, and so stops (or leaves) it
        self.ray_started = False
        self.layout: Layout | None = None
        self.ps: PSClient | None = None
        self.workers: WorkerGroup | None = None
        self.tables: list[TableSpec] = []
        self.model: ModelConfig | None = None
        self.size: JobSize | None = None
        #: which tables the shards serve and which the workers hold (angel.sparse.placement)
        self.placed: Placed | None = None
        self._at_exit: Callable[[], None] | None = None

    def model_task(self) -> str:
        """The model's task (binary, multiclass, regression): what its metrics are."""
        return job_model_info(self.conf).task

    def start_ray(self) -> None:
        """A private local Ray, or the cluster of --address / RAY_ADDRESS (learners.job.cluster);
        then make sure it can hold the job's workers and shards before any of them starts."""
        if not ray.is_initialized():
            try:
                with self.phases.phase(cluster.start_label(self.address)):
                    cluster.start_or_join(self.address, self.plan.ray_connect_timeout_s)
            finally:  # up, even when a SIGTERM held during the start is raised now
                self.ray_started = ray.is_initialized()
        self._stop_at_exit()
        cluster.check_fits(self.plan, self.ps_options, self.options.resources.placement)

    def start_workers(self) -> WorkerGroup:
        """Create the worker actors (each loads its part of the data) and, when the tables'
        sizes are known without the data, the shards at the same time; size the job, build
        the model on every worker and hand each its PS client."""
        conf, plan = self.conf, self.plan  # start_ray checked that the cluster holds them
        data = self.options.data
        early = tables_up_front(conf, self.options)
        if early is not None:  # (the shards serve the tables that the workers do not hold)
            early = place_tables(plan, early).ps
        what = f"loading data on {plural(plan.workers, 'worker')}"
        if early is not None:
            what += f", launching {plural(self.ps_options.num_shards, 'shard')}"
        layout = self.reserve()
        with self.phases.phase(what):
            workers = self.workers = WorkerGroup(plan, data, layout=layout)
            summaries = workers.execute_async("data_summary")
            if early is not None:  # shards start while the workers read their data
                self.ps = self.launch(early, layout)
            size = JobSize.of_parts(plan, get(summaries), data.index_range, data.field_num)
        with self.phases.phase(f"building the model on {plural(plan.workers, 'worker')}"):
            model = self.options.model.sized(size.num_features, size.num_fields)
            self._build(workers, model, size)
            workers.join_process_group()
        return workers

    def _build(self, workers: WorkerGroup, model: ModelConfig, size: JobSize) -> None:
        """The model on every worker, the PS tables it reads, and each worker's PS handle."""
        dense = OptimizerSpec.from_conf(self.conf, "ml.fclayer.optimizer")
        decls = workers.execute("build", model, size, dense)[0]
        self.model, self.size = model, size
        self.tables = table_specs(self.conf, decls)
        free = None
        if self.plan.sparse.placement != "ps" and self.plan.sparse.capacity[0] == "auto":
            free = min(workers.execute("device_free_bytes"))
        self.placed = placed = place_tables(self.plan, self.tables, free)
        if placed.held:
            kind, sp = self.ps_options.partitioner, self.plan.sparse
            workers.execute("hold_tables", placed.held, kind, placed.tiers, sp.eviction, sp.admit)
        if self.ps is not None and list(self.ps.specs.values()) != placed.ps:
            self.ps.shutdown()  # launched early with other tables: start them again
            self.ps = None
        if self.ps is None:
            with self.phases.phase(f"launching {plural(self.ps_options.num_shards, 'shard')}"):
                self.ps = self.launch(placed.ps, workers.layout)
        if placed.tiers:  # (their shard backups would never be read: left out)
            self.ps.mark_tiers(list(placed.tiers))
        workers.attach_ps(self.ps)

    def held(self) -> list[TableSpec]:
        """The tables the workers hold (angel.sparse.placement)."""
        return self.placed.whole() if self.placed is not None else []

    def reserve(self) -> Layout:
        """The job's placement (learners.job.placement): a placement group reserved when
        angel.placement.strategy asks for one."""
        place = self.options.resources.placement
        asks = cluster.job_asks(self.plan, self.ps_options, place)
        if place.strategy == "none":
            return reserve(place, [], self.plan.workers, 0.0)
        with self.phases.phase(f"reserving a placement group ({place.strategy})"):
            self.layout = reserve(
                place, cluster.bundles(asks), self.plan.workers, self.ps_options.timeout_s
            )
        return self.layout

    def launch(self, tables: list[TableSpec], layout: Layout | None) -> PSClient:
        """Start the shards of ``tables`` where ``layout`` puts them and wait for them."""
        n = self.ps_options.num_shards
        where = [layout.shard(i) for i in range(n)] if layout is not None else None
        pending = start_shards(tables, self.ps_options, self.plan.workers, where)
        handles, opts = wait_started(pending)
        return PSClient(tables, handles, opts, 0, owner=True)

    def _stop_at_exit(self) -> None:
        """Stop this job's actors when the interpreter exits, if nothing stopped them before: a
        script that trains without ``with`` or ``shutdown()`` (README's example) left its
        shards' backups on disk, a folder a run. Ray's own exit hook, registered before this
        one, runs after it."""
        if self._at_exit is not None:
            return
        ref = weakref.ref(self)  # (the hook keeps no learner alive)

        def stop() -> None:
            me = ref()
            if me is not None:
                me.shutdown()

        self._at_exit = stop
        atexit.register(stop)

    def shutdown(self) -> None:
        """Stop the workers and the PS; stop Ray only if this learner started it."""
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
            self._at_exit = None
        at_once = self.ray_started and terminate.received()
        if at_once:
            # A SIGTERM (to the whole process group, as schedulers and `timeout` send it, or
            # to the driver): the private Ray's processes may be half-stopped already and
            # answer nothing; none is asked, and the Ray is ended at once below (its launch's
            # backups are removed as a stop removes them).
            self.workers = None
            if self.ps is not None:
                backups = self.ps.options.shard.backup_dir
                self.ps.net.close()
                self.ps = None
                # (on the disk only: no store is asked anything while the job is torn down)
                disk = files_for(backups).disk_path(backups) if backups else None
                if disk is not None:
                    shutil.rmtree(disk, ignore_errors=True)
                failover.remove_backup_root(self.ps_options, self.plan.log_dir)
        if self.workers is not None:
            self.workers.shutdown()
            self.workers = None
        if self.ps is not None:
            self.ps.shutdown()
            self.ps = None
            failover.remove_backup_root(self.ps_options, self.plan.log_dir)
        release(self.layout)
        self.layout = None
        if self.ray_started and ray.is_initialized():
            cluster.stop(at_once=at_once)
            self.ray_started = False
