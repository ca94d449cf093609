"""A ring reduce sends along the ring toward its root, as NCCL's does.

NVIDIA/nccl src/device/reduce.h `runRing` (v2.26.2-1, the same in v2.30.7-1): every rank receives from ring->prev
and sends to ring->next; the rank whose ring predecessor is the root (`prevRank == root`) only sends, the root only
receives. So on the ring 0 -> 1 -> 2 -> 3 the reduce to root r runs r+1 -> r+2 -> r+3 -> r (mod 4): each hop carries
the whole buffer once, in the ring's direction (a broadcast from r runs r -> r+1 -> r+2 -> r+3 the same way).
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import rail_optimized

MiB = 1 << 20
HOSTS = 4


def _chain(kind: str, root: int, granularity: str = "coarse") -> list:
    topo = rail_optimized(HOSTS, 1, 1)
    coll = Collective(kind, tuple(range(HOSTS)), 8 * MiB, "fp32", root=root)
    opts = AlgoOptions(nccl_env=nccl_env({}), algorithm="chain", granularity=granularity)
    dag = decompose(coll, topo, opts)
    assert (dag.choice or {}).get("algorithm") == "Ring"
    return [f for f in dag.flows if f.size and not is_credit(f)]  # the steps, not the clear-to-sends going back


@pytest.mark.parametrize("granularity", ["coarse", "chunked"])
@pytest.mark.parametrize("root", range(HOSTS))
def test_a_reduce_runs_the_ring_from_the_roots_successor_to_the_root(root: int, granularity: str) -> None:
    """The hops are (r+1, r+2), (r+2, r+3), (r+3, r), each carrying the 8 MiB buffer once (summed over channels)."""
    flows = _chain("reduce", root, granularity)
    want = {((root + k) % HOSTS, (root + k + 1) % HOSTS) for k in range(1, HOSTS)}
    sent: dict[tuple[int, int], int] = {}
    for f in flows:
        sent[f.src, f.dst] = sent.get((f.src, f.dst), 0) + f.size
    assert set(sent) == want
    assert all(v == 8 * MiB for v in sent.values())


@pytest.mark.parametrize("root", [0, 2])
def test_a_reduce_step_waits_for_its_predecessors_step(root: int) -> None:
    """Chunk by chunk: the root's successor's first message waits for no step; the next rank's first message waits
    for it (recvReduceSend), and the root sends nothing."""
    flows = _chain("reduce", root, "chunked")
    by_id = {f.id: f for f in flows}
    first = (root + 1) % HOSTS
    assert not any(f.src == root for f in flows)
    starts = [f for f in flows if not any(d in by_id for d in f.deps)]
    assert {f.src for f in starts} == {first}
    second = min((f for f in flows if f.src == (first + 1) % HOSTS), key=lambda f: f.id)
    assert any(by_id[d].src == first and by_id[d].dst == second.src for d in second.deps if d in by_id)


def test_a_broadcast_runs_the_same_direction_from_the_root() -> None:
    flows = _chain("broadcast", 1)
    assert {(f.src, f.dst) for f in flows} == {(1, 2), (2, 3), (3, 0)}
