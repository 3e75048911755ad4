"""Where a job's shards and workers run: Ray custom resources and a placement group.

- ``angel.ps.resources`` / ``angel.worker.resources`` (``ps:1``, ``worker:1,ssd:0.5``): each
  shard / worker asks Ray for these custom resources, so it runs only on nodes started with
  them (``ray start --resources '{"ps": 4}'``). This is how shards and workers are pinned to
  nodes.
- ``angel.placement.strategy``: ``none`` (each actor wherever Ray finds room), ``pack`` or
  ``spread``: one Ray placement group with a bundle per worker and per shard, reserved before
  any actor starts (Ray's PACK: as few nodes as possible; SPREAD: as many as possible).

:class:`Placement` is built from the configuration (standard library only); :func:`reserve`
makes the placement group, :class:`Layout` gives each actor its Ray options, :func:`release`
frees the group. The pre-launch check (:func:`learners.job.cluster.check_fits`) counts the custom
resources too, so a resource that no node has is an error at once, not an actor that waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from angelconf.config import ConfigError
from angelconf.options import key_field, read_keys
from learners.job.loop_options import PLACEMENT, PS_RESOURCES, WORKER_RESOURCES, parse_resources

__all__ = ["Layout", "Placement", "release", "reserve"]

#: A bundle of a placement group cannot be empty: an actor that asks for nothing gets this.
_MIN_CPU = 0.01


@dataclass(frozen=True)
class Placement:
    """The placement keys of a job, parsed."""

    ps_resources: Mapping[str, float] = key_field(PS_RESOURCES, convert=parse_resources)
    worker_resources: Mapping[str, float] = key_field(WORKER_RESOURCES, convert=parse_resources)
    #: none, pack or spread
    strategy: str = key_field(PLACEMENT)

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> Placement:
        """The placement keys of ``conf`` (a Config or a mapping; a missing key: its default)."""
        return cls(**read_keys(cls, conf))


@dataclass
class Layout:
    """Each actor's Ray options for its place: custom resources, and its bundle of the
    placement group (None: no group)."""

    placement: Placement
    group: Any = None
    num_workers: int = 0

    def worker(self, i: int) -> dict[str, Any]:
        """Ray actor options of worker ``i``."""
        return self._options(self.placement.worker_resources, i)

    def shard(self, i: int) -> dict[str, Any]:
        """Ray actor options of shard ``i``."""
        return self._options(self.placement.ps_resources, self.num_workers + i)

    def _options(self, resources: Mapping[str, float], bundle: int) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if resources:
            opts["resources"] = dict(resources)
        if self.group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=bundle
            )
        return opts


def reserve(
    placement: Placement, bundle_list: list[dict[str, float]], num_workers: int, timeout_s: float
) -> Layout:
    """The layout of a job: with a strategy, a placement group reserved on the cluster (Ray
    must be up), waited for at most ``timeout_s``."""
    if placement.strategy == "none":
        return Layout(placement, None, num_workers)
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(bundle_list, strategy=placement.strategy.upper())
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise ConfigError(
            f"{PLACEMENT.name}={placement.strategy}: the Ray cluster did not reserve the "
            f"placement group of this job within {timeout_s:g} s (bundles {bundle_list}); "
            "other jobs may hold the resources, or set angel.placement.strategy=none"
        )
    return Layout(placement, group, num_workers)


def release(layout: Layout | None) -> None:
    """Free the placement group of ``layout`` (if any); errors of a Ray already gone are
    ignored."""
    if layout is None or layout.group is None:
        return
    try:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(layout.group)
    except Exception:
        pass
    layout.group = None
