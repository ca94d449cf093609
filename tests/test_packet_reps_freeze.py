"""REPS's freezing mode (issue 37, `reps_freeze_ns`, NIC attribute RepsFreezeTime), against closed forms.

With trimming on, congestion trims packets instead of dropping them, so a retransmission timeout means a failed
path. A blackhole (leaf0-spine0 down, routing never re-converging) takes every packet hashed onto it. After the
first timeout the connection freezes and sends only the entropies that came back good, so the dead path receives
no new packet: the packets lost on the wire stay at their count at the freeze, on this message and on the next
message of the same connection. Without freezing, resends and the next message explore again and lose more.
"""

from __future__ import annotations

import pytest

from phantora.netsim.base import Completion, Flow
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.netsim.packet_faults import FaultyNs3Simulator
from phantora.netsim.scenario import parse_scenario
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

pytestmark = pytest.mark.ns3

SIZE = 10_000_000  # 10 MB per message: 838 us at 100G
BLACKHOLE = 'reconvergence = "1s"\n[[events]]\nkind = "link_down"\nat = "100us"\nlink = ["leaf0", "spine0"]\n'
STEP_NS = 5_000


def fabric() -> tuple[Topology, int]:
    """gpu0 under leaf0, gpu1 under leaf1, 2 spines, 100G; and a flow key whose ACKs (gpu1 -> gpu0, which keep
    their ECMP path) cross spine1, so only data packets can reach the dead link."""
    topo = leaf_spine(2, 1, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)
    key = next(k for k in range(1, 64) if topo.nodes[topo.channel_ends(topo.route(1, 0, k)[1])[1]].name == "spine1")
    return topo, key


def run(freeze_ns: int, second_at_ns: int | None = None) -> dict[str, object]:
    """A message gpu0 -> gpu1 (and a second on the same connection at `second_at_ns`), stepped by STEP_NS:
    the wire losses when the first freeze (or, without freezing, the first timeout) is seen, and at the end."""
    topo, key = fabric()
    cfg = apply_overrides(PacketConfig(), ["transport=uet", f"reps_freeze_ns={freeze_ns}"])
    flows = [Flow(1, 0, 1, SIZE, key=key, conn=1)]
    if second_at_ns is not None:
        flows.append(Flow(2, 0, 1, SIZE, key=key, conn=1))
    with FaultyNs3Simulator(topo, parse_scenario(BLACKHOLE, "blackhole.toml"), cfg) as sim:
        sim.submit(flows[:1], at=0)
        t, lost_at_first, first_timeout_ns = 0, None, None
        done: list[Completion] = []
        while len(done) < len(flows) and t < 50_000_000:
            if second_at_ns is not None and t == second_at_ns:
                sim.submit(flows[1:], at=t)
            t += STEP_NS
            done += sim.advance(t)
            st = sim.stats()
            if lost_at_first is None and st["timeouts"] >= 1:  # type: ignore[operator]
                first_timeout_ns, lost_at_first = t, st["wire_lost_packets"]
        return {"done": {c.flow_id: c.end_ns for c in done}, "stats": st, "first_timeout_ns": first_timeout_ns,
                "lost_at_first": lost_at_first}  # fmt: skip


def test_a_frozen_connection_sends_nothing_onto_the_dead_path(ns3_lib) -> None:
    """After the first timeout (the freeze) the wire losses stop: the count when the freeze is seen (within
    STEP_NS) is the final count, one freeze, one timeout, every byte delivered. Without freezing the resends
    explore again: more packets die on the dead link after the first timeout and it takes more timeouts."""
    frozen, free = run(10_000_000), run(0)
    st = frozen["stats"]
    assert st["reps_freezes"] == 1 and st["timeouts"] == 1  # type: ignore[index]
    assert 0 < frozen["lost_at_first"] == st["wire_lost_packets"]  # type: ignore[index,operator]
    assert st["payload_bytes_delivered"] == SIZE  # type: ignore[index]
    fst = free["stats"]
    assert fst["reps_freezes"] == 0 and fst["timeouts"] > 1  # type: ignore[index,operator]
    assert fst["wire_lost_packets"] > free["lost_at_first"]  # type: ignore[index,operator]
    assert fst["payload_bytes_delivered"] == SIZE  # type: ignore[index]
    assert frozen["done"][1] < free["done"][1]  # type: ignore[index]


@pytest.mark.parametrize("freeze_ns", [10_000_000, 0])
def test_the_freeze_holds_across_the_messages_of_a_connection(ns3_lib, freeze_ns: int) -> None:
    """A second message on the same connection, started after the first has finished: frozen, it sends only the
    remembered good entropies and loses nothing (the wire losses and timeouts stay those of the first message);
    unfrozen, its first window explores fresh entropies and loses packets on the dead link again."""
    one = run(freeze_ns)
    two = run(freeze_ns, second_at_ns=((one["done"][1] // STEP_NS) + 1) * STEP_NS)  # type: ignore[index,operator]
    assert two["stats"]["payload_bytes_delivered"] == 2 * SIZE  # type: ignore[index]
    if freeze_ns:
        assert two["stats"]["wire_lost_packets"] == one["stats"]["wire_lost_packets"]  # type: ignore[index]
        assert two["stats"]["timeouts"] == 1  # type: ignore[index]
    else:
        assert two["stats"]["wire_lost_packets"] > one["stats"]["wire_lost_packets"]  # type: ignore[index,operator]


def test_a_freeze_ends_after_its_time(ns3_lib) -> None:
    """With a 100 us freeze the second message, started well after it, explores again (losses on the dead path)
    and the connection freezes a second time."""
    one = run(100_000)
    two = run(100_000, second_at_ns=((one["done"][1] // STEP_NS) + 40) * STEP_NS)  # type: ignore[index,operator]
    assert two["stats"]["wire_lost_packets"] > one["stats"]["wire_lost_packets"]  # type: ignore[index,operator]
    assert two["stats"]["reps_freezes"] == 2  # type: ignore[index]
    assert two["stats"]["payload_bytes_delivered"] == 2 * SIZE  # type: ignore[index]
