"""An exclusive create on object storage, without a conditional put.

``pyarrow.fs`` offers no ``If-None-Match`` (S3) or ``ifGenerationMatch=0`` (GCS): a plain write
replaces an object whoever wrote it, so "check that the lock is absent, then write it" lets two
contenders that check within the same round trip both write, and both think they hold it.
:func:`create_new` closes that window with claims:

1. the object is there: not created;
2. write a claim ``<path>.claim-<token>`` beside it (a name of this contender's own: no one
   replaces it);
3. list the claims: another live one means a contender at the same step: withdraw the claim,
   wait a random moment and start again (bounded);
4. check again that the object is absent, write it, and only then remove the claim.

Two contenders cannot both pass step 3 and 4: the one whose claim was written second lists
the other's claim, unless that one already wrote the object and removed its claim, in which
case its check of step 4 sees the object. This rests on the store's strong read-after-write
and list-after-write consistency (S3 and GCS give both) and is **best effort** beyond it: a
claim older than :data:`STALE_S` seconds (by the store's clock) is taken for one a crashed
contender left behind and ignored, so a contender that stalls longer than that between steps 2
and 4 can still collide; and contenders that keep colliding give up after :data:`ATTEMPTS`
rounds (not created: the caller says it could not take the lock).
"""

from __future__ import annotations

import random
import time
import uuid
from datetime import datetime

import pyarrow.fs as pafs

from angelps import fs

__all__ = ["ATTEMPTS", "CLAIM", "STALE_S", "claims", "create_new"]

#: The claims of ``<path>`` are the objects ``<path>.claim-<token>`` beside it (not under a
#: prefix of their own: pyarrow leaves a directory marker behind the last object it removes).
CLAIM = ".claim-"
#: A claim older than this (seconds, against this contender's own claim) is a leftover.
STALE_S = 60.0
#: Rounds of claims before giving up when contenders keep colliding.
ATTEMPTS = 8


def create_new(path: str, data: bytes) -> bool:
    """Create object ``path`` holding ``data`` unless it exists: whether this call created it
    (False also when contenders kept colliding for :data:`ATTEMPTS` rounds)."""
    token = uuid.uuid4().hex
    mine = path + CLAIM + token
    for attempt in range(ATTEMPTS):
        if fs.exists(path):
            return False
        fs.write_bytes(mine, token.encode())
        try:
            if not _others(path, token):
                if fs.exists(path):
                    return False  # written by a contender that finished meanwhile
                fs.write_bytes(path, data)
                return True
        finally:
            fs.delete_file(mine)  # after the object is written: see the module's docstring
        # Another contender at the same step: both withdrew; try again at random moments.
        time.sleep(random.uniform(0.02, 0.2) * (attempt + 1))
    return False


def claims(path: str) -> dict[str, datetime | None]:
    """token -> when written (by the store's clock) of every claim on ``path``."""
    store, inner = fs.remote(path)
    parent, _, name = inner.rpartition("/")
    prefix = name + CLAIM
    infos = store.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
    return {
        i.base_name[len(prefix) :]: i.mtime
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.startswith(prefix)
    }


def _others(path: str, token: str) -> bool:
    """Whether ``path`` has a live claim of another contender (a leftover older than
    :data:`STALE_S` than this one's is removed); True when this one's is not listed (a store
    that does not list what was just written: taken as a collision)."""
    found = claims(path)
    if token not in found:
        return True
    mine = found.pop(token)
    live = False
    for other, when in found.items():
        if mine is not None and when is not None and (mine - when).total_seconds() > STALE_S:
            fs.delete_file(path + CLAIM + other)  # left by a contender that crashed
        else:
            live = True
    return live
