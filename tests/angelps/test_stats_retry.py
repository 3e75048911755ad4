"""PSClient.stats after a shard Ray restarted: a handle's first Ray call to it may fail with
"the actor was restarted" though the new one is up (the steps went over the data plane); the
stats, which change nothing, are asked again, and an error that stays is raised."""

from __future__ import annotations

from typing import Any

import pytest
from ray.exceptions import ActorUnavailableError

from angelps.client import ps_client
from angelps.client.ps_client import PSClient


class _Method:
    def remote(self) -> str:
        return "ref"


class _Handle:
    stats = _Method()


def _client(fails: int, monkeypatch: pytest.MonkeyPatch) -> tuple[PSClient, list[int]]:
    client = PSClient.__new__(PSClient)
    client.handles = [_Handle(), _Handle()]  # type: ignore[list-item]
    calls = [0]

    def get(refs: list[Any]) -> list[dict[str, Any]]:
        calls[0] += 1
        if calls[0] <= fails:
            raise ActorUnavailableError("The actor was restarted.", None)
        return [{"shard": i} for i in range(len(refs))]

    monkeypatch.setattr(client, "_get", get)
    monkeypatch.setattr(ps_client, "STATS_RETRIES", (0.0, 0.0, 0.0))
    return client, calls


def test_stats_are_asked_again_while_a_restarted_shard_answers_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, calls = _client(2, monkeypatch)
    assert client.stats() == [{"shard": 0}, {"shard": 1}]
    assert calls[0] == 3


def test_a_shard_that_stays_unavailable_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    client, calls = _client(10, monkeypatch)
    with pytest.raises(ActorUnavailableError, match="restarted"):
        client.stats()
    assert calls[0] == 4
