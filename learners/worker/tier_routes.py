"""Several workers' device tiers (learners/worker/held_tables.py): each next read's ids routed
to their owners ahead of it, so that every owner prefetches the misses of the ids it will
serve; and, where the batch after it was peeked at, that read's ids too, so that the room an
owner makes for the next read keeps its rows of the read after last, as one worker's room
does (learners/worker/tier_evict.py). The read after's route is made a step early and reused
by the next prefetch: a step still routes once (twice only where nothing was routed ahead, at
an epoch's start or after a read outside training). Routing moves ids only, not rows, so the
rows trained are the same whichever rows a room keeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from learners.worker.device_tier import TierBook, make_room
from learners.worker.table_exchange import Exchange, HeldTable
from learners.worker.tier_slots import ids_of

__all__ = ["ROUTE_AFTER", "Routed", "prefetch_routed"]

#: Whether several workers route the read after the next one with it (tests compare both).
ROUTE_AFTER = True

#: A read routed ahead of its prefetch: its request, and the ids this worker serves in it by
#: group of tables routed alike.
Routed = tuple[Mapping[str, Any], dict[tuple[str, ...], np.ndarray]]


def prefetch_routed(
    exchange: Exchange,
    groups: Sequence[Sequence[str]],
    tables: Mapping[str, HeldTable],
    books: Sequence[TierBook],
    req: Mapping[str, Any],
    after: Mapping[str, Any] | None,
    routed: Routed | None,
) -> tuple[Routed | None, int]:
    """Route the next read ``req`` (its tables in ``groups``, in the same order on every
    worker: each route is a collective) unless ``routed`` holds its route, prefetch the misses
    of the ids this worker serves, and make room for them; with ``after`` (the batch after,
    peeked at alike on every worker) route that read too, and evict its rows held last. The
    read after's route (for the next call) and the bytes sent."""
    known = routed[1] if routed is not None and routed[0] is req else {}
    served: dict[tuple[str, ...], np.ndarray] = {}
    sent = 0
    for group in groups:
        alike = [b for b in books if any(n in b.tables for n in group)]
        if not alike:  # (the same tables on every worker)
            continue
        key = tuple(group)
        routes = [tables[n] for n in group]
        serve = known.get(key)
        if serve is None:
            serve, moved = exchange.route_ahead(ids_of(req[group[0]]), routes)
            sent += moved
        soon = None
        if after is not None and ROUTE_AFTER and group[0] in after:
            soon, moved = exchange.route_ahead(ids_of(after[group[0]]), routes, after=True)
            sent += moved
            served[key] = soon
        for b in alike:
            b.prefetch(serve)
        # (the update was applied: apply waits)
        make_room(alike, soon=None if soon is None else dict.fromkeys(group, soon))
    return ((after, served) if after is not None and served else None), sent
