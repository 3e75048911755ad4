"""A device tier's swap at the shard in pieces (angelps/server/shard_swap.py) and on a
connection of its own (angelps/client/transport.py): the same rows as the swap done whole,
a step call answered between two pieces, saves waiting for a swap in progress, the second
connection's fallback to the first, and the shard's account of the calls it served."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from angelps.client.ps_client import PSClient
from angelps.options import PSOptions, ShardOptions
from angelps.server.shard import ParameterShard
from angelps.server.shard_server import ShardServer
from angelps.server.shard_swap import SWAP_PIECE_BYTES, check_swap, split_writes
from angelps.step_call import StepCall
from angelps.table import OptimizerSpec, TableSpec

MOM = OptimizerSpec("momentum")
EMB = TableSpec("emb", rows=-1, cols=8, sparse=True, init_std=0.1, seed=3, optimizer=MOM)
LIN = TableSpec("lin", rows=1 << 20, cols=1, sparse=True, init_std=0.1, seed=4, optimizer=MOM)
BIAS = TableSpec("bias", rows=4, cols=1, init="zeros", optimizer=MOM)
#: whole rows of EMB: 8 weights and 8 momentum slots, float32
ROW_BYTES = 64


def _swap_args(rng: np.random.Generator, n: int) -> tuple[dict, dict]:
    back = np.unique(rng.integers(0, 1 << 20, n))
    read = np.unique(rng.integers(0, 1 << 20, n))
    writes = {
        "emb": (back, rng.standard_normal((len(back), 16)).astype(np.float32)),
        "lin": (back, rng.standard_normal((len(back), 2)).astype(np.float32)),
    }
    return writes, {"emb": read, "lin": read}


def test_a_swap_in_pieces_leaves_the_rows_of_the_swap_done_whole():
    """Pieces of 1,024 rows (the least) against one piece a table: the same rows read (those
    written back in the same swap among them) and the same tables after three swaps."""
    rng = np.random.default_rng(0)
    whole, pieces = (ParameterShard(0, 1, [EMB, LIN]) for _ in range(2))
    n_pauses = 0
    for _ in range(3):
        writes, reads = _swap_args(rng, 5000)
        reads = {k: np.union1d(v, writes[k][0][:100]) for k, v in reads.items()}
        want = whole.swap(writes, reads)
        steps = pieces.swap_steps(writes, reads, piece_bytes=1)
        while True:
            try:
                next(steps)
                n_pauses += 1
            except StopIteration as done:
                got = done.value
                break
        for name in reads:
            np.testing.assert_array_equal(got[name], want[name])
    # (each table's write-back and read, in pieces of 1,024 rows)
    assert n_pauses >= 3 * 4 * 4
    for name in ("emb", "lin"):
        for a, b in zip(whole.export(name), pieces.export(name), strict=False):
            if isinstance(a, dict):
                for k in a:
                    np.testing.assert_array_equal(a[k], b[k])
            else:
                np.testing.assert_array_equal(a, b)


def test_a_bad_swap_is_refused_before_any_piece_is_written():
    shard = ParameterShard(0, 1, [EMB, LIN])
    keys = np.arange(5000, dtype=np.int64)
    good = (keys, np.ones((5000, 16), np.float32))
    bad = (keys, np.ones((5000, 3), np.float32))
    with pytest.raises(
        ValueError, match=r"table 'lin': a write-back of 5000 rows needs a \[5000, 2\]"
    ):
        next(shard.swap_steps({"emb": good, "lin": bad}, {}, piece_bytes=1))
    assert shard.tables["emb"].num_rows() == 0  # (nothing written)


def test_the_shard_answers_a_step_between_the_pieces_of_a_swap(tmp_path):
    """A step call that arrives while a swap runs is answered before the swap ends (the swap
    pauses between pieces); a save that arrives then waits for the swap (it holds every row
    the swap wrote back); the shard counts both calls and the swap's seconds."""
    srv = ShardServer(0, 1, [EMB, LIN, BIAS], ShardOptions.from_config({}))
    rng = np.random.default_rng(1)
    # (about 200,000 rows each way: 48 pieces of EMB's at the default size)
    writes, reads = _swap_args(rng, 200_000)
    assert len(reads["emb"]) * ROW_BYTES > 20 * SWAP_PIECE_BYTES
    done: list[str] = []

    async def main() -> dict:
        swap = asyncio.create_task(srv.swap(writes, reads))
        swap.add_done_callback(lambda _: done.append("swap"))
        await asyncio.sleep(0)  # (the swap has started: it pauses after its first piece)
        assert not swap.done()
        step = asyncio.create_task(srv.step(StepCall(0, 0, None, {"bias": None}, 0)))
        step.add_done_callback(lambda _: done.append("step"))
        save = asyncio.create_task(srv.save(str(tmp_path / "ckpt")))
        save.add_done_callback(lambda _: done.append("save"))
        await asyncio.gather(swap, step, save)
        return await srv.stats()

    stats = asyncio.run(main())
    assert done == ["step", "swap", "save"]
    served = stats["served"]
    assert (served["steps"], served["swaps"]) == (1, 1)
    assert served["swap_s"] > 0 and served["step_s"] >= 0
    assert stats["rows"]["emb"] == len(np.union1d(writes["emb"][0], reads["emb"]))


def test_only_the_rows_a_swap_also_reads_are_written_back_before_its_reads():
    """The write-backs of rows the swap also reads (a row evicted, then read by the next batch
    before its write-back went) go before the reads, and all may follow them; a table of
    unknown id range, or a swap that reads nothing, writes everything first, only."""
    shard = ParameterShard(0, 1, [EMB, LIN])
    table = shard._table
    blk = np.arange(6, dtype=np.float32).reshape(3, 2)
    writes = {"lin": (np.array([9, 1, 5]), blk)}
    first, later = split_writes(table, writes, check_swap(table, writes, {"lin": np.array([2, 3])}))
    assert first == {} and list(later) == ["lin"] and later["lin"][0].tolist() == [9, 1, 5]
    first, later = split_writes(table, writes, check_swap(table, writes, {"lin": np.array([1, 4])}))
    assert first["lin"][0].tolist() == [1] and first["lin"][1].tolist() == [[2.0, 3.0]]
    # (every write-back follows: the row read is written again, with the same values)
    assert later["lin"][0].tolist() == [9, 1, 5] and later["lin"][1] is blk
    assert split_writes(table, writes, {}) == (writes, {})  # (nothing read)
    emb = {"emb": (np.array([1, 5, 9]), np.zeros((3, 16), np.float32))}
    first, later = split_writes(table, emb, check_swap(table, emb, {"emb": np.array([2])}))
    assert list(first) == ["emb"] and later == {}  # (rows=-1: no marks)


def test_a_swap_answered_before_its_write_backs_leaves_the_same_rows(tmp_path):
    """Over the data plane a swap is answered once its rows are read, the write-backs of rows
    it does not read done after (before the connection's next call; a save waits for them):
    the same rows and tables as the swap done whole, write-backs first."""
    rng = np.random.default_rng(4)
    srv = ShardServer(0, 1, [LIN], ShardOptions.from_config({}))
    ref = ParameterShard(0, 1, [LIN])
    order: list[str] = []

    async def main() -> None:
        table = srv.shard.tables["lin"]
        for i in range(3):
            back = np.unique(rng.integers(0, 1 << 19, 40_000))
            # (some rows written back are read too: those are written before the reads)
            read = np.union1d(np.unique(rng.integers(1 << 19, 1 << 20, 40_000)), back[::97])
            writes = {"lin": (back, rng.standard_normal((len(back), 2)).astype(np.float32))}
            want = ref.swap(writes, {"lin": read})
            rows, rest = await srv._swap_reads(writes, {"lin": read}, lent=True)
            order.append("answered")
            if i == 0:  # (answered before the other write-backs: their rows are not there yet)
                there = table.locate(back, create=False) >= 0
                assert there[::97].all() and there.sum() == len(back[::97])
            save = asyncio.create_task(srv.save(str(tmp_path / f"c{len(order)}")))
            save.add_done_callback(lambda _: order.append("saved"))
            await asyncio.sleep(0)
            assert not save.done()  # (waits for the write-backs)
            await rest()
            order.append("written")
            assert (table.locate(back, create=False) >= 0).all()
            await save
            np.testing.assert_array_equal(rows["lin"], want["lin"])

    asyncio.run(main())
    assert order == ["answered", "written", "saved"] * 3
    for a, b in zip(ref.export("lin"), srv.shard.export("lin"), strict=True):
        if isinstance(a, dict):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cap", [1, 4096])
def test_a_tier_swaps_on_a_second_connection_or_on_the_first(ray_local, cap):
    """A client's swaps open a second connection to each shard beside its step calls'; where
    the shard refuses it (its connection cap reached), the first carries them: the same rows
    either way, and the refused connection counted by the shard."""
    conf = {"angel.job.name": f"swap-lane-{cap}", "angel.ps.max.connections": cap}
    c = PSClient.launch([EMB, BIAS], PSOptions.from_config(conf))
    try:
        keys = np.array([5, 9, 1 << 30], dtype=np.int64)
        first = c.swap_async({}, {"emb": keys}).result()["emb"]
        again = c.swap_async({"emb": (keys, first + 2.0)}, {"emb": keys}).result()["emb"]
        np.testing.assert_array_equal(again, first + 2.0)
        pulled = c.pull("bias", np.arange(4))
        np.testing.assert_array_equal(pulled, np.zeros((4, 1), np.float32))
        lanes = [type(ch).__name__ for ch in (*c.net.chans, *c.net.swap_chans)]
        conns = c.stats()[0]["connections"]
    finally:
        c.shutdown()
    if cap == 1:
        assert lanes == ["Channel", "bool"] and conns["refused"] == 1 and conns["open"] == 1
    else:
        assert lanes == ["Channel", "Channel"] and conns["refused"] == 0 and conns["open"] == 2


def test_swaps_from_several_threads_open_one_connection_for_them(ray_local):
    """A tier swaps from its update thread and its training thread: on a fresh client, swaps
    sent from 8 threads at once open one connection for the swaps and one for the steps, and
    each gets its rows."""
    conf = {"angel.job.name": "swap-threads"}
    c = PSClient.launch([EMB], PSOptions.from_config(conf))
    try:
        start = threading.Barrier(8)
        got: dict[int, np.ndarray] = {}

        def swap(i: int) -> None:
            start.wait()
            got[i] = c.swap_async({}, {"emb": np.array([i, 100 + i])}).result()["emb"]

        threads = [threading.Thread(target=swap, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        want = c.swap_async({}, {"emb": np.arange(8)}).result()["emb"]
        conns = c.stats()[0]["connections"]
    finally:
        c.shutdown()
    assert conns["open"] == 2 and conns["refused"] == 0
    for i in range(8):
        np.testing.assert_array_equal(got[i][0], want[i])
