"""Checkpoints on gs:// (a local GCS emulator): the checkpoint, kept-copy and shard-backup
tests of the S3 module run here again against this module's ``bucket`` (bit-identical round
trip, a crash before the pointer keeps the previous checkpoint, stale generations removed,
damage refused, a copy made whole or not at all, a backup that dies keeps the last good one,
only a launch's own backups removed; the single-request copy limit is S3's alone), and what GCS
does its own way: prefixes without directory markers, and the emulator chosen by the
environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from angelps import fs

# Collected again in this module, so that they use the GCS ``bucket`` below.
from tests.angelps.test_checkpoint_s3 import (  # noqa: F401
    test_a_backup_reads_back_bit_exact_and_replaces_the_last,
    test_a_backup_that_dies_before_its_pointer_keeps_the_last_good_one,
    test_a_copy_equals_its_source_and_replaces_the_old_copy_only_when_complete,
    test_a_damaged_backup_pointer_is_refused_naming_it,
    test_a_prefix_of_other_objects_or_a_file_is_refused,
    test_a_shard_backs_up_to_a_prefix_of_its_own_and_shutdown_removes_only_it,
    test_crash_before_the_pointer_keeps_the_previous_checkpoint,
    test_damaged_pointer_is_refused_naming_it,
    test_damaged_table_file_refused_naming_it,
    test_previous_generation_kept_older_ones_removed,
    test_remove_takes_only_the_pointer_and_the_generations,
    test_save_and_load_round_trip_bit_identical,
    test_set_aside_falls_back_to_the_previous_and_keeps_the_damaged,
)
from tests.object_store import gcs_server, make_bucket


@pytest.fixture(scope="module")
def emulator() -> Iterator[dict[str, str]]:
    """The emulator's environment (set for this module) with a bucket ``ckpt``."""
    with gcs_server() as env, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("STORAGE_EMULATOR_HOST", raising=False)
        make_bucket(env, "ckpt")
        yield env


@pytest.fixture(scope="module")
def bucket(emulator: dict[str, str]) -> str:
    return "gs://ckpt"


def test_the_bucket_is_part_of_the_path(bucket: str) -> None:
    # gs://ckpt/x is object x of bucket ckpt, read back byte for byte.
    data = bytes(range(256)) * 3
    fs.write_bytes(f"{bucket}/raw/blob.bin", data)
    assert fs.remote(f"{bucket}/raw/blob.bin")[1] == "ckpt/raw/blob.bin"
    assert fs.read_bytes(f"{bucket}/raw/blob.bin") == data
    assert fs.list_dir(f"{bucket}/raw") == [("blob.bin", False)]


def test_prefixes_without_markers_are_listed_and_deleted(bucket: str) -> None:
    # Objects written one by one leave no "dir/" marker: the listing still shows the prefixes,
    # and removing one removes every object under it and nothing beside it.
    for name in ("p/a/x.bin", "p/a/y/z.bin", "p/b/x.bin", "p/c.bin"):
        fs.write_bytes(f"{bucket}/{name}", b"1")
    assert fs.list_dir(f"{bucket}/p") == [("a", True), ("b", True), ("c.bin", False)]
    assert fs.is_dir(f"{bucket}/p/a") and not fs.is_dir(f"{bucket}/p/c.bin")
    fs.delete_dir(f"{bucket}/p/a")
    assert fs.list_dir(f"{bucket}/p") == [("b", True), ("c.bin", False)]
    assert not fs.exists(f"{bucket}/p/a/y/z.bin")
    fs.delete_dir(f"{bucket}/p/none")  # absent: nothing to do
    assert fs.list_dir(f"{bucket}/nothing") == []


def test_storage_emulator_host_also_names_the_emulator(
    emulator: dict[str, str], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs.write_bytes(f"{bucket}/env/one.txt", b"one")
    host = emulator["CLOUD_STORAGE_EMULATOR_ENDPOINT"].removeprefix("http://")
    monkeypatch.delenv("CLOUD_STORAGE_EMULATOR_ENDPOINT")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)  # the Python client's form: no scheme
    assert fs.read_bytes(f"{bucket}/env/one.txt") == b"one"
    assert fs.probe(f"{bucket}/env/one.txt", must_exist=True) is None
    assert fs.probe("gs://no-such-bucket/x", must_exist=False) == (
        "the bucket no-such-bucket does not exist"
    )
