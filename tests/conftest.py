"""Shared fixtures: one private local Ray per test module that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A local Ray for this module: 2 CPUs, no dashboard, its own temp dir, namespace angelps."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        namespace="angelps",
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
        log_to_driver=False,
    )
    yield
    ray.shutdown()
