"""ns-3 routes a flow through the NICs by its own field (`Flow.via_nic` -> AddFlow's `viaNic`, the packet
header's `viaNic`), not by bit 62 of its ECMP key word, which a queue pair index of 64 or more sets too
(collectives/dag.py puts the QP in bits 56-62; NCCL_IB_QPS_PER_CONNECTION goes to 128).

GPUs 3 and 4 of host 0 of `rail_optimized(2, 8, 2)` share the host's NVSwitch and have a 400G NIC each on
different rails: over the NVSwitch a flow takes 2 channels (GPU -> NVSwitch -> GPU), through the NICs 4 (its rail
leaf, a spine, the peer's rail leaf). With no other traffic a data channel carries exactly its flow's wire bytes:
its payload plus one 48-byte header a 1000-byte packet (ACKs go the other way, on the reverse channels)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from phantora.netsim.base import Flow
from phantora.topology import rail_optimized
from phantora.topology.ecmp import NIC_HASH_BIT

QP64 = 64 << 56  # queue pair 64 in the key's bits 56-62 (dag.py `qp << 56`)
KEY = 7 | QP64
SIZE = 2_000_000
PAYLOAD, HEADER = 1000, 48
WIRE = SIZE + -(-SIZE // PAYLOAD) * HEADER
SRC, DST = 3, 4


def _flows() -> list[Flow]:
    """Flow 0 over the NVSwitch with QP 64 in its key; flow 1, the same key, through the NICs."""
    return [Flow(0, SRC, DST, SIZE, key=KEY), Flow(1, SRC, DST, SIZE, key=KEY, via_nic=True)]


def _kinds(topo: Any, path: list[int]) -> list[str]:
    """The kinds of the nodes a path enters, in order."""
    return [topo.nodes[topo.channel_ends(ch)[1]].kind for ch in path]


def _check_channels(topo: Any, usage: dict[int, int]) -> None:
    """Each flow's data channels carry its wire bytes: flow 0 the NVSwitch route's, flow 1 the NIC route's."""
    nvl, nic = topo.route(SRC, DST, KEY, False), topo.route(SRC, DST, KEY, True)
    assert _kinds(topo, nvl) == ["nvswitch", "gpu"]
    assert _kinds(topo, nic) == ["switch", "switch", "switch", "gpu"]
    assert {ch: usage.get(ch, 0) for ch in nvl} == dict.fromkeys(nvl, WIRE)
    assert {ch: usage.get(ch, 0) for ch in nic} == dict.fromkeys(nic, WIRE)


def test_the_queue_pair_sets_the_bit_the_routing_read() -> None:
    """The case this covers: QP 64 alone sets bit 62, the bit ns-3 took for "through the NICs"."""
    assert KEY & NIC_HASH_BIT and not Flow(0, SRC, DST, SIZE, key=KEY).via_nic


@pytest.mark.ns3
def test_ns3_sends_a_qp64_flow_over_the_nvswitch_and_a_via_nic_flow_through_the_nics(ns3_lib: Any) -> None:
    """In-process ns-3 (both flows in one AddFlows call): its own route table puts flow 0 on the NVSwitch and flow
    1 through the NICs, as the Python topology does, and the packets go there."""
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig

    topo = rail_optimized(2, 8, 2)
    with Ns3Simulator(topo, PacketConfig()) as sim:
        assert sim._add_packed  # the flows go in one AddFlows call (9 words a flow)
        assert sim.route(SRC, DST, KEY, via_nic=False) == topo.route(SRC, DST, KEY, False)
        assert sim.route(SRC, DST, KEY, via_nic=True) == topo.route(SRC, DST, KEY, True)
        sim.submit(_flows(), at=0)
        done = sim.drain()
        usage = {u.channel: u.bytes for u in sim.channel_usage()}
    assert sorted(c.flow_id for c in done) == [0, 1]
    _check_channels(topo, usage)


@pytest.mark.ns3
def test_the_runner_replays_the_route_from_the_call_script(tmp_path: Path) -> None:
    """phantora-ns3-runner: a call script's AddFlow lines carry VIA_NIC (version 2), and the runner's packets take
    the same channels. A version 1 script (no VIA_NIC word; a flow through the NICs then had bit 62 in its key, as
    ns3_key still sets it) replays to the same fct.txt; a script without a header, or of an unknown version, is
    refused in one line naming the header."""
    pytest.importorskip("ns3", reason="the ns3 wheel is not installed")
    from phantora.netsim import ns3_build
    from phantora.netsim.packet_config import PacketConfig
    from phantora.netsim.runner_engine import RunnerNetwork

    topo = rail_optimized(2, 8, 2)
    script = tmp_path / "calls.txt"
    net = RunnerNetwork(topo, PacketConfig(), script)
    net.submit(_flows(), at=0)
    records = net.run()
    assert sorted(c.flow_id for c in records.done) == [0, 1]
    _check_channels(topo, {u.channel: u.bytes for u in records.channel_usage(records.now)})

    lines = script.read_text().splitlines()
    assert lines[0].startswith("# phantora ns-3 call script 2:")
    adds = [line.split() for line in lines if line.startswith("AddFlow ")]
    assert [(w[1], w[7], w[10]) for w in adds] == [("0", str(KEY), "0"), ("1", str(KEY | NIC_HASH_BIT), "1")]

    # version 1: flow 0 with a key of its own (bit 62 clear: the QP 64 key would have read as a NIC flow then)
    v2 = [line.replace(f" {KEY} ", " 7 ", 1) if line.startswith("AddFlow 0 ") else line for line in lines]
    v1 = [lines[0].replace("script 2:", "script 1:")]
    for line in v2[1:]:
        words = line.split()
        v1.append(" ".join(words[:10] + words[11:]) if words and words[0] == "AddFlow" else line)
    runner = str(ns3_build.runner_path())
    fcts = []
    for name, text in (("v2", v2), ("v1", v1)):
        (tmp_path / f"{name}.txt").write_text("\n".join(text) + "\n")
        proc = subprocess.run([runner, str(tmp_path / f"{name}.txt"), str(tmp_path / name)], capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        fcts.append((tmp_path / name / "fct.txt").read_text())
    assert fcts[0] == fcts[1] and len(fcts[0].splitlines()) == 2

    v3 = lines[0].replace("script 2:", "script 3:")
    for first, why in ((v3, "header version '3'"), ("", "no call script header")):
        bad = tmp_path / "bad.txt"
        bad.write_text("\n".join([first, *lines[1:]]) + "\n")
        proc = subprocess.run([runner, str(bad), str(tmp_path / "o")], capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
        assert f"{bad}:1: " in proc.stderr and why in proc.stderr, proc.stderr
