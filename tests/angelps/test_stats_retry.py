"""PSClient.stats (and backup) while a shard Ray restarts: a call fails with "the actor is restarting", and a
handle's first Ray call to it after may fail with "the actor was restarted" though the new one
is up (the steps went over the data plane); the stats, which change nothing, are asked again,
and an error that stays past the client's timeout is raised."""

from __future__ import annotations

import time
from typing import Any

import pytest
from ray.exceptions import ActorUnavailableError

from angelps.client import ps_client
from angelps.client.ps_client import PSClient
from angelps.options import ClientOptions, ShardOptions


class _Method:
    def remote(self, **kw: Any) -> str:
        return "ref"


class _Handle:
    stats = _Method()
    run_backup = _Method()


def _client(
    fails: int, monkeypatch: pytest.MonkeyPatch, timeout_ms: int = 1000
) -> tuple[PSClient, list[int]]:
    client = PSClient.__new__(PSClient)
    client.handles = [_Handle(), _Handle()]  # type: ignore[list-item]
    shard = ShardOptions.from_config({"angel.matrixtransfer.request.timeout.ms": timeout_ms})
    client.options = ClientOptions(shard, transport="ray", data_host="")
    calls = [0]

    def get(refs: list[Any]) -> list[dict[str, Any]]:
        calls[0] += 1
        if calls[0] <= fails:
            raise ActorUnavailableError("The actor was restarted.", None)
        return [{"shard": i} for i in range(len(refs))]

    monkeypatch.setattr(client, "_get", get)
    monkeypatch.setattr(ps_client, "STATS_RETRIES", (0.0, 0.0, 0.05))
    return client, calls


def test_stats_are_asked_again_while_a_restarted_shard_answers_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, calls = _client(2, monkeypatch)
    assert client.stats() == [{"shard": 0}, {"shard": 1}]
    assert calls[0] == 3


def test_a_backup_asked_of_a_restarting_shard_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(A backup written twice is the same backup: before, Ray's error reached the caller.)"""
    client, calls = _client(2, monkeypatch)
    client.backup()
    assert calls[0] == 3


def test_a_shard_that_stays_unavailable_past_the_timeout_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, calls = _client(10**6, monkeypatch, timeout_ms=500)
    t0 = time.monotonic()
    with pytest.raises(ActorUnavailableError, match="restarted"):
        client.stats()
    # (asked at once, after 0 and 0 s, then every 0.05 s until the next wait would pass 0.5 s)
    assert time.monotonic() - t0 >= 0.4
    assert 4 <= calls[0] <= 13  # (no sleep is shorter than asked)


def test_a_shard_restarting_for_longer_than_the_waits_listed_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, calls = _client(6, monkeypatch)
    assert client.stats() == [{"shard": 0}, {"shard": 1}]
    assert calls[0] == 7
