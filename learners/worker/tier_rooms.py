"""A worker's device tiers' room and placement over their books (learners/worker/device_tier.py),
as one worker's update thread (learners/worker/held_tables.py) and several workers' prefetch
(learners/worker/tier_routes.py) run them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from torch import Tensor

from learners.worker.device_tier import TierBook

__all__ = ["fill", "make_room"]


def make_room(
    books: Sequence[TierBook],
    place: bool = False,
    staged: bool = False,
    put: bool = True,
    soon: Mapping[str, np.ndarray | Tensor] | None = None,
) -> None:
    """Free the slots of the device tiers' prefetched misses (the update in progress was
    applied); with ``place``, place the misses there as they come (one worker's update
    thread: the next read then finds its rows held, or, ``staged``, reads meanwhile); without
    ``put``, only index them there (:func:`fill` puts their rows). ``soon``: the request of
    the read after the next one, whose rows held are evicted last."""
    for b in books:
        b.make_room(None if soon is None else b.ids_in(soon))
    if place:
        for b in books:
            if put:
                b.place_ahead(staged)
            else:
                b.index_ahead(staged)


def fill(books: Sequence[TierBook]) -> None:
    """Put the rows of the misses :func:`make_room` indexed without them, as they come."""
    for b in books:
        b.fill()
