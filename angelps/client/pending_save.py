"""A checkpoint of the shards (and of tables the workers hold) being written:
:func:`start_save` starts it, :meth:`PendingSave.result` finishes it (:meth:`PSClient.save`
and :meth:`PSClient.save_async`).

The writers put their files into a temporary directory (or generation) beside the target;
once every one is done, the manifest (every file's SHA-256) is written last and the directory
is committed into place (:mod:`angelps.checkpoint.local_dir`, :mod:`angelps.checkpoint.remote`).
With ``background`` the shards (:mod:`angelps.server.shard_saves`) and the workers copy their
rows when the save starts and write the copies in threads: :func:`start_save` returns as soon
as the copies are made, and training goes on while the files are written; ``result()`` then
waits for them and commits. Either way a save that fails leaves no temporary behind and the
previous checkpoint as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import RayTaskError

from angelps import fs
from angelps.checkpoint import files as checkpoint
from angelps.checkpoint.store import store_for, write_durably
from angelps.client.recovery import SHARD_LOST
from angelps.client.transport import remote_error
from angelps.options import ClientOptions
from angelps.table import TableSpec

__all__ = ["HeldWriter", "PendingSave", "save_caught_up", "start_save"]


class HeldWriter(Protocol):
    """Tables held outside the shards that a checkpoint also writes (:meth:`PSClient.save`)."""

    tables: Sequence[TableSpec]
    #: files per table (one per owner)
    owners: int

    def start(self, root: str, background: bool) -> Callable[[], Mapping[str, Any]]:
        """Start writing the tables' files under ``root`` (``background``: from copies made
        now, in the owners' threads); a callable that waits for them and returns their
        manifest entries by file name."""


class SavingClient(Protocol):
    """What a save needs of :class:`angelps.client.ps_client.PSClient`."""

    specs: dict[str, TableSpec]
    num_shards: int
    handles: list[Any]

    @property
    def partitioner(self) -> str: ...

    @property
    def num_workers(self) -> int: ...

    @property
    def options(self) -> ClientOptions: ...

    @property
    def step_count(self) -> int: ...

    def flush(self) -> None: ...

    def catch_up(self) -> int: ...


def save_caught_up(
    client: SavingClient,
    path: str,
    extra: Mapping[str, Any] | None = None,
    files: Mapping[str, bytes] | None = None,
    held: HeldWriter | None = None,
    background: bool = False,
) -> PendingSave:
    """:func:`start_save` (and, inline, its commit) by a client that pushed once it caught up
    (a shard restarted since its last step gets its pushes replayed first, rather than refuse
    to save: :meth:`PSClient.catch_up`); where a shard dies before anything is committed
    (``SHARD_LOST``: nothing has moved on, the caller waiting) it catches up again and the
    save is made once more. A client that never pushed (the launching one of a job whose
    workers push) saves as it is: each worker catches up itself."""
    pushed = client.step_count > 0
    for again in (False, True):
        if pushed:
            client.catch_up()
        try:
            pending = start_save(client, path, extra, files, held, background)
            if not background:
                pending.result()
            return pending
        except SHARD_LOST:
            if again or not pushed:
                raise
    raise AssertionError("unreachable")


class PendingSave:
    """A checkpoint whose files are being written: :meth:`result` waits for them, writes
    the manifest and commits (once); :meth:`discard` gives it up."""

    def __init__(
        self,
        client: SavingClient,
        path: str,
        tmp: str,
        extra: Mapping[str, Any] | None,
        refs: list[ray.ObjectRef[dict[str, Any]]],
        held: HeldWriter | None,
        held_done: Callable[[], Mapping[str, Any]] | None,
    ) -> None:
        self.path, self.tmp = path, tmp
        self._client, self._extra = client, extra
        self._refs, self._held, self._held_done = refs, held, held_done
        self._state = "writing"  # then "committed" or "failed"

    def result(self) -> None:
        """Wait for every file, write the manifest and commit; the first error of a writer
        (the temporary removed, the previous checkpoint untouched)."""
        if self._state == "committed":
            return
        if self._state == "failed":
            raise RuntimeError(f"the checkpoint being written to {self.path} failed already")
        try:
            self._commit()
        except BaseException:
            self.discard()
            raise
        self._state = "committed"

    def _commit(self) -> None:
        c, held = self._client, self._held
        infos = _get(self._refs)
        more: dict[str, Any] = {}
        if held is not None and self._held_done is not None:
            more = {
                "files": dict(self._held_done()),
                "table_shards": {t.name: held.owners for t in held.tables},
            }
        manifest = checkpoint.build_manifest(
            [*c.specs.values(), *(held.tables if held is not None else ())],
            c.num_shards,
            c.partitioner,
            [*infos, {"files": more.get("files", {})}] if more else infos,
            self._extra,
            staleness=c.options.shard.staleness,
            num_workers=c.num_workers,
            **({"table_shards": more["table_shards"]} if more else {}),
        )
        if more:
            manifest["shards"].pop()  # (the held files' entry, not a shard)
        checkpoint.write_manifest(self.tmp, manifest)
        checkpoint.commit_dir(self.tmp, self.path)

    def discard(self) -> None:
        """Give the save up: wait for the shards still writing into the temporary (bounded by
        the request timeout: a hung shard cannot hold this back), then remove it."""
        if self._state == "committed":
            return
        self._state = "failed"
        _discard(self.tmp, self._refs, self._client.options.shard.timeout_s)


def start_save(
    client: SavingClient,
    path: str,
    extra: Mapping[str, Any] | None = None,
    files: Mapping[str, bytes] | None = None,
    held: HeldWriter | None = None,
    background: bool = False,
) -> PendingSave:
    """Start the checkpoint of :meth:`PSClient.save` (its arguments) after the client's
    pushes are applied; with ``background`` the shards and ``held``'s owners have copied their
    rows when this returns and write them meanwhile. A ``path`` that is a file or a directory
    of other files is refused (CheckpointError) before anything is written."""
    # Build the manifest once before writing anything, so a non-JSON extra fails early.
    checkpoint.build_manifest([], 0, "", [], extra)
    client.flush()
    tmp = checkpoint.new_tmp_dir(path)  # refuses a path angelps must not replace
    token, timeout_s = client.options.shard.token, client.options.shard.timeout_s
    refs: list[ray.ObjectRef[Any]] = []
    try:
        refs = [h.save.remote(tmp, secret=token, background=background) for h in client.handles]
        if background:
            try:
                _get(refs)  # every shard has its copy: the next steps may change the rows
            finally:
                # (also when a shard failed to start: the others' writes are waited for
                # before the temporary is removed)
                refs = [h.saved.remote(secret=token) for h in client.handles]
        for name, data in (files or {}).items():
            write_durably(fs.join(tmp, os.path.basename(name)), data)
        held_done = held.start(tmp, background) if held is not None else None
    except BaseException:
        # The shards may still be writing into tmp (the caller's own file failed first, on
        # a full disk say): wait for them, or they would re-create it once it is removed.
        _discard(tmp, refs, timeout_s)
        raise
    return PendingSave(client, path, tmp, extra, refs, held, held_done)


def _get(refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
    try:
        return ray.get(list(refs))  # type: ignore[no-any-return]
    except RayTaskError as e:
        raise remote_error(e) from None


def _discard(tmp: str, refs: Sequence[ray.ObjectRef[Any]], timeout_s: float) -> None:
    if refs:
        ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    store_for(tmp).discard(tmp)
