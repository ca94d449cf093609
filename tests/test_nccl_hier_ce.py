"""NCCL 2.30.7's hierarchical copy-engine collectives across hosts, against closed forms restated from NCCL's code
(src/ce_coll.cc `ncclHierCeAvailable`, `ncclHierCollBuildChunk`, `ncclHierCeAllGather`, `ncclHierCeAlltoAll`;
init.cc `hostRmaSupport`; v2.30.7-1), not read back from the code under test:

- where: NCCL_CTA_POLICY ZERO on windows registered on both sides (-R 2), all-gather or ncclAlltoAll, more than one
  node, from 2.30.7, with symmetric support across hosts (a GIN plugin) and the host RMA proxy: NCCL_NUM_RMA_CTX > 0
  (a value below 0 leaves the config's 1) and NCCL_CROSS_NIC not 0;
- chunks: a peer's bytes in one put up to 64 MiB (HIER_COLL_MAX_CHUNK_SIZE), else ceil(bytes / 64 MiB) puts of a
  uniform size rounded down to 8 KiB, the last the rest;
- all-gather: each GPU puts its part s to the GPU of its local index on every other host, copies s to each host
  peer after the host sync, then copies each received chunk to each host peer once it has arrived, in turn;
- all-to-all: each GPU puts its block to every GPU of every other host and copies its block to each host peer;
- latency: the rail sync at NCCL's network Simple hop (tuning.cc hwLat, 14 µs) and two host syncs at NVLink's
  (3.4 µs), the first of all-gather's delaying its host copies only.

Times on the flow engine: H100 NVLink 450 GB/s a direction, 25 ns a link (2 links a path); NICs 400 Gb/s = 50 GB/s,
1 µs a link (2 links a path). The collective's latency delays its first flows less the network path's propagation
(`shape`), which each put then pays.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.sym import hier_chunks
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import leaf_spine, rail_optimized

MiB = 1 << 20
RAIL = rail_optimized(hosts=2, gpus_per_host=8, gpu="h100")  # a GPU's rail peer is on its own leaf
ONE_LEAF = leaf_spine(1, 16, 0, gpus_per_host=8, gpu="h100")  # every NIC on one switch: no spine to share
RANKS = tuple(range(16))
ZERO = {"PHANTORA_NCCL_REGISTER": "2", "NCCL_CTA_POLICY": "2", "PHANTORA_NCCL_VERSION": "2.30.7"}
NET_US, SYNC_US = 14.0, 3.4  # hwLat[NET][RING][SIMPLE], hwLat[NVLINK][RING][SIMPLE]
NIC, NVL = 50e3, 450e3  # bytes a µs
NET_PROP, NVL_PROP = 2.0, 0.05  # µs a path


def dag_of(kind: str, nbytes: int, topo=RAIL, ranks=RANKS, **env: str):
    coll = Collective(kind, ranks, nbytes, "fp32", alltoall_api=kind == "all_to_all")
    return decompose(coll, topo, AlgoOptions(nccl_env=nccl_env({**ZERO, **env})))


def end_us(dag, topo) -> float:
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000


@pytest.mark.parametrize("kind", ["all_gather", "all_to_all"])
@pytest.mark.parametrize(
    ("env", "ce"),
    [
        ({}, True),
        ({"PHANTORA_NCCL_VERSION": "2.30.4"}, False),  # ncclHierCeAvailable came in 2.30.7
        ({"NCCL_CTA_POLICY": ""}, False),  # taskAppend takes the copy engines only under ZERO
        ({"PHANTORA_NCCL_REGISTER": "1"}, False),  # no windows: not ncclSymSendRegRecvReg
        ({"NCCL_NUM_RMA_CTX": "0"}, False),  # hostRmaSupport needs an RMA context
        ({"NCCL_NUM_RMA_CTX": "-3"}, True),  # below 0: init.cc keeps the config's 1
        ({"NCCL_CROSS_NIC": "0"}, False),  # globalRmaProxySupport needs crossNic
        ({"NCCL_GIN_TYPE": "0"}, False),  # no GIN plugin: no symmetric support across hosts
    ],
)
def test_where_nccl_runs_the_hierarchical_copy_engines(kind: str, env: dict[str, str], ce: bool) -> None:
    got = (dag_of(kind, 16 * MiB, **env).choice or {}).get("algorithm")
    assert (got == "ce") is ce


@pytest.mark.parametrize(
    ("nbytes", "chunks"),
    [
        (64 * MiB, [64 * MiB]),
        (64 * MiB + 1, [32 * MiB, 32 * MiB + 1]),  # 2 chunks: (64 MiB + 1) / 2 rounded down to 8 KiB
        (200 * MiB, [50 * MiB] * 4),  # ceil(200 / 64) = 4
        (129 * MiB + 5, [43 * MiB] * 2 + [43 * MiB + 5]),  # 3 chunks of 43 MiB (a multiple of 8 KiB), the rest last
    ],
)
def test_a_peers_bytes_go_in_chunks_of_at_most_64_mib(nbytes: int, chunks: list[int]) -> None:
    assert hier_chunks(nbytes) == chunks


def test_the_latency_is_the_rail_sync_and_two_host_syncs() -> None:
    c = dag_of("all_gather", 16 * MiB).choice or {}
    assert (c["algorithm"], c["channels"], c["ce_syncs"]) == ("ce", 0, 2)
    assert c["model_lat_us"] == pytest.approx(NET_US + 2 * SYNC_US)


def test_all_gather_puts_to_rail_peers_and_copies_inside_each_host() -> None:
    s = 16 * MiB
    flows = dag_of("all_gather", 16 * s).flows
    host = {RAIL.node_of_rank(r): r // 8 for r in RANKS}
    across = sorted((f.src, f.dst, f.size) for f in flows if host[f.src] != host[f.dst])
    assert across == sorted(
        (RAIL.node_of_rank(r), RAIL.node_of_rank((r + 8) % 16), s) for r in RANKS
    )  # each GPU to the GPU of its local index on the other host
    inside = [f for f in flows if host[f.src] == host[f.dst]]
    assert len(inside) == 2 * 16 * 7 and all(f.size == s for f in inside)  # its own part, then the received one
    assert sum(1 for f in inside if f.deps) == 16 * 7  # the received part's copies wait for it


def test_all_gather_on_idle_links_ends_at_the_closed_form() -> None:
    """256 MiB (s = 16 MiB, one chunk): the puts and the host copies side by side, then the received part's copies.
    2 GiB (s = 128 MiB, two 64 MiB chunks on the wire in turn): each received chunk's copies once it has arrived and
    the copies before have ended."""
    delay = NET_US + 2 * SYNC_US - NET_PROP
    s = 16 * MiB
    put = delay + s / NIC + NET_PROP
    own = delay + SYNC_US + 7 * s / NVL + NVL_PROP
    assert end_us(dag_of("all_gather", 16 * s), RAIL) == pytest.approx(max(put, own) + 7 * s / NVL + NVL_PROP, abs=0.01)
    s, c = 128 * MiB, 64 * MiB
    first, second = delay + c / NIC + NET_PROP, delay + 2 * c / NIC + NET_PROP
    own = delay + SYNC_US + 7 * s / NVL + NVL_PROP
    after_first = max(first, own) + 7 * c / NVL + NVL_PROP
    want = max(second, after_first) + 7 * c / NVL + NVL_PROP
    assert end_us(dag_of("all_gather", 16 * s), RAIL) == pytest.approx(want, abs=0.01)


@pytest.mark.parametrize("block", [1 * MiB, 128 * MiB])
def test_all_to_all_puts_to_every_remote_gpu_beside_the_host_copies(block: int) -> None:
    """Each GPU: 8 blocks out of its NIC (two 64 MiB chunks each at 128 MiB) and 7 over its NVLink, side by side."""
    dag = dag_of("all_to_all", 16 * block, ONE_LEAF)
    host = {ONE_LEAF.node_of_rank(r): r // 8 for r in RANKS}
    out: dict[tuple[int, bool], int] = {}
    for f in dag.flows:
        key = (f.src, host[f.src] != host[f.dst])
        out[key] = out.get(key, 0) + f.size
    assert set(out.values()) == {8 * block, 7 * block}
    assert all(out[ONE_LEAF.node_of_rank(r), True] == 8 * block for r in RANKS)
    delay = NET_US + 2 * SYNC_US - NET_PROP
    want = delay + max(8 * block / NIC + NET_PROP, 7 * block / NVL + NVL_PROP)
    assert end_us(dag, ONE_LEAF) == pytest.approx(want, abs=0.01)


def test_hosts_of_unequal_gpu_counts_are_refused_in_one_line() -> None:
    with pytest.raises(InputError, match=r"hosts of \[3, 5\] GPUs") as got:
        dag_of("all_gather", 16 * MiB, ranks=(0, 1, 2, 8, 9, 10, 11, 12))
    assert got.value.field == "NCCL_CTA_POLICY"


@pytest.mark.slow
@pytest.mark.ns3
def test_packet_mode_carries_the_hierarchical_all_gathers_bytes(ns3_lib) -> None:
    """all_gather_perf -x 2 -R 2 at 16 MiB through ns-3 on two hosts of 8 H100s: ns-3 delivers exactly the puts'
    and copies' bytes, 16 x (1 + 2 x 7) x 1 MiB (no protocol lines), and ends no sooner than the flow network at the
    packets' goodput (`flow_goodput`: a fluid bound) and within 10% of it (2026-12-02: 61.663 against 59.924 µs)."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.report import nccl_tests as nt

    test = nt.find_test("all_gather_perf")
    nbytes = nt.counts(test, 16 * MiB, 4, 16)[2]
    it = nt.build_iteration(test, RANKS, nbytes, "fp32", 0, RAIL, AlgoOptions(nccl_env=nccl_env(ZERO)), 0, "t")
    assert it.choice is not None and it.choice["algorithm"] == "ce"
    wire = sum(f.size for f in it.flows)
    assert wire == 16 * (1 + 2 * 7) * MiB
    ns3 = make_engine(EngineSpec(network="ns3"), RAIL)
    goodput = make_engine(EngineSpec(network="flow", flow_goodput=True), RAIL)
    t_ns3 = nt.run_iteration(ns3, it)
    assert int(str(ns3.stats()["payload_bytes_delivered"])) == wire
    t_flow = nt.run_iteration(goodput, it)
    assert t_flow <= t_ns3 <= 1.1 * t_flow
