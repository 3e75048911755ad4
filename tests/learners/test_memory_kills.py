"""The failover's account of the job's processes Ray killed for memory (learners/job/memory_kills.py):
the error's words, and a job that stops rather than restarts. The whole chain on a real Ray
(its memory monitor made to kill early): tests/faults/test_node_out_of_memory.py."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import RayError

from angelps import memory_kills as ray_kills
from learners.job import failover, memory_kills
from learners.job.memory_kills import MemoryKill, NodeOutOfMemory, out_of_memory
from learners.worker.group import WorkerDied

NODE = "Memory on the node (IP: 10.0.0.7, ID: ab12) was 22.40GB used / 23.54GB limit (0.951)"
DETAIL = (
    "2 worker(s) were killed due to the node running low on memory. " + NODE + "\n"
    "OOM kill reason: Memory usage 24051816448B exceeded threshold"
)


def test_the_error_names_each_process_killed_its_memory_the_node_and_what_to_change() -> None:
    kills = [
        MemoryKill(501, 7 * 2**30, NODE),
        MemoryKill(502, 3 * 2**29, NODE.replace("22.40", "22.10")),
        MemoryKill(900, 2**29, ""),
        MemoryKill(901, 0, ""),
    ]
    err = out_of_memory(
        "worker 0 died (a shard died during a device tier's exchange with shards [0, 1] "
        "(ChannelDown))",
        kills,
        {501: "parameter shard 0", 502: "parameter shard 1"},
        "/data/model",
    )
    assert isinstance(err, NodeOutOfMemory)
    assert str(err) == (
        "worker 0 died (a shard died during a device tier's exchange with shards [0, 1] "
        "(ChannelDown)): Ray killed parameter shard 0 (pid 501, 7.00 GiB), parameter shard 1 "
        "(pid 502, 1.50 GiB), 2 other processes (pids 900, 901; 0.50 GiB together) because "
        "the node ran low on memory (Memory on the node (IP: 10.0.0.7, ID: ab12) was 22.10GB "
        "used / 23.54GB limit (0.951)). A restart would run the same steps into the same "
        "limit, so the job stops here; its last checkpoint, if it wrote one, is kept in "
        "/data/model. To fit: " + memory_kills.REMEDIES
    )
    for key in ("angel.ps.number", "angel.worker.table.capacity", "RAY_memory_usage_threshold"):
        assert key in memory_kills.REMEDIES
    one = out_of_memory("x", [MemoryKill(7, 0, "")])
    assert str(one).startswith(
        "x: Ray killed a process (pid 7) because the node ran low on "
        "memory. A restart would run the same steps into the same limit, "
        "so the job stops here. To fit: "
    )


def test_rays_line_about_the_node_is_taken_from_the_kills_detail() -> None:
    assert ray_kills._node(SimpleNamespace(exit_detail=DETAIL)) == NODE
    assert ray_kills._node(SimpleNamespace(exit_detail="killed")) == ""


class _Loop:
    """What WorkerFailover.restart touches of a training loop."""

    def __init__(self) -> None:
        self.actors = SimpleNamespace(workers=None, ps=SimpleNamespace(shard_pids={1: 501}))
        self.prepared = 0

    def prepare(self, resume: bool, log: Any) -> Any:
        self.prepared += 1
        return SimpleNamespace(samples=0, train_s=0.0)


def _failover(monkeypatch: pytest.MonkeyPatch, kills: list[MemoryKill]) -> failover.WorkerFailover:
    seen: list[int] = []
    monkeypatch.setattr(failover, "memory_kills", lambda since: seen.append(since) or kills)
    monkeypatch.setattr(failover, "_stop", lambda actors: None)
    f = failover.WorkerFailover(failover.FailoverOptions(max_restarts=3), None)
    f.seen = seen  # type: ignore[attr-defined]
    return f


def test_a_worker_death_after_a_memory_kill_stops_the_job_instead_of_restarting_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _failover(monkeypatch, [MemoryKill(501, 2**30, NODE)])
    loop = _Loop()
    died = WorkerDied(0, "a shard died during a device tier's exchange (ChannelDown)")
    with pytest.raises(NodeOutOfMemory) as e:
        f.restart(loop, died, None, SimpleNamespace(samples=0, train_s=0.0))
    assert str(e.value).startswith(
        "worker 0 died (a shard died during a device tier's exchange (ChannelDown)): Ray killed "
        "parameter shard 1 (pid 501, 1.00 GiB) because the node ran low on memory"
    )
    assert e.value.__cause__ is died
    assert loop.prepared == 0 and f.restarts == 0
    assert "restarting" not in capsys.readouterr().err


def test_a_worker_death_without_a_memory_kill_restarts_and_counts_kills_from_then(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _failover(monkeypatch, [])
    first = f.since_ms
    loop = _Loop()
    time.sleep(0.01)
    f.restart(loop, WorkerDied(0, "killed"), None, SimpleNamespace(samples=0, train_s=0.0))
    assert loop.prepared == 1 and f.restarts == 1
    assert f.seen == [first] and f.since_ms > first  # type: ignore[attr-defined]
    assert "restarting the workers and parameter shards from the beginning" in (
        capsys.readouterr().err
    )


def test_a_failure_is_said_as_the_memorys_only_where_ray_killed_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    found: list[MemoryKill] = []

    def read(since: int) -> list[MemoryKill]:
        reads.append(since)
        return list(found)

    monkeypatch.setattr(ray_kills, "_read", read)
    t0 = time.monotonic()
    assert memory_kills.explained(ValueError("bad line"), 5) is None
    assert reads == [5] and time.monotonic() - t0 < 0.5  # (a bad input is not waited on)
    found.append(MemoryKill(7, 0, NODE))
    ray_error = RayError("1 worker(s) were killed due to the node running low on memory. " + NODE)
    err = memory_kills.explained(ray_error, 5, save_path="m")
    assert isinstance(err, NodeOutOfMemory)
    assert str(err).startswith(
        "RayError: 1 worker(s) were killed due to the node running low on memory: Ray killed a "
        "process (pid 7) because the node ran low on memory (" + NODE + "). A restart"
    )
    assert memory_kills.explained(err, 5) is None  # (said already)


def test_save_after_a_failed_train_says_why_there_is_nothing_to_save(tmp_path: Any) -> None:
    from pathlib import Path

    from learners.job.learner import GraphLearner

    root = Path(__file__).resolve().parents[2]
    learner = GraphLearner.from_properties(root / "conf" / "lr_a9a.properties")
    with pytest.raises(RuntimeError, match=r"^save\(\): nothing trained or loaded yet$"):
        learner.save(tmp_path / "m")
    learner.actors.ps = SimpleNamespace()  # type: ignore[assignment]  (a failed train: no workers)
    with pytest.raises(RuntimeError) as e:
        learner.save(tmp_path / "m")
    assert str(e.value) == (
        "save(): the job's workers were stopped by the failure of the last train(); nothing to "
        "save: train again, or load a checkpoint"
    )
