"""Memory shared between a client and a shard on one node (angelps/client/shared.py): the
allocator, the segment's checks, swaps whose bodies travel there (wire and shard), and a real
job's client using it, with the socket as the fallback."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import time

import numpy as np
import pytest

from angelps.client import shared as shared_mod
from angelps.client import transport, wire
from angelps.client.ps_client import PSClient
from angelps.client.shared import ALIGN, SHM_DIR, Arena, Segment, ShardSegment, shared_dir
from angelps.options import PSOptions, ShardOptions
from angelps.server.shard_server import ShardServer
from angelps.step_call import StepCall
from angelps.table import OptimizerSpec, TableSpec

pytestmark = pytest.mark.skipif(shared_dir() is None, reason=f"needs {SHM_DIR}")

EMB = TableSpec(
    "emb", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, seed=5,
    optimizer=OptimizerSpec("adam"),
)  # fmt: skip
WIDTH = 13  # weights, then adam's slots (its two moments and its step)


def _segment_files() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith("angelps-")}


def test_the_arena_allocates_first_fit_aligned_and_merges_what_is_freed():
    seg = Segment.create(1024)
    try:
        seg.unlink()
        arena = Arena(seg)
        a = arena.alloc(1)
        b = arena.alloc(100)  # rounded up to two lines
        c = arena.alloc(ALIGN)
        assert (a, b, c) == (0, ALIGN, 3 * ALIGN)
        assert arena.in_use == 4 * ALIGN
        assert arena.alloc(1024) is None  # no room: the caller uses the socket
        arena.free(b)
        assert arena.alloc(2 * ALIGN) == ALIGN  # the first hole that fits
        arena.free(a)
        arena.free(ALIGN)
        arena.free(c)
        assert arena.in_use == 0
        assert arena.alloc(1024) == 0  # every hole merged back into one
    finally:
        seg.close()


def test_a_region_taken_is_freed_when_its_last_array_is_gone():
    seg = Segment.create(1 << 16)
    try:
        seg.unlink()
        arena = Arena(seg)
        off = arena.alloc(800)
        assert off is not None
        view = arena.take(off, 800)
        rows = np.frombuffer(view, dtype=np.float32).reshape(20, 10)
        part = rows[3:5]
        del view, rows
        gc.collect()
        assert arena.in_use == 13 * ALIGN  # a slice still reads it
        del part
        gc.collect()
        assert arena.in_use == 0
    finally:
        seg.close()


def test_a_shard_maps_only_a_segment_of_this_users_by_its_name(tmp_path):
    seg = Segment.create(4096)
    try:
        assert oct(os.stat(os.path.join(SHM_DIR, seg.name)).st_mode & 0o777) == "0o600"
        seg.buf[:4] = [1, 2, 3, 4]
        other = Segment.attach(seg.name, 4096)
        assert list(other.buf[:4]) == [1, 2, 3, 4]  # the same memory
        other.close()
        with pytest.raises(ValueError, match="not a 8192-byte file"):
            Segment.attach(seg.name, 8192)
        for bad in ("../etc/passwd", "angelps-xyz", "angelps-1-" + "0" * 31, "angelps-" + "0" * 32):
            with pytest.raises(ValueError, match="not a segment name"):
                Segment.attach(bad, 4096)
        with pytest.raises(ValueError, match="a segment of 0 bytes"):
            Segment.attach(seg.name, 0)
        with pytest.raises(FileNotFoundError):  # (a client on another node)
            Segment.attach("angelps-1-" + "0" * 32, 4096)
        link = "angelps-1-" + "1" * 32
        os.symlink(os.path.join(SHM_DIR, seg.name), os.path.join(SHM_DIR, link))
        try:
            with pytest.raises(OSError):  # not through a link
                Segment.attach(link, 4096)
        finally:
            os.unlink(os.path.join(SHM_DIR, link))
        with pytest.raises(ValueError, match=r"a region \[4000, \+200\) outside a 4096-byte"):
            seg.view(4000, 200)
    finally:
        seg.unlink()
        seg.close()


def test_a_segment_left_by_a_maker_that_died_is_removed_by_the_next_maker(tmp_path):
    """A maker that died before the shard mapped its segment left its name behind: the next
    process to make one removes it once it is STALE_S old; a live maker's, a young one, another
    name and a file that is not a segment stay."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    tail = "-" + "a" * 32
    files = {
        "stale": f"angelps-{gone.pid}{tail}",
        "live": f"angelps-{os.getpid()}{tail}",
        "young": f"angelps-{gone.pid}-{'b' * 32}",
        "other": f"angelps-{gone.pid}-xyz",
    }
    old = time.time() - shared_mod.STALE_S - 5
    for key, name in files.items():
        (tmp_path / name).write_bytes(b"x")
        if key != "young":
            os.utime(tmp_path / name, (old, old))
    os.mkdir(tmp_path / f"angelps-{gone.pid}-{'c' * 32}")  # (not a file)
    os.utime(tmp_path / f"angelps-{gone.pid}-{'c' * 32}", (old, old))
    assert shared_mod.sweep_stale(str(tmp_path)) == [files["stale"]]
    left = set(os.listdir(tmp_path))
    assert left == {files["live"], files["young"], files["other"], f"angelps-{gone.pid}-{'c' * 32}"}
    # a segment carries its maker's id, and the first one a process makes sweeps SHM_DIR
    stale = os.path.join(SHM_DIR, files["stale"])
    with open(stale, "wb") as f:
        f.write(b"x")
    os.utime(stale, (old, old))
    shared_mod._swept = False
    seg = Segment.create(4096)
    try:
        assert seg.name.startswith(f"angelps-{os.getpid()}-")
        assert not os.path.exists(stale)
    finally:
        seg.unlink()
        seg.close()


def _answer(srv: ShardServer, frame: list, shared: ShardSegment) -> tuple[bytes, bytes]:
    raw = b"".join(bytes(b) for b in frame)
    hlen, blen = wire.PREFIX.unpack(raw[: wire.PREFIX.size])
    header = raw[wire.PREFIX.size : wire.PREFIX.size + hlen]
    body = raw[wire.PREFIX.size + hlen :]
    assert len(body) == blen
    reply = b"".join(bytes(b) for b in asyncio.run(srv._answer(header, body, shared)))
    hlen, _ = wire.PREFIX.unpack(reply[: wire.PREFIX.size])
    return reply[wire.PREFIX.size : wire.PREFIX.size + hlen], reply[wire.PREFIX.size + hlen :]


def test_a_swap_in_shared_memory_equals_the_same_swap_on_the_socket():
    """The body written to the segment, the reply's rows read from the region the client
    allocated for them: the same rows as the swap in the frame; a reply that does not fit its
    region comes in the frame; a peer's region outside the segment, or a swap in shared
    memory on a connection without one, is refused with the shard's error."""
    servers = [ShardServer(0, 1, [EMB], ShardOptions.from_config({})) for _ in range(2)]
    seg = Segment.create(1 << 20)
    shared = ShardSegment()
    try:
        ok, _ = wire.decode_reply(
            *_answer(servers[0], shared_mod.encode_map(seg.name, 1 << 20), shared)
        )
        assert ok
        seg.unlink()
        arena = Arena(seg)
        keys = np.array([-9, 3, 4, 77, 501], dtype=np.int64)
        rows = np.arange(5 * WIDTH, dtype=np.float32).reshape(5, WIDTH)
        reads = {"emb": keys[::-1].copy()}
        parts = wire.swap_parts({"emb": (keys, rows)}, reads)
        frame, (req, out) = shared_mod.encode_shared(*parts, arena, 5 * WIDTH * 4)
        header, body = _answer(servers[0], frame, shared)
        assert body == b"" and json.loads(header)["at"] == [out, 5 * WIDTH * 4]
        arena.free(req)
        ok, got = wire.decode_reply(header, body, lambda o, n: arena.take(o, n))
        plain = _answer(servers[1], wire.encode_swap({"emb": (keys, rows)}, reads), ShardSegment())
        ok2, want = wire.decode_reply(*plain)
        assert ok and ok2
        np.testing.assert_array_equal(got.rows["emb"], rows[::-1])
        np.testing.assert_array_equal(got.rows["emb"], want.rows["emb"])
        del got
        gc.collect()
        assert arena.in_use == 0

        # a reply region too small: the rows come in the frame
        frame, (req, out) = shared_mod.encode_shared(*wire.swap_parts({}, reads), arena, 16)
        header, body = _answer(servers[0], frame, shared)
        assert "at" not in json.loads(header) and len(body) == 5 * WIDTH * 4
        with pytest.raises(ValueError, match="a reply in a shared segment this connection"):
            wire.decode_reply(b'{"ok": true, "b": 0, "rows": [], "at": [0, 8]}', b"")

        hostile = json.dumps({"swap": 1, "wr": [], "rd": [["emb", 1]], "in": [1 << 20, 8]})
        header, _ = _answer(servers[0], wire.frames(json.loads(hostile), []), shared)
        assert json.loads(header)["msg"] == (
            f"a region [{1 << 20}, +8) outside a {1 << 20}-byte segment"
        )
        header, _ = _answer(servers[1], wire.frames(json.loads(hostile), []), ShardSegment())
        assert json.loads(header)["msg"] == (
            "a call in a shared segment on a connection that has none"
        )
        header, _ = _answer(
            servers[1], shared_mod.encode_map("angelps-1-" + "0" * 32, 4096), ShardSegment()
        )
        assert json.loads(header)["msg"].startswith(
            f"cannot map shared segment angelps-1-{'0' * 32}: "
        )
    finally:
        shared.close()
        seg.unlink()
        seg.close()


def _client(name: str, shared_mib: int | None = None) -> PSClient:
    conf = {"angel.job.name": name, "angel.ps.number": 2}
    if shared_mib is not None:
        conf["angel.ps.shared.mib"] = shared_mib
    return PSClient.launch([EMB], PSOptions.from_config(conf))


def test_a_clients_swaps_use_shared_memory_with_a_shard_on_its_node(ray_local):
    """Swaps of a real job's client: through a segment per shard (its name removed once
    mapped), each region freed once its rows are read; the same rows as with the key at 0
    (every swap on the socket); a swap larger than the segment takes the socket."""
    before = _segment_files()
    got = {}
    for mib in (1, 0):
        c = _client(f"shm-{mib}", mib)
        try:
            keys = np.arange(-50_000, 50_000, 7, dtype=np.int64)  # 14,286 rows, 743 KB
            first = c.swap_async({}, {"emb": keys}).result()["emb"].copy()
            written = first + 1.5
            again = c.swap_async({"emb": (keys, written)}, {"emb": keys[::-1].copy()})
            rows = again.result()["emb"]
            np.testing.assert_array_equal(rows, written[::-1])
            arenas = [ch.arena for ch in c.net.swap_chans]
            assert all((a is not None) == (mib > 0) for a in arenas)
            if mib:
                assert all(a.in_use > 0 for a in arenas)  # (rows still read)
                del rows, again
                gc.collect()
                # the swap's body (each row's key and whole row written back, its key read:
                # 68 bytes a row, a region a shard, aligned) kept until the connection's next
                # reply: the shard writes rows back from it after answering, with no copy
                body = sum(a.in_use for a in arenas)
                assert len(keys) * 68 <= body <= len(keys) * 68 + 2 * ALIGN, body
                # 5.2 MB a shard: more than a 1 MiB segment holds, so on the socket
                big = np.arange(-100_000, 100_000, dtype=np.int64)
                out = c.swap_async({}, {"emb": big}).result()["emb"]
                assert out.shape == (len(big), WIDTH)
                assert [a.in_use for a in arenas] == [0, 0]  # (freed at that reply)
            assert _segment_files() == before  # names removed once the shards mapped them
            got[mib] = first
        finally:
            c.shutdown()
    np.testing.assert_array_equal(got[1], got[0])


def test_the_shared_memory_key_is_checked():
    with pytest.raises(ValueError, match=r"angel.ps.shared.mib.*from 0 to 1024"):
        PSOptions.from_config({"angel.ps.shared.mib": 2048})


def _shared_call(srv: ShardServer, shared: ShardSegment, arena: Arena, call, reply: int):
    frame, regions = shared_mod.encode_shared(*wire.request_parts(call), arena, reply)
    header, body = _answer(srv, frame, shared)
    return regions, header, body


def test_a_step_in_shared_memory_and_a_push_kept_past_its_reply():
    """A step's body in the segment and its pulled rows in its reply region; under BSP with
    two workers the first worker's push waits, answered, for the second's: its region is
    the client's again (here overwritten, as the client's next call would), and the update
    applied must still be the pushes sent."""
    lin = TableSpec("lin", rows=40, cols=2, init="zeros", optimizer=OptimizerSpec("momentum"))
    srv = ShardServer(0, 1, [lin], ShardOptions.from_config({}, num_workers=2))
    ref = ShardServer(0, 1, [lin], ShardOptions.from_config({}, num_workers=2))
    seg = Segment.create(1 << 16)
    shared = ShardSegment()
    try:
        _answer(srv, shared_mod.encode_map(seg.name, 1 << 16), shared)
        seg.unlink()
        arena = Arena(seg)
        keys = np.array([1, 5, 39], dtype=np.int64)
        g0 = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
        g1 = -0.5 * g0
        first = StepCall(0, 0, {"lin": (keys, g0)}, 0.1, None)
        (req, out), header, _ = _shared_call(srv, shared, arena, first, 0)
        assert json.loads(header)["ok"] and out is None
        arena.free(req)
        seg.buf[:] = 0xFF  # the client's next calls reuse the region: NaNs if it were read now
        asyncio.run(ref.step(first))
        for s in (srv, ref):
            asyncio.run(s.step(StepCall(1, 0, {"lin": (keys, g1)}, 0.1, None)))
        pull = StepCall(0, 1, None, 0.1, {"lin": keys})
        (req, out), header, body = _shared_call(srv, shared, arena, pull, 3 * 2 * 4)
        assert body == b"" and json.loads(header)["at"] == [out, 24]
        arena.free(req)
        ok, got = wire.decode_reply(header, body, lambda o, n: arena.take(o, n))
        assert ok
        want = asyncio.run(ref.step(pull)).rows["lin"]
        np.testing.assert_allclose(got.rows["lin"], want)
        np.testing.assert_allclose(want, -0.1 * (g0 + g1))  # the summed pushes, applied once
    finally:
        shared.close()
        seg.close()


def test_a_jobs_steps_use_shared_memory_and_train_as_on_the_socket(ray_local):
    """A real client's pushes and pulls over memory shared with its shards: the same rows as
    with every body on the socket, every region freed once the rows are dropped."""
    got = {}
    for mib in (4, 0):
        c = _client(f"shm-steps-{mib}", mib)
        rng = np.random.default_rng(11)
        try:
            for _ in range(5):
                # (about 9,000 keys a shard: above the size that makes a connection share)
                keys = np.unique(rng.integers(-30_000, 30_000, 20_000))
                grads = rng.standard_normal((len(keys), 4)).astype(np.float32)
                c.push("emb", keys, grads, 0.05)
                arenas = [ch.arena for ch in c.net.chans]
                assert all((a is not None) == (mib > 0) for a in arenas)
            everything = np.arange(-30_000, 30_000)
            got[mib] = c.pull("emb", everything)
            arenas = [ch.arena for ch in c.net.chans]
            assert all((a is not None) == (mib > 0) for a in arenas)
            if mib:
                rows = got[mib].copy()
                del got[mib]
                gc.collect()
                assert [a.in_use for a in arenas] == [0, 0]
                got[mib] = rows
        finally:
            c.shutdown()
    np.testing.assert_array_equal(got[4], got[0])


def test_a_connection_of_small_calls_shares_no_memory(ray_local):
    """Calls below SHARE_FROM go on the socket without a segment (no memory reserved); the
    first one above it makes the segment."""
    before = _segment_files()
    c = _client("shm-small", 64)
    try:
        keys = np.arange(-300, 300, dtype=np.int64)  # 300 rows a shard: 19 KB each way
        for _ in range(3):
            c.push("emb", keys, np.ones((len(keys), 4), np.float32), 0.05)
            c.pull("emb", keys)
        assert [ch.arena for ch in c.net.chans] == [None, None]
        big = np.arange(-5000, 5000, dtype=np.int64)
        c.pull("emb", big)
        assert [ch.arena.segment.size for ch in c.net.chans] == [transport.FIRST_SEGMENT] * 2
        assert _segment_files() == before
    finally:
        c.shutdown()


def test_a_segment_grows_for_a_larger_call_and_calls_in_flight_keep_the_old_one(ray_local):
    """A connection starts with a 4 MiB segment; a call that does not fit grows it to the
    power of two that holds it (the shard maps the new one in order, after serving the calls
    written to the old one), so a swap still in flight reads its rows from the old segment;
    every region of both is freed (a swap's body once its connection's next reply is in)."""
    c = _client("shm-grow", 64)
    try:
        keys = np.arange(-5000, 5000, dtype=np.int64)
        want = c.swap_async({}, {"emb": keys}).result()["emb"].copy()
        old = [ch.arena for ch in c.net.swap_chans]
        assert [a.segment.size for a in old] == [transport.FIRST_SEGMENT] * 2
        small = c.swap_async({}, {"emb": keys})  # in flight, in the old segments
        big = np.arange(-200_000, 200_000, dtype=np.int64)  # 10.4 MB of rows a shard
        rows = c.swap_async({}, {"emb": big}).result()["emb"]
        new = [ch.arena for ch in c.net.swap_chans]
        assert [a.segment.size for a in new] == [4 * transport.FIRST_SEGMENT] * 2
        assert all(n is not o for n, o in zip(new, old, strict=True))
        np.testing.assert_array_equal(small.result()["emb"], want)
        np.testing.assert_array_equal(rows[195_000:205_000], want)
        del small, rows
        gc.collect()
        # (the last swap's body is kept until its connection's next reply: a small swap's,
        # whose own few keys stay in turn)
        assert [a.in_use for a in old] == [0, 0] and all(a.in_use > ALIGN for a in new)
        c.swap_async({}, {"emb": keys[:10]}).result()
        assert [a.in_use for a in old + new] == [0, 0, ALIGN, ALIGN]
    finally:
        c.shutdown()
