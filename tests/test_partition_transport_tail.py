"""Retransmission counters of a flow whose sender's last ACK comes after a partitioned run's stop (issue 38, item 1).

A replay stops right after the event of its last completion, as one engine's drain does. One engine's transport
record of a flow is made when its receiver has the last byte (`DataComplete`), with the sender's counters then, and
updated at the sender's last ACK (`SenderDone`); a flow whose last ACK comes after the stop keeps the first. On
partition workers the receiver's worker made the record without the sender's part, which came only at `SenderDone`:
such a flow had 0 retransmissions. Now each worker reports the key of the last byte's event (receivers) and the
retransmissions since every byte was sent once, each with its event's key (senders), and the driver takes the
sender's counters less those after the last byte (`bridge.cut_pool.senders_at_last_byte`).

Default: that arithmetic on hand-made reports. Slow (each worker imports ns-3): a 4 MiB all-to-all on testbed16
without PFC (300 KB buffers, drops, go-back-N with a 20 us timeout), one keyed engine against 2 workers, on the
whole-DAG path and on the stepped one (``nvlink=fluid``): flows.csv byte for byte, its last flow (retransmitted,
crossing the cut) included; it read 0 retransmissions on both before.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridge.cut_pool import merged_transport, senders_at_last_byte
from phantora.netsim.observe import FlowTransport
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.netsim.partition import adopted, partition_fabric
from phantora.topology.loader import load_topology
from tests.test_partition_pfc import FILES, replay

LAST = (1000, 990, 3, 5)  # the event of flow 7's last byte: (ns, scheduling ns, scheduling node, its count)


def test_the_senders_counters_as_of_the_last_byte() -> None:
    """Flow 7's sender sent 10 packets again (40,960 bytes), 4 of them after every byte was sent once: one in an
    earlier ns, one earlier in the last byte's ns, one later in it (count 6), one 200 ns later; one engine's record
    has the 8 before the last byte. Flow 8 (no last byte yet) and flow 9 (its sender done: final counters in the
    sender's own record) get none."""
    receiver = [0, 7, *LAST, 0, 9, 2000, 1990, 4, 0]
    sender = [
        1, 7, 10, 40_960, 4,
        999, 900, 2, 1, 4096,
        *LAST[:3], 4, 4096,
        *LAST[:3], 6, 4096,
        1200, 1100, 2, 8, 2048,
        1, 8, 3, 12_288, 0,
    ]  # fmt: skip
    assert senders_at_last_byte([receiver, sender]) == {7: (8, 40_960 - 4096 - 2048)}
    assert senders_at_last_byte([sender, receiver]) == {7: (8, 34_816)}  # whichever worker reports first
    outs = [
        {"transport": [(7, 0, 0, 3, 8192), (9, 0, 0, 0, 0)], "transport_tail": receiver},
        {"transport": [(9, 2, 8192, 0, 0)], "transport_tail": sender},
    ]
    assert merged_transport(outs) == {7: FlowTransport(7, 8, 34_816, 3, 8192), 9: FlowTransport(9, 2, 8192, 0, 0)}


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize("nvlink", ["packet", "fluid"])
def test_a_lossy_replay_keeps_the_last_flows_retransmissions(nvlink: str, tmp_path: Path) -> None:
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.workload import load_workload

    topo = load_topology("testbed16")
    wl_path = tmp_path / "a2a.toml"
    wl_path.write_text(
        'name = "a2a"\n[defaults]\nranks = "all"\ndtype = "bf16"\n'
        '[[op]]\nname = "a2a"\nkind = "all_to_all"\nbytes = "4MiB"\n'
    )
    wl = load_workload(wl_path, world=topo.num_ranks)
    sets = [f"nvlink={nvlink}", "wire=roce4k", f"scheduler={KEYED_SCHEDULER}", "pfc=false", "buffer_bytes=300000",
            "rto_ns=20000", "queue_sample_ns=0"]  # fmt: skip
    cfg = apply_overrides(PacketConfig(cc="dcqcn"), sets)
    replay(wl, topo, cfg, tmp_path / "one", stepper=spawn_stepped)
    replay(wl, topo, dataclasses.replace(cfg, partition=2), tmp_path / "two", stepper=spawn_stepped)
    for name in FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    rows = [r.split(",") for r in (tmp_path / "one" / "flows.csv").read_text().splitlines()[1:]]
    last = max(rows, key=lambda r: int(r[9]))  # the run stops at its completion, its last ACK still to come
    groups = adopted(topo, partition_fabric(topo, 2).groups)
    retx = [int(r[15] or 0) for r in rows]  # (empty for NVLink flows on the fluid side)
    assert int(last[15]) > 0 and groups[int(last[4])] != groups[int(last[5])]
    assert sum(x > 0 for x in retx) > 100
