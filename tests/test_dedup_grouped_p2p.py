"""A grouped send/recv under rank deduplication runs on the communicator its mirrors really use.

`phantora run --phantom` on 2 hosts of 8 keeps 8 live ranks, each standing for itself and the rank 8 above
(`collectives/mirrors.py`). A ring of `batch_isend_irecv` on the world group sends 7 -> 8 live and, as its mirror,
15 -> 0. Both run on the 16-rank world communicator, so NCCL puts them on that communicator's p2p channels (init.cc
`ncclP2pSchedule`, channel.h `ncclP2pChannelBaseForRound`, v2.30.7-1): rank 7 sends to rank 8 in round 9 (its own
node's 8 rounds first, then node 1 from local rank 7: 15, 8, ...) and rank 15 to rank 0 in round 9 as well; round 9
is in the second batch of 8 rounds, whose base is 1 bit-reversed over log2(16) bits = 8 on 16 p2p channels, so
each transfer's 4 parts run on channels 8-11 (both hops of its PXN relay through GPU 0 of the sender's host, since
7 -> 8 and 15 -> 0 cross rails). Before, the copies ran on their pairs' own 2-rank communicators
(channels 0-3): other channels, so other ECMP paths and queue pairs than nccl-tests' and than the same run without
deduplication (64 MiB on rail-optimised 2 x 8 H100s: 4056.93 against 5399.11 us).
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.topology.generators import rail_optimized

MiB = 1 << 20


def _channels(flows: list, src: int, dst: int) -> list[int]:
    """The NCCL channels of a transfer's flows: their ECMP keys' channel field (`dag.ecmp_key`, one per queue pair)."""
    return sorted((f.key >> 48) & 0xFF for f in flows if (f.src, f.dst) == (src, dst))


def _plan(live: int, group: tuple[int, int], comm: tuple[int, ...]) -> list:
    topo = rail_optimized(2, 8, gpu="h100")
    planner = CollectivePlanner(topo, AlgoOptions(), Mirrors(16, live))
    return planner.plan(CallSpec("send_recv", group, 64 * MiB, "fp32", comm=comm), "sr").flows


def test_a_mirrored_pair_runs_on_the_world_communicators_channels() -> None:
    """Both sends cross rails, so each is relayed (PXN, nccl/pxn.py `comm_relay`) through the world communicator's
    GPU 0 of its own host: 7 -> 0 -> 8 and 15 -> 8 -> 0, both hops on channels 8-11."""
    world = tuple(range(16))
    flows = _plan(8, (7, 8), world)
    assert _channels(flows, 7, 0) == _channels(flows, 0, 8) == [8, 9, 10, 11]
    assert _channels(flows, 15, 8) == _channels(flows, 8, 0) == [8, 9, 10, 11]
    undeduplicated = _plan(16, (15, 0), world)
    mirrored = [(f.src, f.dst, f.key, f.conn) for f in flows if (f.src, f.dst) in ((15, 8), (8, 0))]
    assert sorted(mirrored) == sorted((f.src, f.dst, f.key, f.conn) for f in undeduplicated)


def test_a_mirrored_pair_on_a_host_group_runs_on_the_shifted_group() -> None:
    """A ring inside host 0's group (ranks 0-7): its mirror is host 1's group (8-15), a communicator of its own whose
    rounds are those of one node: rank 3 -> 4 is round 1, base 1 reversed over 4 bits = 8 on 16 channels."""
    flows = _plan(8, (3, 4), tuple(range(8)))
    alone = _plan(16, (11, 12), tuple(range(8, 16)))
    assert _channels(flows, 11, 12) == _channels(alone, 11, 12)
    assert [(f.key, f.conn) for f in flows if f.src == 11] == [(f.key, f.conn) for f in alone]


def test_mirrors_copy_a_communicator_onto_itself_or_its_shift() -> None:
    m = Mirrors(16, 8)
    world, host0 = tuple(range(16)), tuple(range(8))
    assert m.copy_comm((7, 8), (15, 0), world) == world
    assert m.copy_comm((3, 4), (11, 12), host0) == tuple(range(8, 16))
    with pytest.raises(ValueError, match="no shift"):
        m.copy_comm((3, 4), (5, 6), host0)
