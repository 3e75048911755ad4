"""A shard's backups written in the background (``angel.ps.backup.async``, the default), on a
:class:`ShardServer` driven directly (no Ray): the shard goes on serving while a backup is
written; the backup holds the rows and clocks of the moment it was taken, not of when it lands;
a reply reports its clock only once it is in place; a failed write stops the next call with
one message and leaves the previous backup; a load waits for a backup being written."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from angelps import malloc
from angelps.checkpoint import backups
from angelps.checkpoint.backups import read_backup
from angelps.options import PSOptions, ShardOptions
from angelps.server import shard_backups
from angelps.server.shard import ParameterShard
from angelps.server.shard_server import ShardServer
from angelps.step_call import StepCall
from angelps.storage.rows import PagedRows
from angelps.table import OptimizerSpec, TableSpec

W = TableSpec("w", rows=-1, cols=2, sparse=True, init="zeros", optimizer=OptimizerSpec("adam"))
B = TableSpec("b", rows=4, cols=1, init="zeros", optimizer=OptimizerSpec("momentum"))
KEYS = np.array([3, 17, 2**40 + 5, 901], dtype=np.int64)


def _server(tmp_path: Path, interval: int = 2, background: bool = True) -> ShardServer:
    ps = PSOptions.from_config(
        {"angel.ps.backup.interval": interval, "angel.ps.backup.async": background}
    )
    opts = ShardOptions.of(ps, 1, backup_dir=str(tmp_path / "bk"))
    return ShardServer(0, 1, [W, B], opts)


def _push(clock: int) -> StepCall:
    """Worker 0's push for ``clock``: gradients that differ from clock to clock."""
    g = np.arange(len(KEYS) * 2, dtype=np.float32).reshape(-1, 2) + clock
    b = np.full((4, 1), 0.5 - clock, dtype=np.float32)
    pushes = {"w": (np.sort(KEYS[: 2 + clock % 3]), g[: 2 + clock % 3]), "b": (np.arange(4), b)}
    return StepCall(0, clock, pushes, 0.1)


def _rows(shard: ParameterShard) -> dict[str, Any]:
    return {name: shard.export(name) for name in ("w", "b")}


def _backup_rows(backup_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The latest backup's rows (restored into a fresh shard) and its manifest."""
    info = read_backup(backup_dir)
    assert info is not None
    root, meta = info
    fresh = ParameterShard(0, 1, [W, B])
    fresh.load(root, meta)
    return _rows(fresh), meta


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for name in a:
        np.testing.assert_array_equal(a[name][0], b[name][0])
        np.testing.assert_array_equal(a[name][1], b[name][1])
        for slot in a[name][2]:
            np.testing.assert_array_equal(a[name][2][slot], b[name][2][slot])


class _Held:
    """``write_backup`` held until released, as a slow disk would hold it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: OSError | None = None) -> None:
        self.started, self.gate = threading.Event(), threading.Event()
        real = shard_backups.write_backup

        def write(backup_dir: str, image: Any, meta: Any) -> str:
            self.started.set()
            assert self.gate.wait(30)
            if fail is not None:
                raise fail
            return real(backup_dir, image, meta)

        monkeypatch.setattr(shard_backups, "write_backup", write)


def test_the_shard_serves_while_a_backup_is_written_and_reports_it_once_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = _server(tmp_path)  # (its start-up backup, clock 0, written before it serves)
    held = _Held(monkeypatch)
    bk = srv.backups.dir

    async def run() -> None:
        got = [(await srv.step(_push(c))).backed_up for c in range(2)]
        assert await asyncio.to_thread(held.started.wait, 10)
        assert srv.backups.stats()["writing"]
        at_two = _rows(srv.shard)  # what the backup being written must hold
        # Three more updates while it is held; the interval ends again at 4 but one backup is
        # written at a time.
        got += [(await srv.step(_push(c))).backed_up for c in range(2, 5)]
        assert got == [0] * 5  # not reported before it is in place
        assert _backup_rows(bk)[1]["clocks"]["pushed"] == [0]
        held.gate.set()
        await srv.backups.written()
        rows, meta = _backup_rows(bk)
        assert meta["clocks"] == {"pushed": [2], "applied": 2}
        _same(rows, at_two)
        assert not _equal(at_two, _rows(srv.shard))  # (the shard went on: 5 updates now)
        # The next update starts the backup that was due (clock 6), reported once written.
        assert (await srv.step(_push(5))).backed_up == 2
        await srv.backups.written()
        assert (await srv.step(StepCall(0, 6, None, 0.1, {"w": KEYS}))).backed_up == 6
        _same(_backup_rows(bk)[0], _rows(srv.shard))

    asyncio.run(run())
    st = srv.backups.stats()
    assert (st["count"], st["writing"]) == (2, False)
    assert 0 < st["copy_s"] < st["seconds"]


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    try:
        _same(a, b)
    except AssertionError:
        return False
    return True


def test_a_backup_that_fails_in_the_background_stops_the_next_call_and_keeps_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = _server(tmp_path)
    bk = srv.backups.dir
    start = _backup_rows(bk)[0]
    held = _Held(monkeypatch, fail=OSError(errno.ENOSPC, "No space left on device"))

    async def run() -> None:
        for c in range(2):
            await srv.step(_push(c))
        held.gate.set()
        await srv.backups.written()
        before = _rows(srv.shard)
        with pytest.raises(RuntimeError) as e:
            await srv.step(_push(2))
        assert str(e.value) == (
            f"shard 0: its backup under {bk} failed (OSError: [Errno 28] No space left on "
            "device); the job stops rather than train on without one: make room there, "
            "choose another angel.ps.backup.path or set angel.ps.backup.interval=0"
        )
        _same(_rows(srv.shard), before)  # the refused call changed nothing

    asyncio.run(run())
    rows, meta = _backup_rows(bk)  # the start-up backup, untouched; no temporary left
    assert meta["clocks"]["pushed"] == [0]
    _same(rows, start)
    assert sorted(p.name.split("-")[0] for p in Path(bk).iterdir()) == ["LATEST", "b"]


def test_a_load_waits_for_the_backup_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load writes a backup of the loaded rows; the older one being written lands first,
    never after it (a restart would then go back to before the load)."""
    srv = _server(tmp_path)
    bk = srv.backups.dir
    other = ParameterShard(0, 1, [W, B])
    for c in range(3):
        other.push(0, c, _push(c).pushes, 0.1)
    saved = backups.write_backup(str(tmp_path / "ckpt"), other, other.backup_meta())
    ckpt, manifest = read_backup(str(tmp_path / "ckpt")) or ("", {})
    assert ckpt.endswith(saved)
    held = _Held(monkeypatch)

    async def run() -> None:
        for c in range(2):
            await srv.step(_push(c))
        load = asyncio.ensure_future(srv.load(ckpt, manifest))
        await asyncio.sleep(0.2)
        assert not load.done()
        held.gate.set()
        await load

    asyncio.run(run())
    rows, meta = _backup_rows(bk)
    assert meta["clocks"]["pushed"] == [0]  # the load's backup, written last
    _same(rows, _rows(other))
    _same(_rows(srv.shard), _rows(other))


def test_inline_backups_are_reported_at_once(tmp_path: Path) -> None:
    srv = _server(tmp_path, background=False)

    async def run() -> list[int]:
        return [(await srv.step(_push(c))).backed_up for c in range(5)]

    assert asyncio.run(run()) == [0, 2, 2, 4, 4]
    st = srv.backups.stats()
    assert (st["count"], st["copy_s"], st["writing"]) == (2, 0.0, False)
    assert _backup_rows(srv.backups.dir)[1]["clocks"]["pushed"] == [4]


def test_at_the_end_of_the_job_the_backup_being_written_stops_and_no_other_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop_backups`` (the client's shutdown, before it removes the backups): the write
    stops at its next chunk, its temporary removed, the last backup as it was, and the shard
    writes no backup after it (none may land once the backups are removed)."""
    srv = _server(tmp_path)
    bk = srv.backups.dir
    held = _Held(monkeypatch)

    async def run() -> None:
        for c in range(2):
            await srv.step(_push(c))
        stop = asyncio.ensure_future(srv.stop_backups())
        await asyncio.sleep(0.1)
        assert not stop.done()  # it waits for the write to end
        held.gate.set()
        await stop
        for c in range(2, 6):
            assert (await srv.step(_push(c))).backed_up == 0
        assert not srv.backups.stats()["writing"]

    asyncio.run(run())
    assert _backup_rows(bk)[1]["clocks"]["pushed"] == [0]
    assert sorted(p.name.split("-")[0] for p in Path(bk).iterdir()) == ["LATEST", "b"]
    assert srv.backups.stats()["count"] == 0


def test_a_frozen_table_exports_what_the_table_exported_when_frozen() -> None:
    """The copy a background backup writes, over several pages of rows (a read of a range
    page by page) and a dense table: the same chunks as the table's own export at that
    moment, whatever the table does after."""
    rows = PagedRows(3, np.float32, page_rows=16)
    rows.reserve(100)
    rows.write(0, np.arange(300, dtype=np.float32).reshape(100, 3))
    np.testing.assert_array_equal(rows.read(5, 77), rows.gather(np.arange(5, 77)))
    np.testing.assert_array_equal(rows.read(33, 33), np.zeros((0, 3), np.float32))
    np.testing.assert_array_equal(rows.read(20, 52, cols=2), rows.gather(np.arange(20, 52), 2))

    shard = ParameterShard(0, 1, [W, B])
    w = shard.tables["w"]  # pages of 16 rows: the sparse table over 4 pages
    w.rows = PagedRows(w.width, w.dtype, page_rows=16)
    keys = np.random.default_rng(0).choice(10**9, 60, replace=False)
    shard.push(0, 0, {"w": (np.sort(keys), np.ones((60, 2), np.float32))}, 0.1)
    want = {n: list(t.export_chunks(chunk=7)) for n, t in shard.tables.items()}
    frozen = {n: t.freeze() for n, t in shard.tables.items()}
    shard.push(0, 1, _push(1).pushes, 0.1)  # the table changes; its copy does not
    for name, chunks in want.items():
        got = list(frozen[name].export_chunks(chunk=7))
        assert len(got) == len(chunks) == (9 if name == "w" else 1)
        for (k1, w1, s1), (k2, w2, s2) in zip(got, chunks, strict=True):
            np.testing.assert_array_equal(k1, k2)
            np.testing.assert_array_equal(w1, w2)
            assert s1.keys() == s2.keys()
            for slot in s1:
                np.testing.assert_array_equal(s1[slot], s2[slot])


def test_without_memory_for_the_copy_a_backup_is_written_inline_and_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = _server(tmp_path)
    # b: 4 rows of a weight and its momentum, 8 bytes and a key each
    assert srv.shard.snapshot_nbytes() == 4 * (8 + 8)
    asyncio.run(srv.step(_push(0)))  # w: 2 rows of 2 weights, Adam's 2 x 2 moments and t
    assert srv.shard.snapshot_nbytes() == 4 * (8 + 8) + 2 * (28 + 8)
    monkeypatch.setattr(srv.shard, "snapshot_nbytes", lambda backup=False: 3 << 30)

    async def run() -> list[int]:
        monkeypatch.setattr(malloc, "available_bytes", lambda: 6 << 30)  # twice the copy
        got = [(await srv.step(_push(1))).backed_up]  # in the background
        await srv.backups.written()
        monkeypatch.setattr(malloc, "available_bytes", lambda: 5 << 30)  # short: inline
        return got + [(await srv.step(_push(c))).backed_up for c in range(2, 6)]

    assert asyncio.run(run()) == [0, 2, 4, 4, 6]
    st = srv.backups.stats()
    assert (st["count"], st["inline"], st["writing"]) == (3, 2, False)
    assert capsys.readouterr().err == (
        "angelps: warning: shard 0: a backup in the background would copy 3,072 MiB with "
        "5,120 MiB of memory available: it and the next ones while memory stays short are "
        "written inline (training waits for them; angel.ps.backup.async=false: always)\n"
    )


@pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])
def test_a_device_tier_s_tables_are_left_out_of_backups(tmp_path: Path, background: bool) -> None:
    """``mark_tiers``: a table a worker's device tier holds is written back outside the
    clocks, so a restart from a backup restarts the job anyway; its backups leave it out (its
    rows: 4 s of CPU a backup at 50M rows), and a restore leaves it empty and still out."""
    srv = _server(tmp_path, background=background)
    asyncio.run(srv.mark_tiers(["w", "not-a-table"]))
    assert srv.shard.unbacked == {"w"}

    async def run() -> None:
        for c in range(3):
            await srv.step(_push(c))
        await srv.backups.written()

    asyncio.run(run())
    info = read_backup(srv.backups.dir)
    assert info is not None
    root, meta = info
    assert meta["unbacked"] == ["w"] and meta["clocks"]["pushed"] == [2]
    assert sorted(p.name for p in Path(root).iterdir()) == ["b", "manifest.json"]
    opts = ShardOptions.of(PSOptions.from_config({}), 1, backup_dir=str(tmp_path / "bk"))
    fresh = ParameterShard(0, 1, [W, B])
    assert shard_backups.ShardBackups(fresh, opts).restore()
    assert fresh.unbacked == {"w"} and fresh.tables["w"].n == 0
    want = ParameterShard(0, 1, [W, B])
    for c in range(2):
        want.push(0, c, _push(c).pushes, 0.1)
    _same({"b": fresh.export("b")}, {"b": want.export("b")})
