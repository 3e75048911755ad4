"""A worker's held tables written into a checkpoint in the background
(learners/worker/held_save.py): the answer comes while the write goes on, the result is None
until the files are written (a worker serves one call at a time: the driver asks again), a
write given up is waited for before the next, and without memory for the copy the files are
written before the worker answers."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from angelps import malloc
from learners.worker import held_save
from learners.worker.held_save import HeldSaves


class _Held:
    """What HeldSaves needs of HeldTables: the copy's size, the copy, an inline save."""

    def __init__(self) -> None:
        self.frozen, self.saved = 0, []

    def frozen_nbytes(self) -> int:
        return 1 << 20

    def freeze(self) -> dict[str, Any]:
        self.frozen += 1
        return {"t": self.frozen}

    def save(self, root: str) -> dict[str, Any]:
        self.saved.append(root)
        return {f"{root}/inline": 1}


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    opened = threading.Event()

    def write(root: str, worker: int, tables: dict[str, Any]) -> dict[str, Any]:
        assert opened.wait(10)
        return {f"{root}/t/shard-{worker}.parquet": tables["t"]}

    monkeypatch.setattr(held_save, "write_held", write)
    monkeypatch.setattr(malloc, "available_bytes", lambda: 1 << 30)
    return opened


def test_the_result_is_none_until_the_files_are_written(gate: threading.Event) -> None:
    saves, held = HeldSaves(3), _Held()
    saves.start("ck", held)  # type: ignore[arg-type]
    assert saves.result(wait=False) is None
    gate.set()
    assert saves.result(wait=True) == {"ck/t/shard-3.parquet": 1}
    with pytest.raises(RuntimeError, match=r"^worker 3: no checkpoint is being written$"):
        saves.result(wait=False)


def test_a_write_given_up_is_waited_for_before_the_next(gate: threading.Event) -> None:
    saves, held = HeldSaves(0), _Held()
    saves.start("first", held)  # type: ignore[arg-type]
    threading.Timer(0.2, gate.set).start()
    saves.start("second", held)  # waits for the first, drops it
    assert saves.result(wait=True) == {"second/t/shard-0.parquet": 2}


def test_without_memory_for_the_copy_the_files_are_written_at_once(
    gate: threading.Event, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(malloc, "available_bytes", lambda: (1 << 21) - 1)
    saves, held = HeldSaves(1), _Held()
    for n in range(2):
        saves.start(f"c{n}", held)  # type: ignore[arg-type]
        assert saves.result(wait=False) == {f"c{n}/inline": 1}
    assert held.frozen == 0 and saves.inline == 2
    assert capsys.readouterr().err == (
        "angelps: warning: worker 1: a checkpoint of its held tables in the background would "
        "copy 1 MiB with 2 MiB of memory available: it and the next ones while memory stays "
        "short are written before training goes on\n"
    )


def test_a_held_table_s_copy_exports_what_the_table_did_over_several_chunks() -> None:
    """HeldTable.freeze copies the touched rows a chunk of 2^18 at a time (on a GPU, one
    chunk's gather at a time): the same chunks as the table's own export at that moment,
    whatever the table does after."""
    import numpy as np
    import torch

    from angelps import OptimizerSpec, TableSpec
    from angelps.partition import Partitioner
    from learners.worker.held_table import HeldTable

    spec = TableSpec("e", 700_000, 2, sparse=True, optimizer=OptimizerSpec("momentum"))
    t = HeldTable(spec, Partitioner(spec, 2, "hash"), 1, torch.device("cpu"))
    rng = np.random.default_rng(3)
    keys = np.sort(rng.choice(t.keys, 300_000, replace=False))
    w = rng.standard_normal((len(keys), 2)).astype(np.float32)
    (slot,) = t.slots  # (Momentum's one)
    t.assign(keys, w, {slot: -w})
    want = list(t.export_chunks())
    frozen = t.freeze()
    assert t.frozen_nbytes() == 300_000 * (4 * 4 + 8)
    t.assign(keys[:10], w[:10] + 1, {slot: w[:10]})  # the table changes; its copy does not
    got = list(frozen.export_chunks(chunk=1 << 18))
    assert len(got) == len(want) == 2
    for (k1, w1, s1), (k2, w2, s2) in zip(got, want, strict=True):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(s1[slot], s2[slot])
