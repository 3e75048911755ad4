"""``gather``: a failed call whose peer was killed at the same time is reported as the death
(the job restarts), not as the peer's broken collective (the job stops)."""

from __future__ import annotations

import os
import time

import pytest
import ray
from ray.exceptions import RayTaskError

from learners.data import DataError
from learners.worker import group
from learners.worker.group import WorkerDied, gather, get


@ray.remote(num_cpus=0, max_restarts=0)
class Peer:
    def fail(self, after: float) -> None:
        time.sleep(after)
        raise RuntimeError("gloo: Connection reset by peer")

    def bad_input(self, after: float) -> None:
        time.sleep(after)
        raise DataError("part-0:3: a label 'x' is not a number")

    def die(self, after: float) -> None:
        time.sleep(after)
        os._exit(1)

    def wait(self, after: float) -> str:
        time.sleep(after)
        return "done"


pytestmark = pytest.mark.usefixtures("ray_local")


def test_a_peer_error_that_reaches_the_driver_before_the_death_is_reported_as_the_death() -> None:
    # worker 1 is killed at 1.0 s; worker 0's collective breaks at 0.3 s and says so first
    a, b = Peer.remote(), Peer.remote()
    with pytest.raises(WorkerDied) as e:
        gather([a.fail.remote(0.3), b.die.remote(1.0)])
    assert e.value.index == 1
    assert isinstance(e.value.__cause__, RayTaskError)


def test_a_failure_without_a_death_is_raised_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group, "DEATH_GRACE_S", 0.5)
    a, b = Peer.remote(), Peer.remote()
    start = time.monotonic()
    with pytest.raises(RayTaskError, match="Connection reset by peer"):
        gather([a.fail.remote(0.0), b.wait.remote(20.0)])
    assert time.monotonic() - start < 10.0  # (not the peer's 20 s)


def test_a_failure_whose_peers_all_answer_is_raised_as_soon_as_they_do() -> None:
    a, b, c = Peer.remote(), Peer.remote(), Peer.remote()
    with pytest.raises(RayTaskError, match="Connection reset by peer"):
        gather([a.fail.remote(0.0), b.wait.remote(0.2), c.wait.remote(0.2)])


def test_a_bad_input_error_is_raised_as_itself_without_waiting_for_the_peers() -> None:
    a, b = Peer.remote(), Peer.remote()
    start = time.monotonic()
    with pytest.raises(DataError, match="part-0:3"):
        get([a.bad_input.remote(0.0), b.wait.remote(20.0)])
    assert time.monotonic() - start < group.DEATH_GRACE_S
