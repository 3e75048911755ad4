"""Hostile data-plane peers against one real shard actor, and the backup directory's defences.

Every hostile connection (idle, a short or wrong token, garbage, a 2^62 length, an oversized
header, arrays that do not fill the body, an unknown table) is closed or answered with an
error, while the job's own client keeps its connection and gets exactly the rows of an
in-process reference shard.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterator

import numpy as np
import pytest
import ray

from angelps.checkpoint.files import CheckpointError
from angelps.client import wire
from angelps.client.ps_client import PSClient
from angelps.options import PSOptions
from angelps.server.launch import shard_options
from angelps.server.shard import ParameterShard
from angelps.server.shard_server import ShardServer, backup_version, private_dir
from angelps.step_call import StepCall
from angelps.table import OptimizerSpec, TableSpec

EMB = TableSpec("emb", rows=-1, cols=4, sparse=True, init="normal", init_std=0.1, seed=5)
LIN = TableSpec("lin", rows=20, cols=1, init="zeros", optimizer=OptimizerSpec("momentum"))


class Job:
    """The job's client, an in-process reference shard fed the same calls, the shard's address."""

    def __init__(self) -> None:
        self.client = PSClient.launch(
            [EMB, LIN],
            PSOptions.from_config({"angel.job.name": "hostile", "angel.ps.token.timeout.ms": 300}),
        )
        self.ref = ParameterShard(0, 1, [EMB, LIN])
        self.rng = np.random.default_rng(7)
        self.token = self.client.options.shard.token.encode()
        self.check()  # opens the client's connection
        self.chan = self.client.net.chans[0]
        self.host, self.port = ray.get(self.client.handles[0].serve.remote("127.0.0.1"))

    def check(self) -> None:
        """One push and pull of the job: the rows equal the reference's, on the same connection."""
        keys = np.unique(self.rng.integers(-100, 100, 12))
        grads = self.rng.standard_normal((len(keys), 4)).astype(np.float32)
        got = self.client.push_pull({"emb": (keys, grads)}, 0.1, {"emb": keys})["emb"]
        self.ref.push(0, self.ref.clocks.pushed[0], {"emb": (keys, grads)}, 0.1)
        np.testing.assert_array_equal(got, self.ref.pull({"emb": keys})["emb"])
        if hasattr(self, "chan"):
            assert self.client.net.chans[0] is self.chan and not self.chan.dead

    def connect(self, token: bytes | None = None) -> socket.socket:
        s = socket.create_connection((self.host, self.port), timeout=30)
        if token is not None:
            s.sendall(token)
            if token == self.token:
                assert wire.recv_exact(s, 1) == wire.ACK
        return s

    def connections(self) -> dict[str, int]:
        return self.client.stats()[0]["connections"]


@pytest.fixture(scope="module")
def job(ray_local: None) -> Iterator[Job]:
    j = Job()
    yield j
    j.client.shutdown()


def _closed(s: socket.socket) -> bool:
    """True once the shard has closed ``s`` (waits for it, up to the socket's timeout)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _reply(s: socket.socket) -> tuple[bool, object]:
    hlen, blen = wire.PREFIX.unpack(wire.recv_exact(s, wire.PREFIX.size))
    header = wire.recv_exact(s, hlen)
    return wire.decode_reply(bytes(header), wire.recv_exact(s, blen))


def test_idle_and_short_token_connections_are_closed(job: Job) -> None:
    before = job.connections()["dropped"]
    idle, short = job.connect(), job.connect(job.token[:5])
    job.check()  # served while both wait
    assert _closed(idle) and _closed(short)  # after angel.ps.token.timeout.ms=300
    idle.close()
    short.close()
    job.check()
    assert job.connections()["dropped"] == before + 2


def test_a_wrong_token_is_closed_unanswered(job: Job) -> None:
    with job.connect(b"x" * wire.TOKEN_BYTES) as s:
        s.sendall(b"".join(wire.encode_request(StepCall(0, 0, pulls={"lin": None}))))
        assert _closed(s)
    job.check()


@pytest.mark.parametrize(
    "prefix",
    [
        wire.PREFIX.pack(16, 2**62),  # a 2^62-byte body
        wire.PREFIX.pack(2**31, 0),  # a 2 GiB header
        wire.PREFIX.pack(16, wire.MAX_FRAME_BYTES + 1),  # just over the longest frame
        b"\xde\xad\xbe\xef" * 3,  # garbage
    ],
    ids=["2^62-body", "2GiB-header", "over-the-limit", "garbage"],
)
def test_a_frame_over_the_limits_closes_its_connection(job: Job, prefix: bytes) -> None:
    before = job.connections()["dropped"]
    with job.connect(job.token) as s:
        s.sendall(prefix)
        assert _closed(s)
    job.check()
    assert job.connections()["dropped"] == before + 1


def test_malformed_requests_are_answered_and_the_connection_stays(job: Job) -> None:
    def frame(push: list | None, pull: list | None, body: bytes) -> bytes:
        h = json.dumps({"w": 0, "c": 0, "lr": 0.1, "r": False, "push": push, "pull": pull})
        return wire.PREFIX.pack(len(h), len(body)) + h.encode() + body

    bad = [
        (wire.PREFIX.pack(7, 0) + b"garbage", "malformed request header"),
        (frame([["emb", 10, 4, "<f4"]], None, bytes(40)), "need more than the body's 40"),
        (frame(None, [["emb", 1]], bytes(24)), "hold 8 bytes, the body 24"),
        (frame(None, [["nope", 1]], bytes(8)), "unknown table 'nope'"),
    ]
    with job.connect(job.token) as s:
        for raw, match in bad:
            s.sendall(raw)
            ok, (kind, msg, _) = _reply(s)
            assert not ok and kind == "ValueError" and match in msg
            job.check()
        s.sendall(b"".join(wire.encode_request(StepCall(0, 0, pulls={"lin": None}))))
        ok, res = _reply(s)
        assert ok and res.rows["lin"].shape == (20, 1)
    job.check()


# --- the backup directory ------------------------------------------------------------------


@pytest.mark.parametrize("pointer", ["../x", "/etc", "b-1/../../x", "sub/b-1", "", "b-1\x00"])
def test_a_latest_pointer_out_of_the_backup_directory_is_refused(tmp_path, pointer) -> None:
    (tmp_path / "LATEST").write_text(pointer)
    with pytest.raises(CheckpointError, match=r"refusing to restore from it") as e:
        backup_version(str(tmp_path))
    assert str(tmp_path / "LATEST") in str(e.value)
    (tmp_path / "LATEST").write_text("b-1763891234567890123\n")
    assert backup_version(str(tmp_path)) == "b-1763891234567890123"
    os.remove(tmp_path / "LATEST")
    assert backup_version(str(tmp_path)) is None


def test_backup_directories_are_private(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        default = shard_options(
            PSOptions.from_config({"angel.ps.backup.interval": 5, "angel.job.name": "priv"}), 1
        ).backup_dir
        under = shard_options(
            PSOptions.from_config(
                {"angel.ps.backup.interval": 5, "angel.ps.backup.path": str(tmp_path / "bk")}
            ),
            1,
        )
    finally:
        os.umask(old)
    try:
        assert os.path.basename(default).startswith("angelps-backup-priv-")
        assert stat.S_IMODE(os.stat(default).st_mode) == 0o700
        assert os.path.dirname(under.backup_dir) == str(tmp_path / "bk")
        assert stat.S_IMODE(os.stat(under.backup_dir).st_mode) == 0o700
        srv = ShardServer(0, 1, [LIN], under)  # the shard's own subdirectory: 0700 too
        assert stat.S_IMODE(os.stat(srv.backups.dir).st_mode) == 0o700
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        private_dir(str(shared))
        assert stat.S_IMODE(os.stat(shared).st_mode) == 0o700
    finally:
        os.rmdir(default)
