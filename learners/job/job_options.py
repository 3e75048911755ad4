"""The options of one job, built once at its entry point: :class:`JobOptions` and its sections.

``JobOptions.from_config(conf)`` turns a loaded :class:`~angelconf.config.Config` into frozen
sections, each an option object whose fields name their keys (``angelconf.options.key_field``):

- ``loop``: :class:`~learners.job.loop_options.TrainPlan`, what the driver's loop and every
  worker read (epochs, batches, devices, the checkpoint and log paths it writes);
- ``data``: :class:`~learners.data.options.DataOptions`, what the readers take;
- ``model``: :class:`~learners.models.config.ModelConfig`, the hyper-parameters (its sizes come
  from the data: :meth:`ModelConfig.sized`);
- ``resources``: :class:`Resources`, the shards (:class:`~angelps.options.PSOptions`) and where
  the actors go (:class:`~learners.job.placement.Placement`);
- ``feed``: :class:`~learners.worker.feed.FeedOptions`, how a worker gets its rows (the loop's
  own, ``loop.feed``: the workers receive it with the plan).

GraphLearner builds it in its constructor (and again for a saved model's configuration), the
``schedule`` verb once for its preview; each part of the job takes the section it needs instead of
reading the configuration again. Standard library and the key modules only, like them: the
config-only verbs build it without torch or Ray.

The checkpoint and log settings are fields of the loop section (``save_path``, ``keep_last``,
``log_dir``, ...), not sections of their own: the driver's loop replaces ``save_path`` when the
model is saved into the run's folder, and the workers receive them with the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from angelps.options import PSOptions
from learners.data.options import DataOptions
from learners.job.loop_options import TrainPlan
from learners.job.placement import Placement
from learners.models.config import ModelConfig
from learners.worker.feed import FeedOptions

__all__ = ["JobOptions", "Resources"]


@dataclass(frozen=True)
class Resources:
    """Where a job's actors run and what the shards take: the parameter server's options and
    the placement (custom resources, placement group). The workers' CPUs and GPUs are the
    loop's (``TrainPlan.worker_cpus``, ``worker_gpus``): every worker reads them."""

    ps: PSOptions
    placement: Placement


@dataclass(frozen=True)
class JobOptions:
    """Every typed option of one job, by section (module docstring)."""

    loop: TrainPlan
    data: DataOptions
    resources: Resources
    #: the configuration the model section is read from, when first asked for
    conf: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> JobOptions:
        """The options of ``conf`` (a loaded Config; a plain mapping takes the keys' defaults)."""
        return cls(
            loop=TrainPlan.from_config(conf),
            data=DataOptions.from_config(conf),
            resources=Resources(PSOptions.from_config(conf), Placement.from_config(conf)),
            conf=conf,
        )

    @property
    def feed(self) -> FeedOptions:
        """How a worker gets its rows (prefetch, worker cache): the loop's, sent with it."""
        return self.loop.feed

    @cached_property
    def model(self) -> ModelConfig:
        """The model's hyper-parameters, sizes 0 until the data gives them (``sized``).

        Read when first asked for, not in :meth:`from_config`: an unknown model class or a bad
        layer graph is reported where the job checks its model (``learners.job.preflight``),
        after the keys, as before this object existed."""
        return ModelConfig.from_config(self.conf, 0, None)
