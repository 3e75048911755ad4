"""The documented public faces of the three packages (README, docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_learners_face() -> None:
    from learners import GraphLearner
    from learners.job.learner import GraphLearner as Defined

    assert GraphLearner is Defined


def test_angelps_face() -> None:
    import angelps
    from angelps import OptimizerSpec, ParameterShard, PSClient, TableSpec, load_config

    assert {"PSClient", "ParameterShard", "TableSpec", "OptimizerSpec", "load_config"} <= set(
        angelps.__all__
    )
    assert all(callable(x) for x in (OptimizerSpec, ParameterShard, PSClient, TableSpec))
    assert load_config.__module__ == "angelps.options"  # the PS's keys by default


def test_decay_face() -> None:
    from decay import StepSizeScheduler, from_conf

    s = from_conf({"ml.opt.decay.class.name": "StepLR", "ml.opt.decay.step.size": "2"})
    assert isinstance(s, StepSizeScheduler)


def test_an_unknown_name_is_an_attribute_error() -> None:
    import angelps
    import learners

    for pkg in (angelps, learners):
        try:
            pkg.NoSuchThing  # noqa: B018
        except AttributeError as e:
            assert "NoSuchThing" in str(e)
        else:  # pragma: no cover - the assertion below reports it
            raise AssertionError(f"{pkg.__name__}.NoSuchThing did not raise")


def test_importing_the_package_faces_loads_nothing_heavy(heavy_after) -> None:
    """The faces are lazy: `import angelps, learners` pays only for what is used."""
    assert heavy_after("import angelps, learners, decay") == []


def test_the_probe_sees_a_heavy_import(heavy_after) -> None:
    # The "nothing heavy" checks above must be able to fail.
    assert heavy_after("import numpy") == ["numpy"]
