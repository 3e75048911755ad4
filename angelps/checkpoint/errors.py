"""What every checkpoint module shares: the file names and the errors (imported by the local
and the object-store code alike, so neither imports the other for them)."""

from __future__ import annotations

from angelconf.config import ConfigError

__all__ = ["FORMAT", "MANIFEST", "PREV", "CheckpointDamaged", "CheckpointError", "NoCheckpoint"]

MANIFEST = "manifest.json"
PREV = ".prev"
FORMAT = "angelps-checkpoint"


class CheckpointError(ConfigError):
    """A checkpoint that cannot be read, is damaged, does not fit this job, or a save path that
    must not be written. A ConfigError (so a ValueError): the command line answers it with one
    line and exit code 2."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint file whose content is not what was written: a checksum or row count that
    does not match, an unreadable Parquet file, a missing file."""


class NoCheckpoint(CheckpointError):
    """Nothing committed at a checkpoint path: absent, or a directory without its manifest
    (the message names the path, and an older checkpoint beside it when there is one)."""
