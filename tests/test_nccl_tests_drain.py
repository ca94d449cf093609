"""`run_iteration` drains the network once per call: the same per-call times, and the same state for the next call,
as stopping at each rank's last flow in turn (the wait it replaced), on the packet engine.

The case is tests/test_bench_nccl_packet.py's: an all-gather on 4 hosts of one H100 on 2 leaves of 2 hosts and one
spine, 400 Gbps NICs and 100 Gbps uplinks; NCCL picks Ring/LL on 4 channels. At 256 KiB the leaf uplink binds: NCCL's
latency 6.6 + 3 x 5.0 = 21.6 us, then 3 x 64 KiB x 2 (LL) bytes at 100 Gbps = 31.457 us, 53.057 us in all; ns-3's
packets add their headers (48 B a 1000 B payload) on the wire, so its call takes at least 21.6 + 31.457 x 1.048 =
54.567 us, and less than 3 % more (each of the ring's 3 steps fills its path packet by packet, store and forward).
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions
from phantora.netsim.base import INF_NS, NetworkSimulator
from phantora.report import nccl_tests as nt
from phantora.topology import leaf_spine

KiB = 1024
LAT_US = 6.6 + 3 * 5.0
LINK_US = 3 * 64 * KiB * 2 * 8 / 100e3


def watched(sim: NetworkSimulator, it: nt.Iteration) -> int:
    """The wait `run_iteration` replaced: submit, then stop at each rank's last flow until all have completed."""
    start = sim.now()
    sim.submit(it.flows, start)
    pending, end = set(it.last), start
    while pending:
        got = [c for c in sim.advance_watching(INF_NS, pending) if c.flow_id in pending]
        assert got, "the network stopped with flows of the call unfinished"
        for c in got:
            pending.discard(c.flow_id)
            end = max(end, c.end_ns)
    return end - start


def calls(sim: NetworkSimulator, run: object, sizes: list[int]) -> list[tuple[int, int]]:
    """(time, now() after it) of one all-gather of each size, back to back on `sim`."""
    topo = leaf_spine(2, 2, 1, gpus_per_host=1, uplink_rate="100Gbps", gpu="h100")
    out, next_id = [], 0
    for i, size in enumerate(sizes):
        it = nt.build_iteration(nt.find_test("all_gather_perf"), (0, 1, 2, 3), size, "fp32", 0, topo, AlgoOptions(),
                                next_id, f"c{i}")  # fmt: skip
        next_id = it.next_id
        out.append((run(sim, it), sim.now()))  # type: ignore[operator]
    return out


@pytest.mark.ns3
@pytest.mark.parametrize("config", [{}, {"nvlink": "fluid", "nic_latency": 1000}], ids=["ns3", "fluid+nic"])
def test_a_drained_call_takes_the_watched_calls_time(ns3_lib, config: dict[str, object]) -> None:
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import PacketConfig

    topo = leaf_spine(2, 2, 1, gpus_per_host=1, uplink_rate="100Gbps", gpu="h100")
    spec = EngineSpec("ns3", PacketConfig(cc="dcqcn", **config))  # type: ignore[arg-type]
    sizes = [256 * KiB, 256 * KiB, 64 * KiB, 256 * KiB]
    got = {}
    for name, run in (("drained", nt.run_iteration), ("watched", watched)):
        sim = make_engine(spec, topo)
        try:
            got[name] = calls(sim, run, sizes)
            assert sim.in_flight() == 0
        finally:
            sim.close()
    assert got["drained"] == got["watched"]  # each call's time and where the next one starts, to the ns
    nic_us = int(config.get("nic_latency", 0)) / 1e3  # type: ignore[call-overload]
    bound_us = LAT_US + nic_us + LINK_US * (1000 + 48) / 1000
    for t, _ in got["drained"][:2]:
        assert bound_us <= t / 1e3 < bound_us * 1.03
