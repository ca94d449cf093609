"""PXN for a send/recv grouped on a larger communicator (nccl/pxn.py `comm_relay`): NCCL's p2p NIC choice
(`ncclTopoGetNetDev` without a graph, src/graph/search.cc, v2.29.7-1) sends from the NIC of the sender's host that
sits on the receiver's rail, through that GPU's rank as proxy; a lone pair crosses rails from its own NIC."""

from __future__ import annotations

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import rail_optimized
from phantora.topology.model import Topology

MiB = 1 << 20
NIC_GBPS = 400


def hosts() -> Topology:
    """Two rail-optimised hosts of 8 GPUs, a 400G NIC each, as the published B200 pairs."""
    return rail_optimized(2, 8, spines=8, nic_rate=f"{NIC_GBPS}Gbps", gpu="b200")


def send(comm: tuple[int, ...], env: dict[str, str] | None = None, nbytes: int = 256 * MiB) -> Collective:
    """GPU 7 of host 0 (rank 7) sends to GPU 0 of host 1 (rank 8)."""
    return Collective("send_recv", (7, 8), nbytes, "fp32", None, comm)


def crossing(topo: Topology, flows: list) -> set[tuple[int, int]]:
    """The (sender rank, receiver rank) of every flow with bytes that crosses hosts."""
    rank_of = {topo.node_of_rank(r): r for r in range(topo.num_ranks)}
    return {
        (rank_of[f.src], rank_of[f.dst]) for f in flows if f.size and topo.nodes[f.src].host != topo.nodes[f.dst].host
    }


def test_a_grouped_send_leaves_from_the_receivers_rail_through_its_gpu() -> None:
    topo = hosts()
    dag = decompose(send(tuple(range(16))), topo, AlgoOptions(nccl_env=nccl_env({})))
    assert crossing(topo, dag.flows) == {(0, 8)}  # rank 0's NIC, rail 0 on both hosts
    src, relay = topo.node_of_rank(7), topo.node_of_rank(0)
    assert sum(f.size for f in dag.flows if (f.src, f.dst) == (src, relay)) == 256 * MiB  # over NVLink first
    crossed = sum(f.size for f in dag.flows if topo.nodes[f.src].host != topo.nodes[f.dst].host)
    assert crossed == 256 * MiB  # every byte once over the network
    assert set(dag.rank_last) == {7, 8}  # the relay's rank does not wait for the transfer


def test_a_lone_pair_or_pxn_off_crosses_rails_from_its_own_nic() -> None:
    topo = hosts()
    lone = decompose(send(()), topo, AlgoOptions(nccl_env=nccl_env({})))
    assert crossing(topo, lone.flows) == {(7, 8)}
    off = decompose(send(tuple(range(16))), topo, AlgoOptions(nccl_env=nccl_env({"NCCL_PXN_DISABLE": "1"})))
    assert crossing(topo, off.flows) == {(7, 8)}


def test_the_relayed_send_runs_at_the_nic_line_rate() -> None:
    """On the receiver's rail the 256 MiB transfer is bound by one 400G NIC: within 2% of 50 GB/s (the flow
    network's rate; it cannot be above it)."""
    topo = hosts()
    dag = decompose(send(tuple(range(16))), topo, AlgoOptions(nccl_env=nccl_env({})))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    gbs = 256 * MiB / max(c.end_ns for c in sim.drain())
    line = NIC_GBPS / 8
    assert line * 0.98 <= gbs <= line * 1.0001
