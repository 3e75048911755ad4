"""Several workers' device tiers (learners/worker/held_tables.py): each next read's ids routed
to their owners ahead of it, so that every owner prefetches the misses of the ids it will
serve; and, where the batch after it was peeked at, that read's ids too, so that the room an
owner makes for the next read keeps its rows of the read after last, as one worker's room
does (learners/worker/tier_evict.py). The read after's route is made a step early and reused
by the next prefetch: a step still routes once (twice only where nothing was routed ahead, at
an epoch's start or after a read outside training). Knowing those ids a step early, each owner
also asks the shards for that read's misses then (:data:`ASK_AFTER`: two swaps in flight, as
one worker's update thread does): once the room for the next read is made and its misses,
asked for a step before, are placed. The next read then finds its rows held, and a swap has a
whole step to come back instead of the time between a prefetch and the read after it. Routing
moves ids only, and the rows asked for are rows the update in progress does not hold, so the
rows trained are the same whichever rows a room keeps or when they come."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from learners.worker.device_tier import TierBook
from learners.worker.table_exchange import Exchange, HeldTable
from learners.worker.tier_rooms import make_room
from learners.worker.tier_slots import ids_of

__all__ = ["ASK_AFTER", "ROUTE_AFTER", "Routed", "prefetch_routed"]

#: Whether several workers route the read after the next one with it (tests compare both).
ROUTE_AFTER = True
#: Whether they also ask the shards for its misses then (two swaps in flight).
ASK_AFTER = True

#: A read routed ahead of its prefetch: its request, the ids this worker serves in it by group
#: of tables routed alike, and whether its misses were asked for.
Routed = tuple[Mapping[str, Any], dict[tuple[str, ...], np.ndarray], bool]


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
    of the ids this worker serves unless they were asked for, and make room for them; with
    ``after`` (the batch after, peeked at alike on every worker) route that read too, evict
    its rows held last, place the next read's misses and ask for the read after's. The read
    after's route (for the next call) and the bytes sent. The update in progress was applied
    (apply waits), so its rows may go."""
    known, asked = ({}, False) if routed is None or routed[0] is not req else routed[1:]
    served: dict[tuple[str, ...], np.ndarray] = {}
    sent = 0
    ask = after is not None and ROUTE_AFTER and ASK_AFTER
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
        if not (asked and key in known):
            for b in alike:
                b.prefetch(serve)
        if soon is None or not ask:
            make_room(alike, soon=None if soon is None else dict.fromkeys(group, soon))
            continue
        for b in alike:
            # Room for the next read's misses (its rows of the read after last), those misses
            # placed as they come (asked for a step ago, or just now), then the read after's
            # asked for: its rows held now pinned at its clock, the next read's among them.
            b.make_room(b.ids_in(dict.fromkeys(group, soon)))
            b.index_ahead()
            b.fill(timed=True)
            b.prefetch(soon, b.clock + 1, stage=False)
    return ((after, served, ask) if after is not None and served else None), sent
