"""The data plane (angelps.client.wire): frames, the token, and both transports on a real local Ray."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading

import numpy as np
import pytest
import ray

from angelps.client import transport, wire
from angelps.client.ps_client import PSClient
from angelps.options import PSOptions, ShardOptions
from angelps.server.shard import ParameterShard
from angelps.server.shard_server import ShardServer
from angelps.step_call import StepCall, StepResult
from angelps.table import OptimizerSpec, TableSpec

EMB = TableSpec("emb", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, seed=5)
LIN = TableSpec("lin", rows=20, cols=1, init="zeros", optimizer=OptimizerSpec("momentum"))


def _frame(bufs: list) -> tuple[bytes, bytes]:
    raw = b"".join(bufs)
    hlen, blen = wire.PREFIX.unpack(raw[: wire.PREFIX.size])
    header = raw[wire.PREFIX.size : wire.PREFIX.size + hlen]
    body = raw[wire.PREFIX.size + hlen :]
    assert len(body) == blen
    return header, body


def test_request_round_trip():
    keys = np.array([3, -7, 2**62], dtype=np.int64)
    grads = np.arange(12, dtype=np.float32).reshape(3, 4)
    dense = np.arange(5, dtype=np.float64).reshape(5, 1)
    call = StepCall(
        2,
        41,
        {"emb": (keys, grads), "lin": (np.arange(5), dense)},
        0.125,
        {"emb": keys, "lin": None},
        recovering=True,
        pull_clock=43,
        checked=True,
    )
    got = wire.decode_request(*_frame(wire.encode_request(call)))
    assert (got.worker, got.clock, got.step, got.recovering) == (2, 41, 0.125, True)
    assert got.pull_clock == 43
    # The client's mark never crosses the wire: the shard checks what it decodes.
    assert not got.checked
    np.testing.assert_array_equal(got.pushes["emb"][0], keys)
    np.testing.assert_array_equal(got.pushes["emb"][1], grads)
    assert got.pushes["lin"][1].dtype == np.float64
    np.testing.assert_array_equal(got.pushes["lin"][1], dense)
    np.testing.assert_array_equal(got.pulls["emb"], keys)
    assert got.pulls["lin"] is None
    bare = wire.decode_request(*_frame(wire.encode_request(StepCall(0, 0))))
    assert bare == StepCall(0, 0, None, 0.0, None, False, None, False)


def test_reply_and_error_round_trip():
    rows = {"emb": np.arange(8, dtype=np.float32).reshape(2, 4), "lin": np.zeros((0, 1))}
    header, body = _frame(wire.encode_reply(StepResult(rows, 17)))
    ok, got = wire.decode_reply(header, bytearray(body))
    assert ok and isinstance(got, StepResult) and got.backed_up == 17
    np.testing.assert_array_equal(got.rows["emb"], rows["emb"])
    assert got.rows["lin"].shape == (0, 1) and got.rows["lin"].dtype == np.float64
    ok, got = wire.decode_reply(*_frame(wire.encode_reply(StepResult(None, 2))))
    assert ok and got == StepResult(None, 2)
    ok, (kind, msg, args) = wire.decode_reply(
        *_frame(wire.encode_error("ShardRestarted", "m", [1, 0, 9]))
    )
    assert not ok and (kind, msg, args) == ("ShardRestarted", "m", [1, 0, 9])


@pytest.fixture
def served_shard():
    """A ShardServer (no Ray) with its TCP server on a background event loop."""
    options = ShardOptions.from_config({}, token="t" * wire.TOKEN_BYTES)
    srv = ShardServer(0, 1, [EMB, LIN], options)
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    host, port = asyncio.run_coroutine_threadsafe(srv.serve("127.0.0.1"), loop).result(10)
    yield srv, host, port

    async def shutdown() -> None:
        srv._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    th.join(5)


def _send(sock: socket.socket, frame: list) -> tuple[bool, object]:
    sock.sendall(b"".join(frame))
    hlen, blen = wire.PREFIX.unpack(wire.recv_exact(sock, wire.PREFIX.size))
    header = wire.recv_exact(sock, hlen)
    return wire.decode_reply(bytes(header), wire.recv_exact(sock, blen))


def test_calls_in_order_and_errors_as_replies(served_shard):
    srv, host, port = served_shard
    with socket.create_connection((host, port)) as s:
        s.sendall(b"t" * wire.TOKEN_BYTES)
        assert wire.recv_exact(s, 1) == wire.ACK
        keys = np.array([4, 9])
        ok, res = _send(
            s,
            wire.encode_request(
                StepCall(0, 0, {"lin": (keys, np.ones((2, 1), np.float32))}, 1.0, {"lin": keys})
            ),
        )
        assert ok
        np.testing.assert_array_equal(res.rows["lin"], [[-1.0], [-1.0]])  # momentum's 1st step
        # A bad call is answered with its error; the connection stays usable.
        ok, (kind, msg, _) = _send(s, wire.encode_request(StepCall(0, 1, pulls={"nope": keys})))
        assert not ok and kind == "ValueError" and "unknown table 'nope'" in msg
        ok, res = _send(s, wire.encode_request(StepCall(0, 1, pulls={"lin": None})))
        assert ok and res.rows["lin"].shape == (20, 1)
    assert srv.shard.clocks.pushed[0] == 1


def test_a_wrong_token_is_disconnected_unanswered(served_shard):
    srv, host, port = served_shard
    with socket.create_connection((host, port)) as s:
        s.settimeout(10)
        s.sendall(b"x" * wire.TOKEN_BYTES)
        try:
            s.sendall(b"".join(wire.encode_request(StepCall(0, 0, pulls={"lin": None}))))
            # Closed by the shard: an orderly close, or a reset when our request was still
            # unread in its buffer (both are "no reply").
            assert s.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
    assert srv.shard.clocks.pushed[0] == 0


def _request(push: list | None, pull: list | None, body: bytes) -> tuple[bytes, bytes]:
    h = {"w": 0, "c": 0, "lr": 0.1, "r": False, "push": push, "pull": pull}
    return json.dumps(h).encode(), body


@pytest.mark.parametrize(
    ("header", "body", "match"),
    [
        (b"\xff\xfe garbage", b"", "malformed request header"),
        (b"[1, 2]", b"", "malformed request header"),
        (b'{"w": 0}', b"", "malformed request header"),
        (*_request(None, [["emb", 3]], bytes(16)), "need more than the body's 16 bytes"),
        (*_request(None, [["emb", 1]], bytes(16)), "hold 8 bytes, the body 16"),
        (*_request([["emb", 2, 4, "<f4"]], None, bytes(40)), "need more than the body's 40"),
        (*_request([["emb", 1, 1, "|O"]], None, bytes(16)), "malformed push of table 'emb'"),
        (*_request([["emb", -1, 1, "<f4"]], None, b""), "malformed push of table 'emb'"),
        (*_request(None, [["emb", 2**62]], b""), "need more than the body's 0 bytes"),
        (*_request(None, [["emb", 1], ["emb", 1]], bytes(16)), "table 'emb' listed twice"),
        (*_request(None, [["emb", "1"]], bytes(8)), "malformed pull of table 'emb'"),
    ],
)
def test_a_malformed_request_is_a_value_error(header, body, match):
    with pytest.raises(ValueError, match=match):
        wire.decode_request(header, body)


def test_bad_header_fields_are_refused():
    ok = json.loads(_request(None, None, b"")[0])
    for field, bad in (("w", "0"), ("c", -1), ("c", True), ("lr", "nan"), ("r", 1)):
        h = dict(ok, **{field: bad})
        with pytest.raises(ValueError, match="malformed request header"):
            wire.decode_request(json.dumps(h).encode(), b"")


def test_frame_limits_come_from_the_tables():
    small = TableSpec("small", rows=100, cols=4)
    limits = wire.FrameLimits.of([small, LIN], 2)
    # 50 keys of `small` on one of 2 shards (push: 8 + 4*8 bytes, pull: 8), 10 of `lin`
    # (a device tier's write-back: 8 + 2*8 bytes, its weight and its momentum).
    assert limits.max_body == 50 * (40 + 8) + 10 * (24 + 8)
    assert limits.max_header == 1024 + 2 * len('"small"') + 192 + 2 * len('"lin"') + 192
    assert limits.max_frame == limits.max_body
    unbounded = wire.FrameLimits.of([EMB, LIN], 1)
    assert unbounded.max_body == wire.MAX_CALL_BYTES
    assert unbounded.max_frame == wire.MAX_FRAME_BYTES


def _steps(seed: int = 0, n: int = 5):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        ek = rng.integers(-500, 500, 30)
        lk = rng.integers(0, 20, 10)
        yield ek, rng.standard_normal((30, 4)).astype(np.float32), lk, rng.standard_normal((10, 1))


def test_socket_and_ray_transports_agree(ray_local):
    """The same pushes and pulls through each transport give bit-identical rows."""
    got = {}
    for kind in ("socket", "ray"):
        c = PSClient.launch(
            [EMB, LIN],
            PSOptions.from_config(
                {
                    "angel.job.name": f"wire-{kind}",
                    "angel.ps.number": 2,
                    "angel.ps.transport": kind,
                }
            ),
        )
        try:
            out = []
            for i, (ek, eg, lk, lg) in enumerate(_steps()):
                rows = c.push_pull(
                    {"emb": (ek, eg), "lin": (lk, lg)}, 0.1 / (i + 1), {"emb": ek, "lin": lk}
                )
                c.push("lin", lk, lg, 0.05)
                out.append((rows["emb"], rows["lin"], c.pull_dense("lin")))
            used = [type(ch).__name__ for ch in c.net.chans]
            got[kind] = out
        finally:
            c.shutdown()
        assert used == ["Channel" if kind == "socket" else "NoneType"] * 2
    for a, b in zip(got["socket"], got["ray"], strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_unreachable_data_plane_falls_back_to_ray_calls(ray_local):
    c = PSClient.launch(
        [EMB, LIN], PSOptions.from_config({"angel.job.name": "wire-fallback", "angel.ps.number": 1})
    )
    try:
        # An address no shard can listen on (TEST-NET-1): serve() fails in the actor.
        c.net.options = dataclasses.replace(c.net.options, data_host="192.0.2.1")
        with pytest.warns(RuntimeWarning, match="no direct connection to parameter shard 0"):
            rows = c.push_pull(
                {"lin": (np.array([1]), np.ones((1, 1)))}, 1.0, {"lin": np.array([1])}
            )
        np.testing.assert_array_equal(rows["lin"], [[-1.0]])
        assert c.net.chans == [False]
        np.testing.assert_array_equal(c.pull("lin", np.array([1])), [[-1.0]])
    finally:
        c.shutdown()


def test_large_calls_stream_over_the_socket_in_frames(ray_local, monkeypatch):
    """Calls far above one frame stream over the connection (no Ray call), pushes and pulls
    alike, interleaved with small ones, and give exactly the rows of a reference shard."""
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 512)  # this process's (the client's) frames
    c = PSClient.launch(
        [EMB, LIN],
        # (on the socket: with a shard on this node the bodies would skip it, shared.mib > 0)
        PSOptions.from_config(
            {"angel.job.name": "wire-stream", "angel.ps.number": 1, "angel.ps.shared.mib": 0}
        ),
    )
    ref = ParameterShard(0, 1, [EMB, LIN])
    rng = np.random.default_rng(3)
    try:
        for i in range(6):
            n = 4 if i % 2 else 3000  # 3000 keys: 72 KB a push, streamed in 512-byte frames
            keys = np.unique(rng.integers(-5000, 5000, n))
            grads = rng.standard_normal((len(keys), 4)).astype(np.float32)
            c.push("emb", keys, grads, 0.1)  # not waited for
            ref.push(0, ref.clocks.pushed[0], {"emb": (keys, grads)}, 0.1)
            small = np.array([keys[0]])
            np.testing.assert_array_equal(c.pull("emb", small), ref.pull({"emb": small})["emb"])
        everything = np.arange(-5000, 5000)
        np.testing.assert_array_equal(
            c.pull("emb", everything), ref.pull({"emb": everything})["emb"]
        )
        assert c.net.ray_refs == [[]], "no call took Ray"
        chan = c.net.chans[0]
        assert isinstance(chan, transport.Channel) and chan.sent == 13
        assert c.bytes_moved > 2 * 3000 * (8 + 16)
    finally:
        c.shutdown()


def test_frames_split_a_long_body_and_rejoin():
    bufs = [np.arange(700, dtype=np.int64).data, b"xyz", np.ones((3, 4), np.float32).data]
    total = 700 * 8 + 3 + 48
    old = wire.MAX_FRAME_BYTES
    wire.MAX_FRAME_BYTES = 1000
    try:
        out = wire.frames({"ok": True}, bufs)
    finally:
        wire.MAX_FRAME_BYTES = old
    raw = b"".join(bytes(b) for b in out)
    hlen, blen = wire.PREFIX.unpack(raw[:12])
    header = raw[12 : 12 + hlen]
    assert json.loads(header) == {"ok": True, "n": total} and blen == 1000
    body, pos = bytearray(raw[12 + hlen : 12 + hlen + blen]), 12 + hlen + blen
    frames = 1
    while pos < len(raw):
        hlen, blen = wire.PREFIX.unpack(raw[pos : pos + 12])
        assert hlen == 0 and 0 < blen <= 1000
        body += raw[pos + 12 : pos + 12 + blen]
        pos += 12 + blen
        frames += 1
    assert frames == 6 and len(body) == total
    assert body == b"".join(bytes(b) for b in bufs)
    with pytest.raises(ValueError, match="announcing a 5-byte call after a 9-byte frame"):
        wire.stream_length(json.dumps({"n": 5}).encode(), 9)


def test_a_prefetch_pull_needs_staleness(ray_local):
    """A pull for a later clock (ahead) is served under SSP; under BSP it is refused, naming
    the key that sets the depth."""
    for staleness in (0, 2):
        c = PSClient.launch(
            [EMB, LIN],
            PSOptions.from_config(
                {"angel.job.name": f"wire-ahead{staleness}", "angel.staleness": staleness}
            ),
        )
        try:
            keys = np.array([1, 2])
            fut = c.push_pull_async({"lin": (keys, np.ones((2, 1)))}, 0.5, {"lin": keys}, ahead=1)
            if staleness == 0:
                with pytest.raises(ValueError, match=r"angel\.worker\.prefetch\.depth=1"):
                    fut.result()
            else:
                np.testing.assert_array_equal(fut.result()["lin"], [[-0.5], [-0.5]])
        finally:
            c.shutdown()


def test_a_call_over_one_frame_streams_both_ways(ray_local):
    """A 7 MB push and a 5 MB reply (more than one 4 MiB frame each, at the real frame size)
    take the connection and give the rows of a reference shard."""
    c = PSClient.launch(
        [EMB],
        PSOptions.from_config(  # (on the socket, as above)
            {"angel.job.name": "wire-big", "angel.ps.number": 1, "angel.ps.shared.mib": 0}
        ),
    )
    ref = ParameterShard(0, 1, [EMB])
    try:
        keys = np.arange(300_000, dtype=np.int64) * 7 - 1_000_000
        grads = np.random.default_rng(5).standard_normal((keys.size, 4)).astype(np.float32)
        assert keys.nbytes + grads.nbytes > wire.MAX_FRAME_BYTES
        rows = c.push_pull({"emb": (keys, grads)}, 0.1, {"emb": keys})["emb"]
        ref.push(0, 0, {"emb": (keys, grads)}, 0.1)
        np.testing.assert_array_equal(rows, ref.pull({"emb": keys})["emb"])
        assert c.net.ray_refs == [[]] and c.net.chans[0].sent == 1
    finally:
        c.shutdown()


def _step(srv: ShardServer, call: StepCall) -> StepResult:
    return asyncio.run(srv.step(call))


@pytest.mark.parametrize(
    ("pushes", "step", "match"),
    [
        (
            {"lin": ([7], np.ones((1, 1)))},
            0.1,
            r"key 7 is not held by this shard \(rows \[10, 20\)\)",
        ),
        ({"lin": ([25], np.ones((1, 1)))}, 0.1, r"key 25 is outside the dense range \[0, 20\)"),
        ({"lin": ([12], np.ones((1, 2)))}, 0.1, r"gradients of shape \(1, 2\) do not match"),
        ({"lin": ([12], [[np.nan]])}, 0.1, r"gradient contains NaN or inf"),
        ({"nope": ([12], np.ones((1, 1)))}, 0.1, r"unknown table 'nope'"),
        ({"lin": ([12], np.ones((1, 1)))}, float("nan"), r"learning rate nan must be a finite"),
    ],
)
def test_a_call_from_the_network_is_checked_by_the_shard(pushes, step, match):
    """A well-formed frame whose push is wrong for the shard's tables (a key it does not hold,
    out of range, a wrong width, NaN, an unknown table, a bad step) is refused by the shard
    with the client's own messages, and leaves it unchanged: what the wire decodes is never
    marked checked, whatever the sender."""
    options = ShardOptions.from_config({"angel.ps.nan.policy": "error"})
    srv = ShardServer(1, 2, [LIN], options)  # holds rows [10, 20) of lin
    before = srv.shard.pull({"lin": np.arange(10, 20)})["lin"].copy()
    arrays = {
        t: (np.asarray(k, np.int64), np.asarray(g, np.float64)) for t, (k, g) in pushes.items()
    }
    call = StepCall(0, 0, arrays, step, checked=True)
    decoded = wire.decode_request(*_frame(wire.encode_request(call)))
    assert not decoded.checked
    with pytest.raises(ValueError, match=match):
        _step(srv, decoded)
    np.testing.assert_array_equal(srv.shard.pull({"lin": np.arange(10, 20)})["lin"], before)
    assert srv.shard.clocks.pushed[0] == 0
    # A good call from the network is applied.
    good = StepCall(0, 0, {"lin": (np.array([12]), np.ones((1, 1)))}, 1.0, {"lin": None})
    res = _step(srv, wire.decode_request(*_frame(wire.encode_request(good))))
    assert res.rows["lin"][2, 0] == -1.0 and res.backed_up == 0


def test_a_checked_call_is_not_validated_again(monkeypatch):
    """The client's calls (StepCall.checked: validated by angelps.push_checks before they left
    the worker) are applied without a second validation on the shard; the same call not marked
    is validated there."""
    from angelps.server import shard as shard_mod

    calls: list[str] = []

    def counting(name, f):
        def wrapped(*a, **k):
            calls.append(name)
            return f(*a, **k)

        return wrapped

    for name in ("check_push", "check_keys", "check_lr"):
        monkeypatch.setattr(shard_mod, name, counting(name, getattr(shard_mod, name)))
    srv = ShardServer(0, 1, [LIN], ShardOptions.from_config({}))
    keys = np.array([3, 4])
    grads = np.ones((2, 1), np.float32)
    res = _step(srv, StepCall(0, 0, {"lin": (keys, grads)}, 1.0, {"lin": keys}, checked=True))
    assert calls == []
    np.testing.assert_array_equal(res.rows["lin"], [[-1.0], [-1.0]])
    _step(srv, StepCall(0, 1, {"lin": (keys, grads)}, 1.0, {"lin": keys}))
    assert calls == ["check_lr", "check_push", "check_keys"]


def test_swap_round_trip_and_malformed_swaps():
    keys = np.array([4, 9], dtype=np.int64)
    rows = np.arange(4, dtype=np.float32).reshape(2, 2)
    frame = wire.encode_swap({"lin": (keys, rows)}, {"emb": np.array([1, 2, 3])})
    header, body = _frame(frame)
    assert wire.is_swap(header) and not wire.is_swap(_frame(wire.encode_request(StepCall(0, 0)))[0])
    writes, reads = wire.decode_swap(header, body)
    np.testing.assert_array_equal(writes["lin"][0], keys)
    np.testing.assert_array_equal(writes["lin"][1], rows)
    np.testing.assert_array_equal(reads["emb"], [1, 2, 3])
    with pytest.raises(ValueError, match="malformed swap: its arrays hold 56 bytes, the body 57"):
        wire.decode_swap(header, body + b"x")
    bad = json.dumps({"swap": 1, "wr": [["lin", 2, 2, "<i8"]], "rd": []}).encode()
    with pytest.raises(ValueError, match=r"malformed write-back of table 'lin': \[2, 2, '<i8'\]"):
        wire.decode_swap(bad, body)
    with pytest.raises(ValueError, match="malformed swap header"):
        wire.decode_swap(b'{"swap": 1}', b"")
    ok, got = wire.decode_reply(*_frame(wire.encode_reply(StepResult({"lin": rows}, 0, 4321))))
    assert ok and got.pid == 4321


def test_a_device_tiers_swap_goes_over_the_socket_and_equals_the_ray_call(ray_local):
    """A swap (write back whole rows, read whole rows) over the connection gives the rows of
    the same swap as a Ray actor call, with the shard's process id; a swap the shard refuses
    (a write-back of the wrong width) comes back as the shard's error."""
    got = {}
    for kind in ("socket", "ray"):
        c = PSClient.launch(
            [EMB, LIN],
            PSOptions.from_config(
                {"angel.job.name": f"swap-{kind}", "angel.ps.number": 2, "angel.ps.transport": kind}
            ),
        )
        try:
            keys = np.array([-9, 3, 4, 77, 501], dtype=np.int64)
            first = c.swap_async({}, {"emb": keys}).result()["emb"]
            written = first + 1.5
            fut = c.swap_async({"emb": (keys, written)}, {"emb": keys[::-1].copy()})
            again = fut.result()["emb"]
            np.testing.assert_array_equal(again, written[::-1])
            token = c.options.shard.token
            pids = [p for p, _ in ray.get([h.swap.remote({}, {}, secret=token) for h in c.handles])]
            assert fut.pids == dict(enumerate(pids))
            with pytest.raises(ValueError, match=r"a write-back of 1 rows needs a \[1, 4\]"):
                c.swap_async({"emb": (keys[:1], np.zeros((1, 3), np.float32))}, {}).result()
            got[kind] = (first, again)
            used = [type(ch).__name__ for ch in (*c.net.chans, *c.net.swap_chans)]
        finally:
            c.shutdown()
        # (over the socket, the swaps on a second connection to each shard)
        assert used == ["Channel" if kind == "socket" else "NoneType"] * 4
    for x, y in zip(got["socket"], got["ray"], strict=True):
        np.testing.assert_array_equal(x, y)
