"""A local S3-compatible server for tests: moto's server mode on 127.0.0.1, on a free port.

:func:`s3_server` starts it and yields the environment a client needs (endpoint, region,
credentials); :func:`make_bucket` creates a bucket; :func:`require_auth` makes the server refuse
every request whose access key it does not know (bad credentials).
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["make_bucket", "require_auth", "s3_server", "upload_tree"]


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


def make_bucket(env: dict[str, str], bucket: str) -> None:
    """Create ``bucket`` on the server of ``env``."""
    import pyarrow.fs as pafs

    s3 = pafs.S3FileSystem(
        endpoint_override=env["AWS_ENDPOINT_URL"],
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_DEFAULT_REGION"],
        allow_bucket_creation=True,
    )
    s3.create_dir(bucket)


def upload_tree(env: dict[str, str], local: str, url: str) -> None:
    """Copy a local file or directory to ``url`` (``s3://bucket/prefix``)."""
    import pyarrow.fs as pafs

    s3 = pafs.S3FileSystem(
        endpoint_override=env["AWS_ENDPOINT_URL"],
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_DEFAULT_REGION"],
    )
    pafs.copy_files(local, url.removeprefix("s3://"), destination_filesystem=s3)


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
