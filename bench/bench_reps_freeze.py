"""REPS freezing on a blackhole: the figures docs/packet-model.md quotes, printed by a command.

One 10 MB UET message gpu0 -> gpu1 across 2 spines at 100G; leaf0-spine0 goes down at 100 us and routing never
re-converges (its ACKs keep their ECMP path over spine1). With freezing (htsim's 10 ms) and without it (0), prints
when the first retransmission timeout is seen (to the 5 us step the run advances by), the packets lost on the
dead wire by then and at the end, the timeouts and when the message ends. tests/test_packet_reps_freeze.py
asserts the order of these figures; this prints them.

    .venv/bin/python bench/bench_reps_freeze.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from star_fabric import stat_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Completion, Flow
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.netsim.packet_faults import FaultyNs3Simulator
from phantora.netsim.scenario import parse_scenario
from phantora.topology.generators import leaf_spine

SIZE = 10_000_000
BLACKHOLE = 'reconvergence = "1s"\n[[events]]\nkind = "link_down"\nat = "100us"\nlink = ["leaf0", "spine0"]\n'
STEP_NS = 5_000
FREEZE_NS = {"frozen": 10_000_000, "unfrozen": 0}


def run(freeze_ns: int) -> dict[str, int]:
    """One message over the blackhole; the figures of the run (ns and packet counts)."""
    topo = leaf_spine(2, 1, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)
    key = next(k for k in range(1, 64) if topo.nodes[topo.channel_ends(topo.route(1, 0, k)[1])[1]].name == "spine1")
    cfg = apply_overrides(PacketConfig(), ["transport=uet", f"reps_freeze_ns={freeze_ns}"])
    with FaultyNs3Simulator(topo, parse_scenario(BLACKHOLE, "blackhole.toml"), cfg) as sim:
        sim.submit([Flow(1, 0, 1, SIZE, key=key, conn=1)], at=0)
        t, first_ns, lost_at_first = 0, -1, -1
        done: list[Completion] = []
        while not done and t < 50_000_000:
            t += STEP_NS
            done += sim.advance(t)
            st = sim.stats()
            if first_ns < 0 and stat_count(st, "timeouts") >= 1:
                first_ns, lost_at_first = t, stat_count(st, "wire_lost_packets")
        if not done:
            raise RuntimeError(f"freeze {freeze_ns} ns: the message did not end within 50 ms")
        return {
            "first_timeout_by_ns": first_ns,
            "lost_at_first": lost_at_first,
            "timeouts": stat_count(st, "timeouts"),
            "lost": stat_count(st, "wire_lost_packets"),
            "done_ns": done[0].end_ns,
        }


def main() -> None:
    """Print one line per mode."""
    print(f"REPS on a blackhole: {SIZE:,} B over leaf0-spine0 down at 100 us, never re-converged")
    for name, freeze_ns in FREEZE_NS.items():
        r = run(freeze_ns)
        print(
            f"{name:<9} first timeout by {r['first_timeout_by_ns'] / 1000:,.1f} µs "
            f"({r['lost_at_first']} lost by then); {r['timeouts']} timeouts, {r['lost']} lost, "
            f"done at {r['done_ns'] / 1000:,.1f} µs"
        )


if __name__ == "__main__":
    main()
