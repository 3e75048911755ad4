"""angelps.file_store: one tree read on a local disk and on a local S3 server (moto) answers the
same through the store files_for picks; a light process reading a local path loads no pyarrow."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from angelps.file_store import FileStore, LocalFiles, ObjectFiles, files_for, is_url
from tests.object_store import make_bucket, s3_server, upload_tree

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(local folder, its copy on S3): two files, a hidden one, and a folder with one file."""
    local = tmp_path_factory.mktemp("tree")
    (local / "b.txt").write_bytes(b"bee\n")
    (local / "a.txt").write_bytes(b"a\n")
    (local / "_hidden").write_bytes(b"")
    (local / "sub").mkdir()
    (local / "sub" / "c.txt").write_bytes(b"c")
    mp = pytest.MonkeyPatch()
    with s3_server() as env:
        for k, v in env.items():
            mp.setenv(k, v)
        make_bucket(env, "files")
        upload_tree(env, str(local), "s3://files/tree")
        yield str(local), "s3://files/tree"
    mp.undo()


def _answers(store: FileStore, root: str) -> dict[str, object]:
    j = store.join
    missing = j(root, "nope")
    with pytest.raises(FileNotFoundError):
        store.read_bytes(missing)
    with pytest.raises(FileNotFoundError):
        store.read_bytes(j(root, "sub"))  # a folder is not a file
    return {
        "exists": [store.exists(root), store.exists(j(root, "a.txt")), store.exists(missing)],
        "is_file": [store.is_file(j(root, "a.txt")), store.is_file(j(root, "sub"))],
        "is_dir": [store.is_dir(root), store.is_dir(j(root, "sub")), store.is_dir(missing)],
        "list_dir": store.list_dir(root),
        "files_in": store.files_in(root),
        "read": store.read_bytes(j(root, "b.txt")),
        "probe": store.probe(root, must_exist=True),
    }


def test_a_local_tree_and_its_copy_on_s3_read_the_same(tree: tuple[str, str]) -> None:
    local, url = tree
    assert isinstance(files_for(local), LocalFiles)
    assert isinstance(files_for(url), ObjectFiles)
    want = {
        "exists": [True, True, False],
        "is_file": [True, False],
        "is_dir": [True, True, False],
        "list_dir": [("_hidden", False), ("a.txt", False), ("b.txt", False), ("sub", True)],
        "files_in": ["_hidden", "a.txt", "b.txt"],
        "read": b"bee\n",
        "probe": None,
    }
    assert _answers(files_for(local), local) == want
    assert _answers(files_for(url), url) == want


def test_where_a_path_is(tree: tuple[str, str]) -> None:
    local, url = tree
    assert files_for(url).join(url, "sub", "c.txt") == "s3://files/tree/sub/c.txt"
    assert files_for(url).disk_path(url) is None
    assert files_for(local).disk_path(local) == Path(local)
    assert files_for(f"file://{local}").disk_path(f"file://{local}") == Path(local)
    # A bucket holds no siblings (kept copies <path>.best beside it would be other buckets).
    assert files_for("s3://files").parent("s3://files/") is None
    assert files_for(url).parent(url) == "s3://files"
    assert files_for(url).parent("s3://files/a/b") == "s3://files/a"
    assert files_for(local).parent(local) == str(Path(local).parent)
    assert [files_for(p).is_absolute(p) for p in (url, local, "rel/x", "file://rel")] == [
        True,
        True,
        False,
        False,
    ]
    assert files_for("file://r/../s").absolute("file://r/../s", "/base") == "/base/s"
    assert files_for(url).absolute(url, "/base") == url
    assert files_for("~/x/../y").canonical("~/x/../y") == str(Path.home() / "y")
    assert files_for(url + "/").canonical(url + "/") == url + "/"  # a URL as it is
    assert [is_url(p) for p in (url, "gs://b/k", "hdfs://nn/p", local, "file:///x", None)] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]


def test_a_missing_bucket_is_said_by_the_probe(tree: tuple[str, str]) -> None:
    assert files_for("s3://no-such/x").probe("s3://no-such/x", must_exist=False) == (
        "the bucket no-such does not exist"
    )
    assert files_for("/no/such/dir").probe("/no/such/dir", must_exist=True) is None


def test_reading_a_local_path_loads_no_pyarrow(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    code = (
        "import sys\nfrom angelps.file_store import files_for\n"
        f"s = files_for({str(tmp_path)!r})\n"
        f"assert s.files_in({str(tmp_path)!r}) == ['f'] and s.read_bytes({str(tmp_path / 'f')!r})\n"
        "print('pyarrow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
