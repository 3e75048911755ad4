"""Every configuration key of the parameter server, and the typed options built from them.

A key module: it imports only the standard library, :mod:`angelconf.config` and the other key
module :mod:`angelps.optimizer_keys` (whose keys it lists), so the CLI's config-only verbs
(``angelps conf``) list these keys without loading numpy, torch or Ray.

Each default is written once, in its :class:`~angelconf.config.Key` declaration below. The rest
of the package never reads a configuration mapping: the entry point builds a :class:`PSOptions`
once (:meth:`PSOptions.from_config`), :mod:`angelps.server.launch` derives the :class:`ShardOptions`
each shard actor receives (a frozen dataclass: it pickles through Ray, and a misspelt field is
an error, not a silent default) and the :class:`ClientOptions` its clients share. Optimizer
hyper-parameters are read by :meth:`angelps.table.OptimizerSpec.from_conf` through
:data:`angelps.optimizer_keys.OPTIMIZER_KEYS`.

:func:`one_of` is the single check of a named choice (partitioner, NaN policy, transport).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from angelconf.config import Config, Key, non_negative
from angelconf.config import load_config as _load_config
from angelconf.options import key_field, keyed, read_keys
from angelps.optimizer_keys import OPTIMIZER_KEYS, OPTIMIZER_NAME_KEYS

__all__ = [
    "KEYS",
    "NAN_POLICIES",
    "PARTITIONERS",
    "TRANSPORTS",
    "ClientOptions",
    "PSOptions",
    "ShardOptions",
    "load_config",
    "one_of",
]

PARTITIONERS = ("hash", "range")
NAN_POLICIES = ("error", "skip")
TRANSPORTS = ("socket", "ray")


def one_of(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` lower-cased when it is one of ``choices``; else a ValueError naming the key."""
    canon = str(value).lower()
    if canon not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return canon


def _positive_int(v: int) -> str | None:
    return None if v >= 1 else "an integer >= 1"


JOB_NAME = Key(
    "angel.job.name",
    "str",
    "angelps",
    "Job name; shard actors are named <angel.job.name>-ps-<i> in the Ray namespace angelps.",
    check=lambda v: None if v and "/" not in v else "a non-empty name without '/'",
)
PS_NUMBER = Key(
    "angel.ps.number", "int", 1, "Number of parameter-shard actors.", check=_positive_int
)
PARTITIONER = Key(
    "angel.ps.partitioner",
    "str",
    "hash",
    "How sparse keys map to shards: hash (mix64(key) mod shards) or range (contiguous key "
    "ranges). Dense tables are always range-partitioned.",
    choices=PARTITIONERS,
)
CPUS = Key(
    "angel.ps.cpus",
    "float",
    0.0,
    "CPUs Ray reserves for each shard actor (0: none reserved, the actor still runs).",
    check=non_negative,
)
MEMORY = Key(
    "angel.ps.memory",
    "int",
    0,
    "Memory Ray reserves for each shard actor, in MiB (0: no reservation).",
    check=non_negative,
)
GPUS = Key(
    "angel.ps.gpus",
    "float",
    0.0,
    "GPUs per shard actor (fractions share a device). 0 keeps the rows in host memory.",
    check=non_negative,
)
BACKUP_INTERVAL = Key(
    "angel.ps.backup.interval",
    "int",
    500,
    "Updates applied by a shard between two backups of its partition, optimizer state and "
    "clocks, so that Ray can restart a dead shard and the job goes on (docs/checkpoints.md: "
    "the default costs under 5% of training time on the example jobs). 0 turns backups off: "
    "a shard that dies then fails the job.",
    check=non_negative,
)
BACKUP_ASYNC = Key(
    "angel.ps.backup.async",
    "bool",
    True,
    "Write a shard's backups in the background: the shard copies its rows (one more copy of "
    "its partition in memory while the backup is written; a copy that would take more than "
    "half of the memory available is not made, that backup is written inline) and goes on "
    "serving the workers. false: the shard writes each backup before it serves the next call "
    "(no copy; training waits for it).",
)
BACKUP_PATH = Key(
    "angel.ps.backup.path",
    "str",
    "",
    "Directory for shard backups, reachable from every shard's node (empty: "
    "<angel.log.path>/ps-backup for angelps train, a private temporary directory for a "
    "PSClient launched alone), or an object-storage URL (s3://, gs://: survives a lost node "
    "without a shared file system; access is the bucket's permissions). Each launch uses its "
    "own subdirectory (mode 0700) or prefix, removed at shutdown.",
)
MAX_ATTEMPTS = Key(
    "angel.ps.max-attempts",
    "int",
    4,
    "Times a shard actor may be started (Ray restarts it up to this minus one times); "
    "used only when backups are on.",
    check=_positive_int,
)
TRANSPORT = Key(
    "angel.ps.transport",
    "str",
    "socket",
    "How workers send their per-step pull/push calls to the shards: socket (a direct TCP "
    "connection to each shard actor, much faster a round trip; see docs/ps.md) or ray (Ray "
    "actor calls). Control calls (save, load, recovery) always use Ray.",
    choices=TRANSPORTS,
)
SHARED_MIB = Key(
    "angel.ps.shared.mib",
    "int",
    64,
    "Most MiB of memory each client process shares with each shard on its own node for the "
    "data plane: the bodies of its step calls and device-tier swaps, and their replies' rows, "
    "skip the socket, which carries only the headers. Sharing starts at a connection's first "
    "call of 64 KiB or more, with 4 MiB, doubling when a call does not fit, up to this. 0: "
    "none. A call that does not fit, a shard on another node, or a full /dev/shm uses the "
    "socket. Needs angel.ps.transport=socket.",
    check=lambda v: None if 0 <= v <= 1024 else "an integer from 0 to 1024 (0: none)",
)
NAN_POLICY = Key(
    "angel.ps.nan.policy",
    "str",
    "error",
    "A push with NaN or inf gradients: error (reject it, naming the table) or skip "
    "(drop that table's update and count it).",
    choices=NAN_POLICIES,
)
STALENESS = Key(
    "angel.staleness",
    "int",
    0,
    "Consistency: 0 = BSP (one update per step on the sum of all workers' gradients), "
    "s > 0 = SSP (a pull at clock c sees every update older than c - s), < 0 = ASP.",
)
MAX_CONNECTIONS = Key(
    "angel.ps.max.connections",
    "int",
    4096,
    "Most data-plane TCP connections a shard keeps open at once (a job needs one per client "
    "process: its workers and driver; two for a worker with a device tier). Connections beyond it are closed at once and counted "
    "in the shard's stats; the shard also never uses more than half of its open-file limit.",
    check=_positive_int,
)
SWAP_THREADS = Key(
    "angel.ps.swap.threads",
    "int",
    0,
    "Threads a shard gives each device tier's swap, which runs beside its event loop (its key "
    "lookups, gathers and scatters of whole rows, cut into parts run at once): 0 = a quarter of "
    "the shard's node's cores, 1 to 4; 1 = the swap's own thread alone.",
    check=lambda v: None if v >= 0 else "an integer >= 0 (0: from the node's cores)",
)
TOKEN_TIMEOUT_MS = Key(
    "angel.ps.token.timeout.ms",
    "int",
    5000,
    "How long a new data-plane connection may take to send the job's token; one that sends "
    "nothing, or too little, is closed after it (the shard keeps serving the others).",
    check=lambda v: None if v > 0 else "an integer > 0",
)
TIMEOUT_MS = Key(
    "angel.matrixtransfer.request.timeout.ms",
    "int",
    120000,
    "How long a shard lets a pull or push wait for other workers' clocks (BSP/SSP) before "
    "failing with an error naming the clocks.",
    check=lambda v: None if v > 0 else "an integer > 0",
)

ADMISSION_MIN_COUNT = Key(
    "angel.ps.admission.min.count",
    "int",
    0,
    "Feature admission of sparse tables: a key gets a row only in the update that sees it "
    "for the N-th time (its pushes counted once per update); before that its pull returns "
    "the initial value and its gradient is dropped and counted. 0 or 1: off (a row at the "
    "first pull or push).",
    check=non_negative,
)
EVICTION_TTL_UPDATES = Key(
    "angel.ps.eviction.ttl.updates",
    "int",
    0,
    "Expiry of sparse rows: at every checkpoint (and backup) a shard removes the rows of a "
    "table not updated in its last T updates; a removed key starts again as a new row. "
    "0: off.",
    check=non_negative,
)

KEYS = [
    JOB_NAME,
    PS_NUMBER,
    PARTITIONER,
    CPUS,
    MEMORY,
    GPUS,
    BACKUP_INTERVAL,
    BACKUP_ASYNC,
    BACKUP_PATH,
    MAX_ATTEMPTS,
    TRANSPORT,
    SHARED_MIB,
    MAX_CONNECTIONS,
    SWAP_THREADS,
    TOKEN_TIMEOUT_MS,
    NAN_POLICY,
    STALENESS,
    TIMEOUT_MS,
    ADMISSION_MIN_COUNT,
    EVICTION_TTL_UPDATES,
    *OPTIMIZER_NAME_KEYS,
    *OPTIMIZER_KEYS.values(),
]


def load_config(
    path: str | os.PathLike[str] | None = None,
    sets: Sequence[str] | Mapping[str, Any] = (),
    keys: Sequence[Key] | None = None,
) -> Config:
    """The parameter server's configuration (``from angelps import load_config``): defaults <
    the ``.properties`` file ``path`` < ``sets``, typed and checked against ``keys``, by
    default the PS's own (:data:`KEYS`: ``angel.ps.*``, the optimizers' ``ml.*`` keys). A
    whole job's keys are ``learners.keys.all_keys()``."""
    listing = (
        "the parameter server's keys are angelps.options.KEYS (a job's: pass "
        "keys=learners.keys.all_keys(); `angelps conf --keys` lists them)"
        if keys is None
        else ""
    )
    return _load_config(path, sets, KEYS if keys is None else keys, listing=listing)


def _check_storage(min_count: int, ttl: int) -> None:
    """Admission and expiry: whole numbers >= 0 (a ValueError naming the key)."""
    for key, value in ((ADMISSION_MIN_COUNT, min_count), (EVICTION_TTL_UPDATES, ttl)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            bad = f"{key.name}={value!r} is not valid"
            raise ValueError(f"{bad}: expected an integer >= 0 (0: off)")


def _check_swap_threads(threads: int) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(
            f"{SWAP_THREADS.name}={threads!r} is not valid: expected an integer >= 0 "
            "(0: from the node's cores)"
        )


@dataclass(frozen=True)
class PSOptions:
    """How to run the parameter server of one job (everything ``angel.ps.*`` and the
    consistency keys say); built once at the entry point with :meth:`from_config`."""

    job: str = field(metadata=keyed(JOB_NAME))
    num_shards: int = field(metadata=keyed(PS_NUMBER))
    partitioner: str = field(metadata=keyed(PARTITIONER))
    cpus: float = field(metadata=keyed(CPUS))
    memory_mib: int = field(metadata=keyed(MEMORY))
    gpus: float = field(metadata=keyed(GPUS))
    backup_interval: int = field(metadata=keyed(BACKUP_INTERVAL))
    backup_async: bool = field(metadata=keyed(BACKUP_ASYNC))
    backup_path: str = field(metadata=keyed(BACKUP_PATH))
    max_attempts: int = field(metadata=keyed(MAX_ATTEMPTS))
    transport: str = field(metadata=keyed(TRANSPORT))
    nan_policy: str = field(metadata=keyed(NAN_POLICY))
    staleness: int = field(metadata=keyed(STALENESS))
    timeout_ms: int = field(metadata=keyed(TIMEOUT_MS))
    max_connections: int = field(metadata=keyed(MAX_CONNECTIONS))
    token_timeout_ms: int = field(metadata=keyed(TOKEN_TIMEOUT_MS))
    swap_threads: int = key_field(SWAP_THREADS)
    admission_min_count: int = key_field(ADMISSION_MIN_COUNT)
    eviction_ttl_updates: int = key_field(EVICTION_TTL_UPDATES)
    shared_mib: int = key_field(SHARED_MIB)

    def __post_init__(self) -> None:
        # Checked here in the words the shards' own options use (a plain mapping is not
        # checked by the keys: read_keys(check=False)), so a direct construction fails alike.
        _check_storage(self.admission_min_count, self.eviction_ttl_updates)
        if not self.job or "/" in self.job:
            raise ValueError(f"angel.job.name={self.job!r} must be a non-empty name without '/'")
        if self.num_shards < 1:
            raise ValueError(f"angel.ps.number={self.num_shards} must be >= 1")
        if self.max_connections < 1:
            raise ValueError(f"angel.ps.max.connections={self.max_connections} must be >= 1")
        if self.token_timeout_ms < 1:
            raise ValueError(f"angel.ps.token.timeout.ms={self.token_timeout_ms} must be > 0")
        _check_swap_threads(self.swap_threads)
        why = SHARED_MIB.check(self.shared_mib) if SHARED_MIB.check else None
        if isinstance(self.shared_mib, bool) or not isinstance(self.shared_mib, int) or why:
            raise ValueError(
                f"{SHARED_MIB.name}={self.shared_mib!r} is not valid: expected an integer "
                "from 0 to 1024 (0: no shared memory)"
            )
        object.__setattr__(
            self, "partitioner", one_of(PARTITIONER.name, self.partitioner, PARTITIONERS)
        )
        object.__setattr__(
            self, "nan_policy", one_of(NAN_POLICY.name, self.nan_policy, NAN_POLICIES)
        )
        object.__setattr__(self, "transport", one_of(TRANSPORT.name, self.transport, TRANSPORTS))

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> PSOptions:
        """From a :class:`~angelconf.config.Config` or a plain mapping of typed values; keys
        absent (or None) take their declared defaults."""
        return cls(**read_keys(cls, conf, check=False))

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000.0


@dataclass(frozen=True)
class ShardOptions:
    """Exactly what one shard actor of a launched job needs besides its id and the tables.

    ``backup_dir``: this launch's backup directory ("" with backups off); ``token``: the
    data-plane password (angelps.client.wire; "" accepts no TCP clients); ``max_connections``,
    ``token_timeout_ms``: the data plane's connection cap and token deadline; ``device``: None
    keeps the rows in host numpy arrays, a torch device ("cuda") keeps them there as tensors;
    ``backup_async``: backups written from a copy in the background (``angel.ps.backup.async``).
    """

    num_workers: int
    partitioner: str
    staleness: int
    nan_policy: str
    timeout_ms: int
    backup_interval: int
    backup_dir: str
    token: str
    max_connections: int
    token_timeout_ms: int
    device: str | None
    admission_min_count: int = ADMISSION_MIN_COUNT.default
    eviction_ttl_updates: int = EVICTION_TTL_UPDATES.default
    backup_async: bool = BACKUP_ASYNC.default
    swap_threads: int = SWAP_THREADS.default

    def __post_init__(self) -> None:
        _check_storage(self.admission_min_count, self.eviction_ttl_updates)
        _check_swap_threads(self.swap_threads)
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        object.__setattr__(
            self, "partitioner", one_of(PARTITIONER.name, self.partitioner, PARTITIONERS)
        )
        object.__setattr__(
            self, "nan_policy", one_of(NAN_POLICY.name, self.nan_policy, NAN_POLICIES)
        )

    @classmethod
    def of(
        cls,
        ps: PSOptions,
        num_workers: int,
        *,
        backup_dir: str = "",
        token: str = "",
        device: str | None = None,
    ) -> ShardOptions:
        """A shard's options within the job ``ps``; backups run only with a ``backup_dir``."""
        return cls(
            num_workers=num_workers,
            partitioner=ps.partitioner,
            staleness=ps.staleness,
            nan_policy=ps.nan_policy,
            timeout_ms=ps.timeout_ms,
            backup_interval=ps.backup_interval if backup_dir else 0,
            backup_dir=backup_dir,
            token=token,
            max_connections=ps.max_connections,
            token_timeout_ms=ps.token_timeout_ms,
            device=device,
            admission_min_count=ps.admission_min_count,
            eviction_ttl_updates=ps.eviction_ttl_updates,
            backup_async=ps.backup_async,
            swap_threads=ps.swap_threads,
        )

    @classmethod
    def from_config(
        cls, conf: Mapping[str, Any], num_workers: int = 1, token: str = ""
    ) -> ShardOptions:
        """Options of a shard outside a launch (a test, a local server): no backups, rows in
        host memory."""
        return cls.of(PSOptions.from_config(conf), num_workers, token=token)

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000.0

    @property
    def token_timeout_s(self) -> float:
        return self.token_timeout_ms / 1000.0


@dataclass(frozen=True)
class ClientOptions:
    """What every client of a launched job shares: the shards' options, and how to reach them
    (``transport``; ``data_host``: the address shards listen on, "" for their node's)."""

    shard: ShardOptions
    transport: str
    data_host: str
    #: Bytes of the segment shared with each shard on this node (``angel.ps.shared.mib``).
    shared_bytes: int = SHARED_MIB.default << 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "transport", one_of(TRANSPORT.name, self.transport, TRANSPORTS))
