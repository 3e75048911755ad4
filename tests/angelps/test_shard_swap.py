"""A device tier's swap at the shard, on a thread of its own and over row threads
(angelps/server/shard_swap.py, angelps/server/data_plane.py, angelps/storage/row_threads.py),
and on a connection of its own (angelps/client/transport.py): the same rows as on one thread,
a step call for other tables answered while a swap runs, those of its tables and saves
waiting for it, the second connection's fallback to the first, and the shard's account of
the calls it served."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import numpy as np
import pytest

from angelps.client import wire
from angelps.client.ps_client import PSClient
from angelps.client.shared import Segment
from angelps.options import PSOptions, ShardOptions
from angelps.server.shard import ParameterShard
from angelps.server.shard_server import ShardServer
from angelps.server.shard_swap import check_swap, split_writes
from angelps.step_call import StepCall, StepResult
from angelps.storage.row_threads import MIN_PART_ROWS, RowThreads, auto_threads, each
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


def _assert_same_tables(a: ParameterShard, b: ParameterShard, names: list[str]) -> None:
    for name in names:
        for x, y in zip(a.export(name), b.export(name), strict=True):
            if isinstance(x, dict):
                for k in x:
                    np.testing.assert_array_equal(x[k], y[k])
            else:
                np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_swap_over_threads_leaves_the_rows_of_a_swap_on_one_thread(threads):
    """Lookups, gathers and scatters cut into parts over threads: the same rows read and the
    same tables (rows created in the same order) as on one thread, for a table of unknown id
    range (open addressing), one of known range (a direct index) and a dense one, with rows
    new to the shard among those written back and read."""
    rng = np.random.default_rng(0)
    dense = TableSpec("dense", rows=1 << 20, cols=2, optimizer=MOM)
    specs = [EMB, LIN, dense]
    one = ParameterShard(0, 1, specs)
    many = ParameterShard(0, 1, specs, swap_threads=threads)
    assert one.swap_par is None and many.swap_par is not None
    assert many.swap_par.threads == threads
    for _ in range(4):
        writes, reads = _swap_args(rng, 3 * MIN_PART_ROWS + 1000)
        writes["dense"] = (writes["lin"][0], rng.standard_normal((len(writes["lin"][0]), 4)))
        writes["dense"] = (writes["dense"][0], writes["dense"][1].astype(np.float32))
        reads["dense"] = reads["lin"]
        # (a few rows written back are read too: written first, then read as written)
        reads = {k: np.union1d(v, writes[k][0][:50]) for k, v in reads.items()}
        want = one.swap(writes, reads)
        got = many.swap(writes, reads)
        for name in reads:
            np.testing.assert_array_equal(got[name], want[name])
    assert many.tables["emb"].num_rows() == one.tables["emb"].num_rows() > 8 * MIN_PART_ROWS
    _assert_same_tables(one, many, ["emb", "lin", "dense"])


def test_row_threads_run_every_part_and_raise_a_part_s_error():
    par = RowThreads(3)
    seen: list[tuple[int, int]] = []
    par.run(3 * MIN_PART_ROWS + 5, lambda a, b: seen.append((a, b)))
    assert sorted(seen) == [
        (0, MIN_PART_ROWS + 1),
        (MIN_PART_ROWS + 1, 2 * MIN_PART_ROWS + 3),
        (2 * MIN_PART_ROWS + 3, 3 * MIN_PART_ROWS + 5),
    ]
    seen.clear()
    par.run(MIN_PART_ROWS, lambda a, b: seen.append((a, b)))  # (too few rows to cut)
    assert seen == [(0, MIN_PART_ROWS)]

    def fail(a: int, b: int) -> None:
        if a > 0:
            raise ValueError(f"part {a}:{b}")

    with pytest.raises(ValueError, match=r"part 4096:8192"):
        RowThreads(2).run(2 * MIN_PART_ROWS, fail)
    with pytest.raises(ValueError, match="row threads must be >= 1, got 0"):
        RowThreads(0)
    assert auto_threads(2) == 1 and auto_threads(16) == 4 and auto_threads(64) == 4


def test_a_bad_swap_is_refused_before_any_row_is_written():
    shard = ParameterShard(0, 1, [EMB, LIN], swap_threads=2)
    keys = np.arange(5000, dtype=np.int64)
    good = (keys, np.ones((5000, 16), np.float32))
    bad = (keys, np.ones((5000, 3), np.float32))
    with pytest.raises(
        ValueError, match=r"table 'lin': a write-back of 5000 rows needs a \[5000, 2\]"
    ):
        shard.swap({"emb": good, "lin": bad}, {})
    assert shard.tables["emb"].num_rows() == 0  # (nothing written)


def test_the_shard_answers_other_tables_while_a_swap_runs_on_its_thread(tmp_path):
    """While a swap runs on its thread (held there until the step is answered), a step call
    for another table is answered; a pull of a table the swap writes, and a save, wait for
    it: the pull reads the rows as written back. The shard counts the calls and the swap's
    seconds."""
    srv = ShardServer(0, 1, [EMB, LIN, BIAS], ShardOptions.from_config({}))
    rng = np.random.default_rng(1)
    writes, reads = _swap_args(rng, 20_000)
    table = srv.shard.tables["emb"]
    put_rows = table.put_rows
    step_answered = threading.Event()

    def held_put_rows(*args: object) -> None:
        assert step_answered.wait(30), "the step was not answered during the swap"
        put_rows(*args)  # type: ignore[arg-type]

    table.put_rows = held_put_rows  # type: ignore[method-assign]
    done: list[str] = []
    back = writes["emb"][0][:5]

    async def main() -> tuple[dict, StepResult]:
        swap = asyncio.create_task(srv.swap(writes, reads))
        swap.add_done_callback(lambda _: done.append("swap"))
        await asyncio.sleep(0.05)  # (the swap is on its thread, held in its write-backs)
        assert not swap.done()
        step = await srv.step(StepCall(0, 0, pulls={"bias": None}))
        assert step.rows is not None and step.rows["bias"].shape == (4, 1)
        done.append("step")
        step_answered.set()
        pull = asyncio.create_task(srv.step(StepCall(0, 0, pulls={"emb": back})))
        pull.add_done_callback(lambda _: done.append("pull"))
        save = asyncio.create_task(srv.save(str(tmp_path / "ckpt")))
        save.add_done_callback(lambda _: done.append("save"))
        pulled, *_ = await asyncio.gather(pull, swap, save)
        return await srv.stats(), pulled

    stats, pulled = asyncio.run(main())
    assert done == ["step", "swap", "pull", "save"]
    np.testing.assert_array_equal(pulled.rows["emb"], writes["emb"][1][:5, :8])
    served = stats["served"]
    assert (served["steps"], served["swaps"]) == (2, 1)
    assert served["swap_s"] > 0 and served["step_s"] >= 0
    assert stats["rows"]["emb"] == len(np.union1d(writes["emb"][0], reads["emb"]))


def test_only_the_rows_a_swap_also_reads_are_written_back_before_its_reads():
    """The write-backs of rows the swap also reads (a row evicted, then read by the next batch
    before its write-back went) go before the reads, and all may follow them, for a table of
    any id range; a swap that reads nothing writes everything after, only."""
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
    # (rows=-1: the ids' hashes marked, their hits looked for among the reads)
    first, later = split_writes(table, emb, check_swap(table, emb, {"emb": np.array([2])}))
    assert first == {} and later["emb"][0].tolist() == [1, 5, 9]
    first, later = split_writes(table, emb, check_swap(table, emb, {"emb": np.array([9, 2, 1])}))
    assert first["emb"][0].tolist() == [1, 9] and later["emb"][0].tolist() == [1, 5, 9]
    # Two tables keyed alike (a tier's book) share the search; one read with other ids not.
    two = ParameterShard(0, 1, [LIN, dataclasses.replace(LIN, name="lin2")])._table
    keys = np.array([1, 5, 9])
    both = {"lin": (keys, blk), "lin2": (keys.copy(), blk + 1)}
    first, _ = split_writes(two, both, {"lin": np.array([5, 7]), "lin2": np.array([5, 7])})
    assert first["lin"][0].tolist() == first["lin2"][0].tolist() == [5]
    assert first["lin2"][1].tolist() == [[3.0, 4.0]]
    first, _ = split_writes(two, both, {"lin": np.array([5, 7]), "lin2": np.array([1, 9])})
    assert first["lin"][0].tolist() == [5] and first["lin2"][0].tolist() == [1, 9]


@pytest.mark.parametrize("rows", [1 << 20, 1 << 40, -1])
@pytest.mark.parametrize("par", [None, RowThreads(3)])
def test_the_rows_both_written_back_and_read_are_found_for_any_id_range(rows, par):
    """The search for rows both written back and read (a mark per id of a small range, else a
    filter of the ids' hashes whose hits are then looked up among the reads) finds exactly
    those of a set intersection, in the write-backs' order: ids spread over 2^40 or the
    whole int64 range (negative ones too), ids a shard holds by their low bits (multiples of
    8), reads sorted or not."""
    rng = np.random.default_rng(5)
    spec = dataclasses.replace(LIN, rows=rows)
    table = ParameterShard(0, 1, [spec])._table
    hi = 1 << 62 if rows < 0 else rows
    for step in (1, 8):
        ids = np.unique(rng.integers(-hi if rows < 0 else 0, hi // step, 80_000) * step)
        ids = rng.permutation(ids)
        back, read = ids[:40_000], ids[30_000:70_000]  # (10,000 in both)
        for reads in (np.sort(read), read):
            writes = {"lin": (back, np.zeros((len(back), 2), np.float32))}
            first, later = split_writes(table, writes, {"lin": reads}, par)
            expect = np.flatnonzero(np.isin(back, read))
            assert len(expect) == 10_000
            np.testing.assert_array_equal(first["lin"][0], back[expect])
            assert later["lin"][0] is back


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
    _assert_same_tables(ref, srv.shard, ["lin"])


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


@pytest.mark.parametrize("interval", [1, 3])
def test_a_push_that_starts_a_backup_waits_for_a_swap(tmp_path, interval):
    """A backup expires rows in every table, so a push whose update starts one waits for a
    swap in progress (interval 1: the first push), while a push that starts none is applied
    at once (interval 3)."""
    ps = PSOptions.from_config(
        {"angel.ps.backup.interval": interval, "angel.ps.backup.async": False}
    )
    opts = ShardOptions.of(ps, 1, backup_dir=str(tmp_path / "backups"))
    srv = ShardServer(0, 1, [EMB, BIAS], opts)
    table = srv.shard.tables["emb"]
    put_rows = table.put_rows
    release = threading.Event()

    def held_put_rows(*args: object) -> None:
        assert release.wait(30)
        put_rows(*args)  # type: ignore[arg-type]

    table.put_rows = held_put_rows  # type: ignore[method-assign]
    keys = np.arange(10, dtype=np.int64)
    done: list[str] = []

    async def main() -> None:
        swap = asyncio.create_task(srv.swap({"emb": (keys, np.ones((10, 16), np.float32))}, {}))
        swap.add_done_callback(lambda _: done.append("swap"))
        await asyncio.sleep(0.05)
        grads = {"bias": (np.arange(4), np.ones((4, 1), np.float32))}
        push = asyncio.create_task(srv.step(StepCall(0, 0, pushes=grads, step=0.1)))
        push.add_done_callback(lambda _: done.append("push"))
        await asyncio.sleep(0.2)
        release.set()
        await asyncio.gather(swap, push)

    asyncio.run(main())
    assert done == (["swap", "push"] if interval == 1 else ["push", "swap"])
    assert srv.backups.stats()["count"] == (1 if interval == 1 else 0)


def test_a_swap_s_rows_are_gathered_into_its_reply_region(tmp_path):
    """With a reply region in memory shared with the client, the shard gathers a swap's rows
    straight into it, laid out as the reply says (no copy there after): the client decodes the
    rows a swap without a region returns; rows that would not fit, or a table the shard does
    not hold, get no arrays there."""
    srv = ShardServer(0, 1, [EMB, LIN], ShardOptions.from_config({}))
    ref = ParameterShard(0, 1, [EMB, LIN])
    rng = np.random.default_rng(5)
    segment = Segment.create(4 << 20)
    try:
        for _ in range(2):
            writes, reads = _swap_args(rng, 3000)
            want = ref.swap(writes, reads)
            need = len(reads["emb"]) * (64 + 8)  # (EMB's whole rows, then LIN's)
            assert srv._reply_rows(reads, (segment, 4096, need - 1)) is None
            assert srv._reply_rows({"nope": reads["emb"]}, (segment, 4096, need)) is None
            segment.buf[:] = 0
            region = (segment, 4096, need + 100)
            outs = srv._reply_rows(reads, region)

            async def swap(writes: dict, reads: dict, outs: dict, region: tuple) -> list:
                rows, rest = await srv._swap_reads(writes, reads, outs=outs)
                await rest()
                return wire.encode_reply(StepResult(rows, 0, 7), region, placed=True)

            frames = asyncio.run(swap(writes, reads, outs, region))
            header = bytes(frames[1])
            ok, got = wire.decode_reply(header, b"", lambda a, n: segment.view(a, n))
            assert ok and got.pid == 7 and json.loads(header)["at"] == [4096, need]
            for name in reads:
                np.testing.assert_array_equal(got.rows[name], want[name])
    finally:
        segment.close()
        segment.unlink()


def test_a_swap_naming_a_key_twice_is_refused_before_any_row_is_written():
    shard = ParameterShard(0, 1, [EMB, LIN], swap_threads=2)
    twice = np.array([7, 3, 9, 3], dtype=np.int64)
    with pytest.raises(ValueError, match=r"table 'emb': a swap's read names key 3 more than once"):
        shard.swap({}, {"emb": twice})
    block = np.zeros((4, 2), np.float32)
    with pytest.raises(
        ValueError, match=r"table 'lin': a swap's write-back names key 3 more than once"
    ):
        shard.swap({"lin": (twice, block)}, {"emb": np.array([1, 2])})
    assert shard.tables["emb"].num_rows() == shard.tables["lin"].num_rows() == 0
    # (keys once each in any order are fine)
    assert shard.swap({}, {"emb": np.array([9, 3, 7])})["emb"].shape == (3, 16)


@pytest.mark.parametrize("par", [None, RowThreads(2)])
def test_a_write_back_naming_a_key_twice_is_found_once_per_key_array(par):
    """A book's tables written back with one key array have its uniqueness checked once (the
    first table named in the error); unequal arrays each on their own; many keys of a dense id
    range with a mark per id rather than a sort: a duplicate found either way, and a
    permutation of distinct keys accepted."""
    shard = ParameterShard(0, 1, [EMB, LIN, dataclasses.replace(LIN, name="lin2")])
    rng = np.random.default_rng(11)
    keys = rng.permutation(1 << 20)[:40_000]  # (dense: 40,000 of 2^20 ids, the marks' case)
    twice = keys.copy()
    twice[-1] = twice[7]
    dup = int(twice[7])
    lin = np.zeros((len(keys), 2), np.float32)
    emb = np.zeros((len(keys), 16), np.float32)
    good = {"lin": (keys, lin), "lin2": (keys.copy(), lin)}
    assert check_swap(shard._table, good, {}, par) == {}
    for first, second in (("lin", "lin2"), ("lin2", "lin")):
        shared = {first: (twice, lin), second: (twice.copy(), lin)}
        with pytest.raises(
            ValueError, match=rf"table '{first}': a swap's write-back names key {dup} more"
        ):
            check_swap(shard._table, shared, {}, par)
    # (unequal arrays: the second's duplicate found too, by a sort for the unbounded table)
    for name, block in (("lin2", lin), ("emb", emb)):
        with pytest.raises(
            ValueError, match=rf"table '{name}': a swap's write-back names key {dup} more"
        ):
            check_swap(shard._table, {"lin": (keys, lin), name: (twice, block)}, {}, par)
    assert all(t.num_rows() == 0 for t in shard.tables.values())


def test_a_swap_s_checks_and_search_over_threads_equal_those_on_one():
    """The checks of every array at once on the row threads raise the error the checks in
    order raise first; the search for rows both written back and read, in parts, finds the
    same rows."""
    par = RowThreads(3)
    shard = ParameterShard(0, 1, [EMB, LIN])
    table = shard._table
    rng = np.random.default_rng(7)
    for _ in range(3):
        writes, reads = _swap_args(rng, 3 * MIN_PART_ROWS)
        reads = {k: np.union1d(v, writes[k][0][::5]) for k, v in reads.items()}
        checked = check_swap(table, writes, reads, par)
        assert {k: v.tolist() for k, v in checked.items()} == {
            k: v.tolist() for k, v in check_swap(table, writes, reads).items()
        }
        one, many = split_writes(table, writes, checked), split_writes(table, writes, checked, par)
        assert one[0].keys() == many[0].keys() and one[1].keys() == many[1].keys()
        pairs = zip(
            (*one[0].values(), *one[1].values()),
            (*many[0].values(), *many[1].values()),
            strict=True,
        )
        for a, b in pairs:
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    bad_block = {"lin": (np.arange(3), np.zeros((3, 5), np.float32))}
    bad_read = {"emb": np.array([4, 4])}
    for p in (None, par):
        with pytest.raises(ValueError, match=r"table 'lin': a write-back of 3 rows needs"):
            check_swap(table, bad_block, bad_read, p)
        with pytest.raises(ValueError, match=r"table 'emb': a swap's read names key 4"):
            check_swap(table, {}, bad_read, p)
        with pytest.raises(ValueError, match=r"table 'lin': key 2097152 is outside"):
            check_swap(table, {}, {"lin": np.array([1 << 21]), **bad_read}, p)
        with pytest.raises(ValueError, match=r"unknown table 'nope'; tables: emb, lin"):
            check_swap(table, {}, {"nope": np.array([1])}, p)
    assert each(par, [lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]
