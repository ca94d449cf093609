"""Flows held until their outstanding deps arrive, one bookkeeping for the two places that hold them: the hybrid
(`hybrid.FluidNvlinkSimulator`: a flow waiting on the other side's unfinished flow) and the fluid side split by host
(`fluid_shards.ShardedFluid`: a flow waiting on another shard's). `Held` maps a held flow's id to (flow, submit ns,
where it goes: a side or a shard, deps still outstanding); the waiters map a dep to the held flows waiting on it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias, TypeVar

from phantora.netsim.base import Flow

Held: TypeAlias = dict[int, tuple[Flow, int, int, int]]
Waiters: TypeAlias = dict[int, list[int]]
K = TypeVar("K")
V = TypeVar("V")


def hold(held: Held, waiters: Waiters, f: Flow, at: int, where: int, on: Sequence[int]) -> None:
    """Hold `f` (submitted at `at`, bound for `where`) until each dep of `on` (distinct, not done) arrives."""
    for d in on:
        add_to(waiters, d, f.id)
    held[f.id] = (f, at, where, len(on))


def one_nearer(held: Held, j: int) -> tuple[Flow, int, int, int] | None:
    """Held flow `j` one dep nearer: its entry, taken out of `held`, if that dep was its last; else None."""
    entry = held[j]
    if entry[3] > 1:
        held[j] = (entry[0], entry[1], entry[2], entry[3] - 1)
        return None
    del held[j]
    return entry


def add_to(groups: dict[K, list[V]], key: K, item: V) -> None:
    """`item` into the group of `key` (flows by their submit ns, or by shard, as they are released or placed)."""
    group = groups.get(key)
    if group is None:
        groups[key] = [item]
    else:
        group.append(item)
