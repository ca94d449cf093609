"""NCCL's rings through NVSwitch hosts with P2P on and one NIC per GPU (nccl/nvswitch_rings.py).

search.cc (v2.19.4-1 to v2.30.7-1): found channel c starts at NIC c mod NICs (`ncclTopoSearchRecNet`, the NICs by
their GPUs' index), enters at that NIC's GPU, tries each GPU's previous first (`ncclTopoSearchNextGpuSort` with an
NVSwitch), and must leave the last GPU by the NIC it entered by (crossNic 0, `ncclTopoSearchCheckNet`) over a path
within the search's typeInter, PIX first: on the DGX-like layout (two GPUs and their NICs per PCIe switch) the last
GPU is the entry GPU's switch-mate. So every hop between hosts joins NIC c mod 8 on both hosts: one rail, for any
number of hosts. Expected values are those rules and closed forms, not phantora's output.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.nvswitch_rings import found_rings, host_order, switch_of
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import leaf_spine, rail_optimized
from phantora.topology.model import Topology

MiB = 1 << 20
M = 8  # GPUs (and NICs) per host
NIC_GBS = 50.0  # 400 Gb/s
RING = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def _slow_spines(hosts: int) -> Topology:
    """`hosts` DGX-like H100 hosts on 8 rails of 400G NICs, each rail leaf's uplinks 100G (a quarter of a rail)."""
    return rail_optimized(hosts, M, spines=8, nic_rate="400Gbps", uplink_rate="100Gbps", gpu="h100")


def _dag(
    topo: Topology, kind: str, nbytes: int, root: int | None = None, gran: str = "coarse", version: str = ""
) -> object:
    coll = Collective(kind, tuple(range(topo.num_ranks)), nbytes, "fp32", root=root)
    env = {"NCCL_ALGO": "Ring"} if kind in ("broadcast", "reduce") else dict(RING)
    if version:
        env["PHANTORA_NCCL_VERSION"] = version
    return decompose(coll, topo, AlgoOptions(granularity=gran, nccl_env=nccl_env(env)))


def _between_hosts(topo: Topology, flows: list) -> list:
    return [f for f in flows if f.size and topo.nodes[f.src].host != topo.nodes[f.dst].host]


def _through_spines(topo: Topology, flows: list) -> list:
    """The flows whose route climbs above the rail leaves."""
    return [
        f
        for f in flows
        if any(topo.nodes[topo.channel_ends(ch)[1]].tier >= 2 for ch in topo.route(f.src, f.dst, f.key or f.id))
    ]


def _channel(f: object) -> int:
    return int(f.tag.split("/")[1].removeprefix("ch"))  # type: ignore[attr-defined]


def test_a_host_is_entered_by_the_channels_gpu_and_left_by_its_switch_mate() -> None:
    """GPU e's previous first: e, e-1, ..., e+1 ends on e's switch-mate for an even e ("0 7 6 5 4 3 2 1" in NCCL's
    logs); for an odd e the descent ends on another switch, so the search goes up: e, e+1, ..., e-1."""
    switch = switch_of(range(M))
    assert switch == [0, 0, 1, 1, 2, 2, 3, 3]
    assert host_order(switch, 0) == [0, 7, 6, 5, 4, 3, 2, 1]
    assert host_order(switch, 1) == [1, 2, 3, 4, 5, 6, 7, 0]
    for e in range(M):
        order = host_order(switch, e)
        step = (order[1] - order[0]) % M
        assert order[0] == e and order[-1] == e ^ 1
        assert step == (M - 1 if e % 2 == 0 else 1) and all(
            (b - a) % M == step for a, b in zip(order, order[1:], strict=False)
        )


def test_later_channels_enter_by_their_own_gpu_from_2_28_and_replay_before() -> None:
    """16 found channels on 8 GPUs, channel c on NIC c mod 8. From v2.28.3-1 channel c enters at NIC c's own GPU
    (`net->net.localGpu`). Before, with sameChannels 0 too, an odd channel 2k+1 replays channel 2k's GPUs (2k, 2k-1,
    ..., 2k+1) from NIC 2k+1, on the same switch; an even one starts at GPU 2k (the closest from c mod 8 on)."""
    switch = switch_of(range(M))
    new, old = found_rings(switch, 16, (2, 30)), found_rings(switch, 16, (2, 27))
    assert [r.nic for r in new] == [r.nic for r in old] == [c % M for c in range(16)]
    assert [r.order[0] for r in new] == [c % M for c in range(16)]
    assert [r.order for r in old] == [tuple((c % M // 2 * 2 - k) % M for k in range(M)) for c in range(16)]
    assert all(switch[r.order[-1]] == switch[r.nic] for r in [*new, *old])


def test_gpus_without_a_switch_mate_descend() -> None:
    """A communicator of GPUs 0, 2, 4, 6: no two on a switch, so no ring ends within PIX; at PXN (the last GPU
    relays over NVLink to the entry GPU's NIC) the first tried, each GPU's previous, holds."""
    switch = switch_of([0, 2, 4, 6])
    assert [host_order(switch, e) for e in range(4)] == [[(e - k) % 4 for k in range(4)] for e in range(4)]


@pytest.mark.parametrize(("hosts", "gran", "version"), [(2, "coarse", ""), (3, "coarse", ""), (3, "chunked", ""),
                                                        (3, "coarse", "2.27.3"), (2, "chunked", "2.27.3")])  # fmt: skip
def test_ring_all_reduce_stays_on_the_channels_rail(hosts: int, gran: str, version: str) -> None:
    """No flow between hosts crosses a spine; channel c (16 of them: 8 found, each doubled, `chain_of` c mod 8)
    leaves and enters every host by NIC c mod 8, under NCCL 2.27's search too; each of the hosts x 8 NICs sends 2
    (n-1)/n x S / 8 (two channels of S / 16, each hop 2 (n-1)/n of it), up to the bytes the slices and NCCL's loops
    round (a few hundred)."""
    topo = _slow_spines(hosts)
    n, nbytes = topo.num_ranks, 64 * MiB
    dag = _dag(topo, "all_reduce", nbytes, gran=gran, version=version)
    assert dag.choice is not None and dag.choice["channels"] == 16
    flows = _between_hosts(topo, dag.flows)
    assert flows and _through_spines(topo, flows) == []
    assert {(_channel(f), f.src % M, f.dst % M) for f in flows} == {(c, c % M, c % M) for c in range(16)}
    sent: dict[int, int] = defaultdict(int)
    got: dict[int, int] = defaultdict(int)
    for f in flows:
        if not is_credit(f):  # the steps' bytes (the clear-to-sends going back stay on the rail too, above)
            sent[f.src] += f.size
            got[f.dst] += f.size
    each = 2 * (n - 1) / n * nbytes / M
    assert len(sent) == len(got) == hosts * M
    assert all(v == pytest.approx(each, rel=2e-5) for v in [*sent.values(), *got.values()])


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_ring_chains_on_three_hosts_stay_on_rails(kind: str) -> None:
    """A broadcast's and a reduce's chains are the channels' rings opened at the root: on 3 hosts every hop between
    hosts joins one rail, channel c's."""
    topo = _slow_spines(3)
    flows = _between_hosts(topo, _dag(topo, kind, 64 * MiB, root=5).flows)
    assert flows and _through_spines(topo, flows) == []
    assert all(f.src % M == f.dst % M == _channel(f) % M for f in flows)


def test_three_hosts_on_slow_spines_run_at_the_rails_closed_form() -> None:
    """The flows of a 256 MiB ring all-reduce on 3 hosts, NCCL's delays and rate caps taken off, on spines at a
    quarter of a rail: every NIC sends and receives 2 (n-1)/n x S / 8 at 50 GB/s, so the network takes that over
    the NIC rate (phantora's alternating rings crossed the spines on the hop back to the first host). With NCCL's
    caps on, the slow spines change nothing: the same end as on a non-blocking fabric."""
    topo = _slow_spines(3)
    n, nbytes = topo.num_ranks, 256 * MiB
    dag = _dag(topo, "all_reduce", nbytes)
    bare = [dataclasses.replace(f, rate_bps=0, delay_ns=0) for f in dag.flows]
    rail_us = 2 * (n - 1) / n * nbytes / M / (NIC_GBS * 1e3)
    assert _end_us(topo, bare) == pytest.approx(rail_us, rel=0.005)
    fast = rail_optimized(3, M, spines=8, nic_rate="400Gbps", uplink_rate="400Gbps", gpu="h100")
    assert _end_us(topo, dag.flows) == pytest.approx(_end_us(fast, _dag(fast, "all_reduce", nbytes).flows), rel=1e-9)


def test_one_leaf_per_host_runs_the_same_rings() -> None:
    """NCCL's search does not see the fabric: on one leaf per host channel c still joins NIC c mod 8 of each host."""
    topo = leaf_spine(3, M, 4, gpus_per_host=M, nic_rate="400Gbps", uplink_rate="800Gbps", gpu="h100")
    flows = _between_hosts(topo, _dag(topo, "all_gather", 24 * MiB).flows)
    assert {(_channel(f), f.src % M, f.dst % M) for f in flows} == {(c, c % M, c % M) for c in range(16)}


def _end_us(topo: Topology, flows: list) -> float:
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000
