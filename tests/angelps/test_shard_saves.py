"""A shard's part of a checkpoint written in the background (``angel.save.model.async``, the
default), on a :class:`ShardServer` driven directly (no Ray): the shard serves the next steps
while its files are written; the files hold the rows of the moment the save started, as an
inline save of that moment does; one save at a time; a failed write is the result's error;
without memory for the copy the files are written before the shard answers."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from angelps import malloc
from angelps.checkpoint.files import iter_table_file, table_file
from angelps.server import shard as shard_module
from angelps.server.shard_server import ShardServer
from angelps.step_call import StepCall
from tests.angelps.test_shard_backups import KEYS, B, W, _push, _same

# (no backups: the saves alone are tested)


def _server() -> ShardServer:
    from angelps.options import PSOptions, ShardOptions

    return ShardServer(0, 1, [W, B], ShardOptions.of(PSOptions.from_config({}), 1))


def _files(root: Path, info: dict[str, Any]) -> dict[str, Any]:
    """The rows of a shard's checkpoint files (checked against ``info``'s entries)."""
    out = {}
    for name in ("w", "b"):
        entry = info["files"][f"{name}/shard-0.parquet"]
        chunks = list(iter_table_file(table_file(str(root), name, 0), entry))
        keys = np.concatenate([c[0] for c in chunks])
        rows = np.concatenate([c[1] for c in chunks])
        state = {k: np.concatenate([c[2][k] for c in chunks]) for k in chunks[0][2]}
        out[name] = (keys, rows, state)
    return out


class _Gate:
    """Every shard file write held until released, as a slow disk would hold it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: OSError | None = None) -> None:
        self.started, self.open = threading.Event(), threading.Event()
        real = shard_module.write_table_chunks

        def write(path: str, chunks: Any) -> dict[str, Any]:
            self.started.set()
            assert self.open.wait(30)
            if fail is not None:
                raise fail
            return real(path, chunks)

        monkeypatch.setattr(shard_module, "write_table_chunks", write)


def test_a_save_in_the_background_holds_the_rows_of_its_start_while_the_shard_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = _server()
    inline = tmp_path / "inline"
    inline.mkdir()

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        for c in range(3):
            await srv.step(_push(c))
        want = srv.shard.save(str(inline))  # an inline save of the same moment
        gate = _Gate(monkeypatch)
        assert await srv.save(str(tmp_path / "bg"), background=True) is None
        # The shard serves while its files are held: two more updates and a pull.
        for c in range(3, 5):
            await srv.step(_push(c))
        pulled = await srv.step(StepCall(0, 5, None, 0.1, {"w": KEYS}))
        assert pulled.rows is not None
        assert await asyncio.to_thread(gate.started.wait, 10)
        with pytest.raises(RuntimeError) as e:  # one at a time
            await srv.save(str(tmp_path / "again"), background=True)
        assert str(e.value) == (
            "shard 0: a checkpoint is being written already (its result has not been asked "
            "for): one at a time"
        )
        result = asyncio.ensure_future(srv.saved())
        await asyncio.sleep(0.1)
        assert not result.done()  # the result waits for the files
        gate.open.set()
        return want, await result

    want, got = asyncio.run(run())
    assert got["rows"] == want["rows"] and got["clocks"] == want["clocks"] == {
        "pushed": [3],
        "applied": 3,
    }
    _same(_files(tmp_path / "bg", got), _files(inline, want))
    live = {name: srv.shard.export(name) for name in ("w", "b")}
    with pytest.raises(AssertionError):  # (the shard went on: 5 updates now)
        _same(_files(tmp_path / "bg", got), live)


def test_a_failed_write_in_the_background_is_the_result_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = _server()
    gate = _Gate(monkeypatch, fail=OSError(errno.ENOSPC, "No space left on device"))
    gate.open.set()

    async def run() -> None:
        await srv.step(_push(0))
        await srv.save(str(tmp_path / "bg"), background=True)
        with pytest.raises(OSError, match="No space left on device"):
            await srv.saved()
        with pytest.raises(RuntimeError, match=r"^shard 0: no checkpoint is being written$"):
            await srv.saved()
        # the next save starts afresh
        monkeypatch.undo()
        await srv.save(str(tmp_path / "next"), background=True)
        assert (await srv.saved())["rows"] == {"w": 2, "b": 4}

    asyncio.run(run())


def test_without_memory_for_the_copy_the_files_are_written_before_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = _server()
    monkeypatch.setattr(srv.shard, "snapshot_nbytes", lambda backup=False: 3 << 30)
    monkeypatch.setattr(malloc, "available_bytes", lambda: 5 << 30)
    calls = []
    real = srv.shard.image
    monkeypatch.setattr(srv.shard, "image", lambda **kw: calls.append(kw) or real(**kw))

    async def run() -> None:
        await srv.step(_push(0))
        for n in range(2):
            await srv.save(str(tmp_path / f"s{n}"), background=True)
            assert (tmp_path / f"s{n}" / "w" / "shard-0.parquet").is_file()  # written already
            assert (await srv.saved())["rows"] == {"w": 2, "b": 4}

    asyncio.run(run())
    assert calls == [{}, {}] and srv.saves.inline == 2  # no copy: the tables themselves
    err = capsys.readouterr().err
    assert err == (
        "angelps: warning: shard 0: a checkpoint in the background would copy 3,072 MiB with "
        "5,120 MiB of memory available: it and the next ones while memory stays short are "
        "written before training goes on (angel.save.model.async=false: always)\n"
    )


def test_at_the_end_of_the_job_a_save_being_written_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = _server()
    gate = _Gate(monkeypatch)

    async def run() -> None:
        await srv.step(_push(0))
        await srv.save(str(tmp_path / "bg"), background=True)
        assert await asyncio.to_thread(gate.started.wait, 10)
        stop = asyncio.ensure_future(srv.stop_backups())
        await asyncio.sleep(0.05)
        gate.open.set()  # the first file is written; the write stops before the next chunk
        await stop
        with pytest.raises(RuntimeError, match="no checkpoint is being written"):
            await srv.saved()

    asyncio.run(run())
