"""The NCCL nodes a grouped send/recv's round schedule walks (`nccl.comm_hosts`) are NCCL's nodes, not hosts.

NVIDIA/nccl init.cc (v2.19.4-1 .. v2.30.7-1): `comm->nNodes` and `rankToNode` count one node per ring first rank
(`topoRanks.ringRecv[0]`), the ranks left in one rank's trimmed system (paths.cc `ncclTopoTrimSystem`: the GPUs
joined below PATH_NET), not one per hostHash, and the p2p schedule ("Build p2p schedule") walks those nodes. With
NCCL_P2P_DISABLE=1 on 400G NICs the cross-socket pairs of an H100 host run NET (`ncclTopoCheckNet`: 48 > 22), so
each socket is a node of 4, and SHM (shm.cc: the same hostHash and no NET) joins only a socket's GPUs; with
NCCL_NET_DISABLE_INTRA=1, or P2P on, the host is one node of 8. On the schedule p2p_schedule.py restates (groups
of gcd(8, node ranks), group deltas (x*x + x)/2 mod pow2Up(groups)) rank 0 sends in rounds 8-11 to group delta 3,
ranks 12-15, where its nodes are 4 sockets (groups of 4), and to host 1, ranks 8-11, where they are 2 hosts.
"""

from __future__ import annotations

import pytest

from phantora.collectives.nccl import comm_hosts
from phantora.collectives.nccl.p2p_schedule import send_rounds
from phantora.collectives.nccl.settings import settings_from_env
from phantora.topology import rail_optimized

N = 8
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}
INTRA_OFF = {"NCCL_P2P_DISABLE": "1", "NCCL_NET_DISABLE_INTRA": "1"}


@pytest.mark.parametrize(
    ("env", "per_node", "later_peers"),
    [(P2P_OFF, 4, (12, 13, 14, 15)), (INTRA_OFF, 8, (8, 9, 10, 11)), ({}, 8, (8, 9, 10, 11))],
)
def test_the_p2p_schedule_walks_nccls_nodes(env: dict[str, str], per_node: int, later_peers: tuple) -> None:
    topo = rail_optimized(2, N, 2)
    comm = tuple(range(2 * N))
    hosts = comm_hosts(topo, comm, settings_from_env(env))
    assert hosts == tuple(r // per_node for r in comm)
    assert send_rounds(hosts, 0)[8:12] == later_peers
