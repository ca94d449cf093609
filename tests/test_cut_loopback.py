"""The cut-link message path of parallel packet simulation, every group in one engine (issue 38).

With `partition_loopback=N` every packet over a cable the partition cuts leaves as a message (header
serialised, arrival time, order key) and is queued again at a window barrier (lookahead: the least cut-cable
delay). In the keyed mode that must change nothing: completions, FCT records, PFC frames, queue samples, CE
marks, CNPs, transport counters and event counts byte-identical to the keyed mode without a cut, for several
CCs, on a leaf-spine with cross-group traffic and an incast.
"""

from __future__ import annotations

from typing import Any

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.generators import leaf_spine

pytestmark = pytest.mark.ns3

TOPO = leaf_spine(4, 4, 2, nvswitch=False)
RATES = sorted({link.bandwidth_bps for link in TOPO.links})


def traffic() -> list[Flow]:
    """Every NIC sends 200 KB to the one 5 ahead (across leaves and groups), and 8 NICs of two other leaves
    send 400 KB each to one NIC (an incast over the spines; 300 KB switch buffers: PFC pauses and CE marks)."""
    eps = TOPO.endpoints
    flows = [Flow(i, s, eps[(i + 5) % len(eps)], 200_000) for i, s in enumerate(eps)]
    flows += [Flow(len(eps) + j, s, eps[1], 400_000) for j, s in enumerate(eps[4:12])]
    return flows


def run(cc: str, groups: int) -> tuple[dict[str, Any], list[int]]:
    """Everything a run records, and its CutStats (cables, lookahead, messages, bytes, barriers)."""
    over = [f"scheduler={KEYED_SCHEDULER}", "queue_sample_ns=2000", "buffer_bytes=300000"]
    over += [f"partition_loopback={groups}"] if groups else []
    config = PacketConfig(cc=cc, kmin_map=dict.fromkeys(RATES, 20_000), kmax_map=dict.fromkeys(RATES, 80_000))
    with Ns3Simulator(TOPO, apply_overrides(config, over)) as sim:
        sim.submit(traffic(), 0)
        done = sim.drain()
        records = {
            "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in done),
            "fct": sim.fct_records(),
            "pfc": sim.pfc_events(),
            "queues": sim.queue_samples(),
            "marks": sim.ecn_mark_events(),
            "cnps": sim.cnp_events(),
            "transport": sim.flow_transport(),
            "stats": sim.stats(),
        }
        return records, [int(x) for x in sim._net.CutStats()]


@pytest.mark.parametrize("cc", ["dcqcn", pytest.param("hpcc", marks=pytest.mark.slow), "none"])
def test_messages_over_cut_cables_change_nothing(cc: str) -> None:
    want, cut = run(cc, 0)
    assert cut == [0, 0, 0, 0, 0]
    assert len(want["completions"]) == len(traffic())
    assert want["pfc"] and want["marks"] and want["queues"]  # the records compared below are not empty
    for groups, cables in ((2, 4), (4, 6)):
        got, cut = run(cc, groups)
        # leaf-spine 4 x 2 into 2 groups: 2 leaves + 1 spine each, 4 of 8 leaf-spine cables cut; into 4: a leaf
        # per group, the 2 spines with 2 of them, 6 cut
        assert cut[0] == cables and cut[1] == 1000
        assert cut[2] > 1000 and cut[4] > 10  # packets crossed as messages, over many windows
        for name, value in want.items():
            assert got[name] == value, (cc, groups, name)


def test_loopback_needs_the_keyed_mode() -> None:
    with pytest.raises(InputError, match="scheduler=ns3::PhantoraKeyedScheduler") as err:
        PacketConfig(partition_loopback=2).validate()
    assert err.value.field == "partition_loopback"
