"""Where a path points: the local file system, or object storage through ``pyarrow.fs``.

Every path a job reads or writes is a local path or a URL that ``pyarrow.fs`` understands
(``s3://bucket/key``, ``gs://bucket/key``, ``hdfs://``; ``file://`` is a local path). A local
path keeps the plain ``os`` calls of the callers (renames, fsync): nothing local goes through this
module's remote branch. A URL is opened with the file system its scheme names; S3 takes its
endpoint, region and credentials from the usual environment (``AWS_ENDPOINT_URL``,
``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ...), with bounded
connect and request timeouts, so an unreachable endpoint is an error in seconds, not a hang. GCS
takes Google's application default credentials, or an emulator (:func:`_gcs_filesystem`), with a
bounded retry time.

Object storage has no rename and no append: a file is written whole (one object) and appears
only when closed. The checkpoint protocol built on that is :mod:`angelps.checkpoint.remote`.
"""

from __future__ import annotations

import os
import posixpath
import threading
from datetime import timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = [
    "copy_file",
    "delete_dir",
    "delete_file",
    "exists",
    "input_file",
    "is_dir",
    "is_file",
    "is_remote",
    "join",
    "list_dir",
    "list_files",
    "local_path",
    "open_input_stream",
    "open_output_stream",
    "probe",
    "read_bytes",
    "remote",
    "write_bytes",
]

#: Seconds to connect and to wait for one request (S3), and attempts per request, for the
#: job's own reads and writes; the driver's check before a job starts uses the short ones.
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0
ATTEMPTS = 5
PROBE_CONNECT_TIMEOUT_S = 3.0
PROBE_REQUEST_TIMEOUT_S = 5.0
PROBE_ATTEMPTS = 2
#: A hard bound on the driver's check, whatever the client library does underneath.
PROBE_LIMIT_S = 20.0
#: The largest object one S3 CopyObject request copies (5 GiB); ``copy_file`` streams a larger
#: one through this process instead (S3 refuses the request, and pyarrow makes no multipart copy).
COPY_OBJECT_MAX_BYTES = 5 * 1024**3
_COPY_CHUNK = 64 * 1024**2
#: The environment that chooses an S3 endpoint and its credentials (a cached file system is
#: built again when one of them changes).
_S3_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)
#: The environment that points GCS at an emulator: google-cloud-cpp's own variable (read by
#: pyarrow's client itself, and winning over an explicit endpoint), then the Python client's.
_GCS_ENV = ("CLOUD_STORAGE_EMULATOR_ENDPOINT", "STORAGE_EMULATOR_HOST")
_ENV = _S3_ENV + _GCS_ENV
#: Object stores whose URL's host is a bucket: the path inside the file system starts with it.
_BUCKETS = ("s3", "gs")


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URL of a non-local file system (``file://`` is local)."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> str:
    """``path`` without a ``file://`` prefix (any other path as it is)."""
    return path[len("file://") :] if path.startswith("file://") else path


def join(base: str, *parts: str) -> str:
    """``base`` joined with ``parts``: ``/`` for a URL, the OS's separator for a local path."""
    return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


@lru_cache(maxsize=32)
def _filesystem(scheme: str, netloc: str, quick: bool, env: tuple[str, ...]) -> pafs.FileSystem:
    get = dict(zip(_ENV, env, strict=True)).get
    if scheme == "gs":
        return _gcs_filesystem(
            get("CLOUD_STORAGE_EMULATOR_ENDPOINT") or get("STORAGE_EMULATOR_HOST"), quick
        )
    if scheme != "s3":
        fs, _ = pafs.FileSystem.from_uri(f"{scheme}://{netloc}/")
        return fs
    # The S3 client is built here rather than by from_uri so that its timeouts and retries
    # are bounded; the endpoint is passed explicitly, as the constructor does not read it.
    opts: dict[str, Any] = {
        "connect_timeout": PROBE_CONNECT_TIMEOUT_S if quick else CONNECT_TIMEOUT_S,
        "request_timeout": PROBE_REQUEST_TIMEOUT_S if quick else REQUEST_TIMEOUT_S,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(
            max_attempts=PROBE_ATTEMPTS if quick else ATTEMPTS
        ),
    }
    endpoint = get("AWS_ENDPOINT_URL_S3") or get("AWS_ENDPOINT_URL")
    if endpoint:
        opts["endpoint_override"] = endpoint
    region = get("AWS_DEFAULT_REGION") or get("AWS_REGION")
    if region:
        opts["region"] = region
    return pafs.S3FileSystem(**opts)


def _gcs_filesystem(emulator: str | None, quick: bool) -> pafs.GcsFileSystem:
    """The GCS client: Google's default credentials, or with ``emulator`` (``http://host:port``,
    or ``host:port``) that endpoint without credentials.

    Built here rather than by ``from_uri`` for two reasons. An emulator takes no credentials,
    and a URL cannot say so short of ``gs://anonymous@bucket/...?scheme=http&endpoint_override=``
    in every path key: without ``anonymous`` the client first asks Google for an OAuth2 token
    (and, off Google's network, retries that until its retry limit), even when google-cloud-cpp's
    ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` already names the emulator. And that retry limit is 15
    minutes unless set: it is bounded here, as S3's timeouts are.
    """
    limit = PROBE_REQUEST_TIMEOUT_S if quick else REQUEST_TIMEOUT_S
    opts: dict[str, Any] = {"retry_time_limit": timedelta(seconds=limit)}
    if emulator:
        parts = urlsplit(emulator if "://" in emulator else f"http://{emulator}")
        opts.update(anonymous=True, scheme=parts.scheme, endpoint_override=parts.netloc)
    return pafs.GcsFileSystem(**opts)


def remote(url: str, quick: bool = False) -> tuple[pafs.FileSystem, str]:
    """(file system, path inside it) of a URL; ``quick``: the short timeouts of a check."""
    parts = urlsplit(url)
    env = tuple(os.environ.get(k, "") for k in _ENV)
    scheme = parts.scheme.lower()
    fs = _filesystem(scheme, parts.netloc, quick, env)
    inner = f"{parts.netloc}{parts.path}" if scheme in _BUCKETS else parts.path
    return fs, inner.rstrip("/") or inner


def open_input_stream(path: str, compression: str | None = None) -> pa.NativeFile:
    """A sequential reader of ``path`` (``compression="detect"``: by the suffix)."""
    if not is_remote(path):
        return pa.input_stream(local_path(path), compression=compression)
    fs, inner = remote(path)
    return fs.open_input_stream(inner, compression=compression)


def input_file(path: str) -> str | pa.NativeFile:
    """What ``pyarrow.parquet.ParquetFile`` reads: a local path as it is, a URL opened (random
    access)."""
    if not is_remote(path):
        return local_path(path)
    fs, inner = remote(path)
    return fs.open_input_file(inner)


def open_output_stream(path: str) -> pa.NativeFile:
    """A writer of a new file ``path`` (an object appears only when it is closed)."""
    if not is_remote(path):
        return pa.output_stream(local_path(path))
    fs, inner = remote(path)
    return fs.open_output_stream(inner)


def read_bytes(path: str) -> bytes:
    """The whole content of file ``path`` (FileNotFoundError when absent)."""
    if not is_remote(path):
        with open(local_path(path), "rb") as f:
            return f.read()
    fs, inner = remote(path)
    if fs.get_file_info(inner).type != pafs.FileType.File:
        raise FileNotFoundError(f"{path}: no such file")
    with fs.open_input_stream(inner) as f:
        return bytes(f.read())


def write_bytes(path: str, data: bytes | memoryview) -> None:
    """Write ``data`` as file ``path``, replacing it (one object: whole or not at all)."""
    with open_output_stream(path) as f:
        f.write(data)


def _info(path: str) -> pafs.FileType:
    if not is_remote(path):
        p = local_path(path)
        if os.path.isdir(p):
            return pafs.FileType.Directory
        return pafs.FileType.File if os.path.exists(p) else pafs.FileType.NotFound
    fs, inner = remote(path)
    return fs.get_file_info(inner).type


def exists(path: str) -> bool:
    """Whether ``path`` is a file or a directory (a prefix holding objects)."""
    return _info(path) != pafs.FileType.NotFound


def is_dir(path: str) -> bool:
    """Whether ``path`` is a directory (on object storage: a prefix holding objects)."""
    return _info(path) == pafs.FileType.Directory


def is_file(path: str) -> bool:
    """Whether ``path`` is a file (on object storage: an object)."""
    return _info(path) == pafs.FileType.File


def list_dir(path: str) -> list[tuple[str, bool]]:
    """(name, is a directory) of the entries directly under directory ``path``, by name."""
    if not is_remote(path):
        p = local_path(path)
        return sorted((n, os.path.isdir(os.path.join(p, n))) for n in os.listdir(p))
    fs, inner = remote(path)
    if fs.type_name != "gcs":
        infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
        return sorted((i.base_name, i.type == pafs.FileType.Directory) for i in infos)
    # pyarrow's GCS listing of one level names a sub-prefix only when a directory marker
    # object ("name/") exists, and objects written one by one (a checkpoint's generations)
    # leave none: list everything under the prefix, and take the first name of each path.
    infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True, recursive=True))
    entries: dict[str, bool] = {}
    for i in infos:
        name, sep, _ = i.path[len(inner) + 1 :].partition("/")
        entries[name] = entries.get(name, False) or bool(sep) or i.type == pafs.FileType.Directory
    return sorted(entries.items())


def list_files(path: str) -> list[tuple[str, int]]:
    """(path relative to ``path``, size in bytes) of every file under directory ``path``, at
    any depth, by name (``/``-separated; a URL only, as object storage has no directories)."""
    fs, inner = remote(path)
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    prefix = inner.rstrip("/") + "/"
    return sorted(
        (i.path[len(prefix) :], int(i.size or 0)) for i in infos if i.type == pafs.FileType.File
    )


def delete_dir(path: str) -> None:
    """Remove directory ``path`` and everything under it (nothing when it is absent)."""
    fs, inner = remote(path) if is_remote(path) else (pafs.LocalFileSystem(), local_path(path))
    if fs.get_file_info(inner).type == pafs.FileType.NotFound:
        return
    if fs.type_name == "gcs":
        # pyarrow's GCS delete_dir ends by deleting the marker object "path/", and fails
        # (404) where there is none: delete the objects, then the marker only if one is left.
        fs.delete_dir_contents(inner, missing_dir_ok=True)
        if fs.get_file_info(inner).type == pafs.FileType.NotFound:
            return
    fs.delete_dir(inner)


def delete_file(path: str) -> None:
    """Remove file ``path`` (nothing when it is absent)."""
    fs, inner = remote(path) if is_remote(path) else (pafs.LocalFileSystem(), local_path(path))
    if fs.get_file_info(inner).type != pafs.FileType.NotFound:
        fs.delete_file(inner)


def copy_file(src: str, dst: str) -> None:
    """Copy file ``src`` to ``dst``, URLs on the same file system: on S3 and GCS a server-side
    copy (no bytes through this process), on S3 streamed here past ``COPY_OBJECT_MAX_BYTES``."""
    fs, a = remote(src)
    _, b = remote(dst)
    if isinstance(fs, pafs.S3FileSystem) and (fs.get_file_info(a).size or 0) > (
        COPY_OBJECT_MAX_BYTES
    ):
        with fs.open_input_stream(a) as r, fs.open_output_stream(b) as w:
            while chunk := r.read(_COPY_CHUNK):
                w.write(chunk)
        return
    fs.copy_file(a, b)


#: Per scheme: what to check when the credentials are refused, and when the store is not
#: reached (the variables that choose them).
_HINTS = {
    "s3": ("AWS_ACCESS_KEY_ID, ...", "AWS_ENDPOINT_URL, the network"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS, ...", "CLOUD_STORAGE_EMULATOR_ENDPOINT, the network"),
}
_DENIED = ("ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch")  # S3
_DENIED_GCS = ("PERMISSION_DENIED", "UNAUTHENTICATED")
_UNREACHED = ("NETWORK_CONNECTION", "Could not resolve", "Could not connect")


def _why(error: str, scheme: str) -> str:
    """The client's error with what to check first, for the errors a user can fix."""
    credentials, endpoint = _HINTS.get(scheme, ("the client's configuration", "the network"))
    if any(w in error for w in _DENIED + _DENIED_GCS):
        return f"the store refused the credentials ({credentials}): {error}"
    if any(w in error for w in _UNREACHED):
        return f"cannot reach the store ({endpoint}): {error}"
    return error


def probe(url: str, must_exist: bool) -> str | None:
    """Why ``url`` cannot be used, in a few words, or None when it can: the bucket (or the
    file system) answers with these credentials, and with ``must_exist`` the path is there.
    Bounded in time (short timeouts, few retries, and a hard limit of ``PROBE_LIMIT_S``)."""
    answer: list[str | None] = []
    scheme = urlsplit(url).scheme.lower()

    def check() -> None:
        try:
            fs, inner = remote(url, quick=True)
            bucket = inner.split("/", 1)[0]
            if scheme in _BUCKETS:
                if not bucket:
                    answer.append("the URL names no bucket")
                    return
                if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                    answer.append(f"the bucket {bucket} does not exist")
                    return
            if must_exist and fs.get_file_info(inner).type == pafs.FileType.NotFound:
                answer.append("no such file or directory")
                return
            answer.append(None)
        except (OSError, ValueError, pa.ArrowException) as e:
            answer.append(_why(" ".join(str(e).split())[:300] or type(e).__name__, scheme))

    t = threading.Thread(target=check, daemon=True, name="angelps-fs-probe")
    t.start()
    t.join(PROBE_LIMIT_S)
    if not answer:
        return f"no answer from the object store within {PROBE_LIMIT_S:.0f} s"
    return answer[0]
