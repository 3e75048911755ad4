"""What crosses between a client and a shard per step: :class:`StepCall` and :class:`StepResult`.

One ``step`` call per shard per step carries a worker's push (its gradients for one clock) and
its pull (the rows it needs next), or either alone. The same two objects travel both paths: as
the argument and result of the shard actor's ``step`` (Ray pickles them) and as the frames of
the TCP data plane (:func:`angelps.client.wire.encode_request` writes a JSON header and the raw
numpy bytes, no pickle). The client's replay log (:mod:`angelps.client.recovery`) keeps the
calls it may have to send again.

Invariant: :attr:`StepCall.checked` is set only by the client that validated the call
(:mod:`angelps.push_checks`: keys int64, in range, owned by the shard they go to, unique and
increasing; gradients ``[n, cols]`` of the table's dtype and finite; the step a finite number
>= 0 or step rates); the wire does not carry it, so a call decoded from the network is
always checked by the shard.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from angelps.rates import Step

__all__ = ["Pulls", "Pushes", "StepCall", "StepResult"]

#: One call's pushes: per table, (keys, gradients).
Pushes: TypeAlias = dict[str, tuple[np.ndarray, np.ndarray]]
#: One call's pulls: per table, the keys (None: this shard's whole block of a dense table).
Pulls: TypeAlias = dict[str, np.ndarray | None]


@dataclass(frozen=True, slots=True)
class StepCall:
    """One worker's ``step`` call to one shard: push (if ``pushes`` is not None: the worker's
    step ``clock``, even with no table in it), then pull (if ``pulls``)."""

    worker: int
    #: the worker's clock of the push (of the pull, for a pull alone)
    clock: int
    pushes: Pushes | None = None
    #: the push's step size, or its per-table rates and momentum (:mod:`angelps.rates`)
    step: Step = 0.0
    pulls: Pulls | None = None
    #: sent by a client that knows the shard restarted (a replayed push, a redone pull)
    recovering: bool = False
    #: a prefetch: the later clock the pull is for (None: the clock after the push)
    pull_clock: int | None = None
    #: validated by the client (see the module docstring); never read from the wire
    checked: bool = False

    def replayed(self) -> StepCall:
        """This call's push as recovery sends it again: no pull, marked recovering."""
        return dataclasses.replace(self, pulls=None, pull_clock=None, recovering=True)


@dataclass(frozen=True, slots=True)
class StepResult:
    """A shard's answer to a :class:`StepCall`."""

    #: the pulled rows per table (None: the call had no pull)
    rows: dict[str, np.ndarray] | None
    #: this worker's clock held by the shard's latest backup (the client trims its log to it)
    backed_up: int
    #: the shard's process id (a device tier's swap: a tier that sees it change knows the
    #: shard restarted from a backup that may predate its write-backs)
    pid: int | None = None
    #: the clock of this worker that the shard's backup held when Ray restarted it, on the
    #: first push the shard took after that restart with nothing to replay (the backup held
    #: every push before it): the client says the shard died, as it does after a replay
    restored: int | None = None
