"""`phantora nccl-tests` calls through both engines on two H100 hosts (testbed16), against closed forms.

Expected values are written out here from NCCL 2.30's constants (baseLat, hwLat, the proxy's net overhead) and
from each algorithm's bytes (ring and tree all-reduce 2(n-1)S, all-to-all (n-1)S, n send/recv pairs nS, times the
protocol's wire factor: LL 2, LL128 128/120), not read back from the code under test.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.report import nccl_tests as nt
from phantora.topology import load_topology

KiB, MiB = 1 << 10, 1 << 20
N = 16  # testbed16: 2 hosts x 8 H100, a 400G NIC per GPU


def call(test: str, nbytes: int, env: dict[str, str], first_id: int = 0) -> nt.Iteration:
    topo = load_topology("testbed16")
    return nt.build_iteration(nt.find_test(test), tuple(range(N)), nbytes, "fp32", 0, topo,
                              AlgoOptions(nccl_env=nccl_env(env)), first_id, "t")  # fmt: skip


def test_grouped_sendrecv_is_one_launch_bound_by_its_slowest_pair() -> None:
    """sendrecv_perf's 16 pairs are one NCCL group: one kernel launch, every pair in flight. 8 B each: the call
    takes one launch and one step of its slowest pair, the one across hosts (baseLat ring/Simple 8.4 us + hwLat
    net 14.0 + the proxy posting a send and a receive at 1 us each, one op per channel part and direction since
    c574049 = 24.4 us), not 16 launches;
    a pair inside a host alone (LL at 8 B) would take 6.6 + 0.6 (an NVLink step) = 7.2 us. The recorded choice
    is the bound's."""
    topo = load_topology("testbed16")
    it = call("sendrecv_perf", 8, {})
    assert it.choice is not None and it.choice["model_lat_us"] == pytest.approx(8.4 + 14.0 + 2 * 1.0)
    t_us = nt.run_iteration(FlowSimulator(topo), it) / 1e3
    assert t_us == pytest.approx(8.4 + 14.0 + 2 * 1.0 + 8 / 50e3, rel=1e-3)
    intra = nt.build_iteration(nt.find_test("sendrecv_perf"), (0, 1), 8, "fp32", 0, topo, AlgoOptions(), 0, "u")
    assert nt.run_iteration(FlowSimulator(topo), intra) / 1e3 == pytest.approx(6.6 + 0.6, rel=1e-3)


CASES = [  # test, size, NCCL_* forced, the algorithm's payload over every connection, wire factor, line
    ("all_reduce_perf", 1 * MiB, {"NCCL_PROTO": "LL"}, 2 * (N - 1) * MiB, 2.0, 16),
    ("all_reduce_perf", 1 * MiB, {"NCCL_PROTO": "LL128", "NCCL_ALGO": "Tree"}, 2 * (N - 1) * MiB, 128 / 120, 128),
    ("alltoall_perf", 1 * MiB, {}, (N - 1) * MiB, 1.0, 1),
    ("sendrecv_perf", 128 * KiB, {}, N * 128 * KiB, 1.0, 1),
]


@pytest.mark.slow
@pytest.mark.ns3
def test_packet_mode_carries_the_protocols_bytes_and_times_as_the_flow_network(ns3_lib) -> None:
    """Each call through ns-3: its choice is the flow network's (one decomposition), ns-3 delivers exactly the
    flows' bytes, those are the algorithm's payload times the protocol's wire factor (each flow rounds up to
    whole lines), and ns-3's time is within 2% of the flow network's at the packets' goodput (1000 B payload
    per 1048 B packet, `flow_goodput`; headers and ACKs are the difference)."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    topo = load_topology("testbed16")
    goodput = make_engine(EngineSpec(network="flow", flow_goodput=True), topo)
    ns3 = make_engine(EngineSpec(network="ns3"), topo)
    try:
        next_id = 0
        for test, size, env, payload, factor, line in CASES:
            nbytes = nt.counts(nt.find_test(test), size, 4, N)[2]
            it = call(test, nbytes, env, next_id)
            next_id = it.next_id
            assert it.choice is not None
            for k, v in env.items():
                assert it.choice["protocol" if k == "NCCL_PROTO" else "algorithm"] == v
            wire = sum(f.size for f in it.flows)
            assert payload * factor <= wire <= payload * factor + line * len(it.flows), test
            before = int(str(ns3.stats()["payload_bytes_delivered"]))
            t_ns3 = nt.run_iteration(ns3, it)
            assert int(str(ns3.stats()["payload_bytes_delivered"])) - before == wire, test
            t_flow = nt.run_iteration(goodput, it)
            assert t_ns3 == pytest.approx(t_flow, rel=0.02), test
    finally:
        ns3.close()
        goodput.close()


@pytest.mark.parametrize("test", ["all_gather_perf", "reduce_scatter_perf"])
def test_pat_pays_nccls_latency_once_not_a_propagation_a_round(test: str) -> None:
    """PAT on 4 hosts of one GPU, 64 KiB: NCCL's latency baseLat 8.0 + log2(4) x hwLat net 14.0 / 3.5 + 4 ranks x
    2.8 = 27.2 us already counts its two rounds' network hops, so the call takes NCCL's time (27.2 us + the bytes
    at its rate) and not one more path's propagation (4 x 1 us links) per round after the first (was +4.1 us)."""
    from phantora.topology import leaf_spine

    topo = leaf_spine(2, 2, 2, gpus_per_host=1, uplink_rate="400Gbps", gpu="h100")
    spec = nt.find_test(test)
    nbytes = nt.counts(spec, 64 * KiB, 4, 4)[2]
    it = nt.build_iteration(spec, (0, 1, 2, 3), nbytes, "fp32", 0, topo,
                            AlgoOptions(nccl_env=nccl_env({"NCCL_ALGO": "PAT"})), 0, "p")  # fmt: skip
    assert it.choice is not None and it.choice["algorithm"] == "PAT"
    assert it.choice["model_lat_us"] == pytest.approx(8.0 + 2 * 14.0 / 3.5 + 4 * 2.8)
    t_us = nt.run_iteration(FlowSimulator(topo), it) / 1e3
    assert t_us == pytest.approx(it.choice["model_time_us"], rel=0.01)


@pytest.mark.ns3
def test_nvls_through_ns3_carries_each_gpus_nvls_bytes(ns3_lib) -> None:
    """NCCL_ALGO=NVLS on the 8 H100s of one NVSwitch host, 16 MiB: the switch reduces and multicasts, so each GPU's
    NVLink sends S(m+1)/m and receives as much (not a ring's 2(m-1)/m S; collectives/nvls.py writes it as one flow
    a GPU through the NVSwitch). ns-3's packets deliver every flow and exactly those bytes, in the flow network's
    time within 2% (the NVLink flows are paced at their caps in both engines)."""
    from phantora.collectives import Collective, decompose
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig
    from phantora.topology import dgx_host

    topo = dgx_host(gpu="h100")
    m, size = 8, 16 * MiB
    coll = Collective("all_reduce", tuple(range(m)), size, "bf16")
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env({"NCCL_ALGO": "NVLS"})))
    assert dag.choice is not None and dag.choice["algorithm"] == "NVLS"
    flow = FlowSimulator(topo)
    flow.submit(dag.flows, at=0)
    flow_t = max(c.end_ns for c in flow.drain())
    with Ns3Simulator(topo, PacketConfig()) as sim:
        sim.submit(dag.flows, at=0)
        done = sim.drain()
    ends = {c.flow_id for c in done}
    assert ends == {f.id for f in dag.flows}
    for r in range(m):
        node = topo.node_of_rank(r)
        sent = sum(f.size for f in dag.flows if f.src == node)
        got = sum(f.size for f in dag.flows if f.dst == node)
        assert sent == pytest.approx(size * (m + 1) / m, rel=1e-4) and got == pytest.approx(sent, rel=1e-4)
    assert sum(c.size for c in done) == sum(f.size for f in dag.flows)
    assert max(c.end_ns for c in done) == pytest.approx(flow_t, rel=0.02)
