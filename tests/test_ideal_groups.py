"""A group of collectives (a coalesced call, a device block) under the ideal model (`model="ideal"`: line rate, no
protocol, no NCCL latency or plan). With no NCCL plan to follow, each (kind, reduction, root)'s calls run as one
collective of their bytes, all started together, so the group ends when its busiest link has carried every call's
bytes at line rate: what the ideal model promises for any traffic. Closed forms on a star of n hosts, links of B
bits/s and L ns (a path is two links), as tests/test_collectives_timing.py."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.netsim.flow import FlowSimulator
from tests import stars

B = 100 * 10**9
BYTES_PER_NS = B / 8e9
L = 1000
MiB = 1 << 20
N = 8
RANKS = tuple(range(N))
IDEAL = AlgoOptions(model="ideal")


def _end_ns(coll: Collective) -> int:
    topo = stars.star(N, B, L, tier=1, switch_first=True)
    dag = decompose(coll, topo, IDEAL)
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain())


def test_calls_of_one_kind_run_as_one_collective_of_their_bytes():
    """A coalesced call of 1 MiB + 3 MiB all-reduces: one ring of 4 MiB, each uplink carrying 2(n - 1)/n of it."""
    sizes = (MiB, 3 * MiB)
    end = _end_ns(Collective("all_reduce", RANKS, sum(sizes), "fp32", group_sizes=sizes))
    assert end == pytest.approx(2 * (N - 1) / N * sum(sizes) / BYTES_PER_NS + 2 * L, rel=0.01)


def test_calls_of_several_kinds_share_the_links_at_line_rate():
    """A 4 MiB all-reduce (ring: 2(n - 1)/n x 4 MiB on every uplink) and a 4 MiB broadcast from rank 0 (chain: 4 MiB
    on every uplink but the last hop's) started together: the busiest uplink carries both, so the group ends at
    (2(n - 1)/n + 1) x 4 MiB at line rate, not at the larger of the two (the all-reduce alone) nor at their sum of
    path latencies."""
    s = 4 * MiB
    group = Collective(
        "all_reduce",
        RANKS,
        2 * s,
        "fp32",
        group_sizes=(s, s),
        group_kinds=("all_reduce", "broadcast"),
        group_roots=(None, 0),
    )
    end = _end_ns(group)
    assert end == pytest.approx((2 * (N - 1) / N + 1) * s / BYTES_PER_NS + 2 * L, rel=0.01)
    assert end > _end_ns(Collective("all_reduce", RANKS, s, "fp32")) * 1.3
