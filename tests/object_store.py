"""Local object stores for tests, on 127.0.0.1 and a free port: an S3-compatible server (moto's
server mode) and a GCS emulator (gcp-storage-emulator, in memory).

:func:`s3_server` and :func:`gcs_server` start one and yield the environment a client needs (for
S3: endpoint, region, credentials; for GCS: ``CLOUD_STORAGE_EMULATOR_ENDPOINT``);
:func:`make_bucket` creates a bucket and :func:`upload_tree` copies files, on either;
:func:`require_auth` makes the S3 server refuse every request whose access key it does not know
(bad credentials).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["gcs_server", "make_bucket", "require_auth", "s3_server", "upload_tree"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """A moto S3 server for the duration of the block; yields its client environment."""
    # moto[server] is in the test extra: a missing one fails these tests, it does not skip them.
    from moto import server as server_mod

    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        server.stop()


@contextmanager
def gcs_server() -> Iterator[dict[str, str]]:
    """A GCS emulator for the duration of the block; yields its client environment.

    It runs in its own process, not in a thread of the tests': pyarrow's GCS client holds the
    GIL in some calls (``open_input_file``), and would wait forever on a server that needs it.
    """
    # gcp-storage-emulator is in the test extra: a missing one fails these tests.
    port = _free_port()
    argv = ["-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen([sys.executable, *argv, "--in-memory", "--quiet"])
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # up when its health check answers
            try:
                with urllib.request.urlopen(f"{endpoint}/", timeout=1) as r:
                    r.read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the GCS emulator did not start on {endpoint}") from None
                time.sleep(0.1)
        yield {"CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _client(env: dict[str, str], **opts: Any) -> Any:
    """A pyarrow file system on the store of ``env`` (S3 or GCS), built from ``env`` alone."""
    import pyarrow.fs as pafs

    if "CLOUD_STORAGE_EMULATOR_ENDPOINT" in env:
        host = env["CLOUD_STORAGE_EMULATOR_ENDPOINT"].removeprefix("http://")
        # project_id: creating a bucket needs one (the emulator takes any).
        return pafs.GcsFileSystem(
            anonymous=True, scheme="http", endpoint_override=host, project_id="test"
        )
    return pafs.S3FileSystem(
        endpoint_override=env["AWS_ENDPOINT_URL"],
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_DEFAULT_REGION"],
        **opts,
    )


def make_bucket(env: dict[str, str], bucket: str) -> None:
    """Create ``bucket`` on the server of ``env``."""
    _client(env, allow_bucket_creation=True).create_dir(bucket)


def upload_tree(env: dict[str, str], local: str, url: str) -> None:
    """Copy a local file or directory to ``url`` (``s3://bucket/prefix`` or ``gs://...``)."""
    import pyarrow.fs as pafs

    pafs.copy_files(local, url.split("://", 1)[1], destination_filesystem=_client(env))


def require_auth(env: dict[str, str], on: bool = True) -> None:
    """Make the server check every request's access key (``on``), or stop checking."""
    req = urllib.request.Request(
        f"{env['AWS_ENDPOINT_URL']}/moto-api/reset-auth",
        data=b"0" if on else b"inf",
        method="POST",
        headers={"Content-Type": "text/plain"},  # not a form: the server reads the raw body
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()
