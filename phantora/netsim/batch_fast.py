"""`plain_batch`: the usual batch passes `check_flow_batch` in whole-list passes, with no Python step a flow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from phantora.netsim.base import Flow

_ID, _SRC, _DST, _DEPS = attrgetter("id"), attrgetter("src"), attrgetter("dst"), attrgetter("deps")
_SIZE, _DELAY, _RATE = attrgetter("size"), attrgetter("delay_ns"), attrgetter("rate_bps")
_CONN, _QUEUE = attrgetter("conn"), attrgetter("queue")
WIDE = 1 << 64  # conn and queue are 64-bit ids


def plain_batch(flows: Sequence[Flow], ends: frozenset[int], known: Callable[[int], bool]) -> set[int] | None:
    """The batch's ids if it passes every check of `check_flow_batch` as the usual batch does: ids new and unique,
    every dep on an earlier flow of the batch or a known flow (so no cycle), endpoints in `ends`, sizes, delays and
    rate caps >= 0, conn and queue 64-bit ids; None if any of that fails (the caller then checks flow by flow and
    names what is wrong)."""
    n = len(flows)
    ids = list(map(_ID, flows))
    got = set(ids)
    if len(got) != n or any(map(known, ids)):
        return None
    if not (ends.issuperset(map(_SRC, flows)) and ends.issuperset(map(_DST, flows))):
        return None
    if n and min(min(map(_SIZE, flows)), min(map(_DELAY, flows)), min(map(_RATE, flows))) < 0:
        return None
    for field in (_CONN, _QUEUE):
        if n and not (0 <= min(map(field, flows)) and max(map(field, flows)) < WIDE):
            return None
    lists = list(map(_DEPS, flows))
    counts = np.fromiter(map(len, lists), np.int64, n)
    deps = list(chain.from_iterable(lists))
    at = dict(zip(ids, range(n), strict=True))
    where = np.fromiter(map(at.get, deps, repeat(-1)), np.int64, len(deps))  # -1: not in the batch
    owner = np.repeat(np.arange(n), counts)
    inside = where >= 0
    if (where[inside] >= owner[inside]).any():  # a dep on a later flow (or itself): checked flow by flow
        return None
    outside = np.flatnonzero(~inside).tolist()
    if outside and not all(map(known, {deps[i] for i in outside})):
        return None
    return got
