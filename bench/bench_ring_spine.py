"""Where a chunked Simple ring all-reduce parts from coarse on a leaf-spine: the spine links ECMP overloads.

A ring's network connections hash onto the spines (each connection its own ECMP key), so on testbed16 (2 hosts x 8
H100, 4 spines at 800G) some spine link carries six of them. Each row decomposes one `NCCL_ALGO=Ring
NCCL_PROTO=Simple` all-reduce of all the topology's GPUs under NCCL's choice, coarse and chunked, runs both on
the idle flow network and prints their ends (µs, from the call's start: `phantora nccl-tests` adds its launch),
the chunked run's excess over coarse, and:

- `chain`: the chunked call's first delay plus its longest chain on an idle network without any link shared
  (`idle_chain.critical_chains_ns`, as the delay nets it): what it takes where no flows meet;
- `con`, `spine`: the busiest spine link (by bytes) of the coarse run: the connections on it and its bytes at its
  rate (µs), the least time it is busy (the chunked run puts the same data on it);
- `delay`: the call's first delay, coarse / chunked (µs): NCCL's latency less what each nets (coarse a path's
  propagation, chunked its longest chain's propagation and credits: `nccl/shape.py`).

Each topology is also run with uplinks as wide as a leaf's NICs together (`fat`: no spine link overloaded).

    .venv/bin/python bench/bench_ring_spine.py [--sizes 1,4,16,64,256]

Simulated figures, deterministic; about 35 s of CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

import phantora.collectives.nccl.shape as shape_module
from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_cts
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology
from phantora.topology.generators import leaf_spine

MiB = 1 << 20
ENV = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})


def testbed(hosts: int, fat: bool) -> Topology:
    """testbed16's leaf-spine (a host of 8 H100 on each leaf, a 400G NIC a GPU, 4 spines, 1 µs links) with `hosts`
    leaves, the uplinks at 800G or, `fat`, at 3.2T (8 x 400G over 4 spines: no spine link below a leaf's NICs)."""
    return leaf_spine(
        hosts,
        8,
        4,
        nic_rate="400Gbps",
        uplink_rate="3200Gbps" if fat else "800Gbps",
        latency="1us",
        gpus_per_host=8,
        nvlink_latency="25ns",
    )


def run(topo: Topology, nbytes: int, granularity: str) -> tuple[list[Flow], float, int, float]:
    """The call's shaped flows, its end on the idle flow network, its first delay and (chunked) that delay plus its
    idle chain (0 coarse), in ns."""
    chains: list[tuple[float, float]] = []
    original = shape_module.critical_chains_ns

    def kept(*args: Any, **kwargs: Any) -> tuple[float, float]:
        chains.append(original(*args, **kwargs))
        return chains[-1]

    shape_module.critical_chains_ns = kept
    try:
        coll = Collective("all_reduce", tuple(range(topo.num_ranks)), nbytes, "fp32")
        flows = decompose(coll, topo, AlgoOptions(granularity=granularity, nccl_env=ENV)).flows
    finally:
        shape_module.critical_chains_ns = original
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    end = max(c.end_ns for c in sim.drain())
    delay = max(f.delay_ns for f in flows if not f.deps and not is_cts(f))
    return flows, end, delay, delay + chains[0][0] if chains else 0.0


def spine_channels(topo: Topology, flows: list[Flow]) -> dict[int, list[Flow]]:
    """Each directed link (channel id) with a spine at one end -> the flows of bytes that cross it."""
    out: dict[int, list[Flow]] = defaultdict(list)
    for f in flows:
        if f.size <= 0 or f.src == f.dst:
            continue
        for c in topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic):
            link = topo.links[c >> 1]
            if topo.nodes[link.a].tier == 2 or topo.nodes[link.b].tier == 2:
                out[c].append(f)
    return out


def row(name: str, topo: Topology, nbytes: int) -> str:
    """One size on one topology, as the module's docstring says."""
    coarse, t_coarse, d_coarse, _ = run(topo, nbytes, "coarse")
    _, t_chunked, d_chunked, chain = run(topo, nbytes, "chunked")
    on = spine_channels(topo, coarse)
    link, busiest = max(on.items(), key=lambda kv: (sum(f.size for f in kv[1]), -kv[0]))
    load = sum(f.size for f in busiest) * 8e9 / topo.links[link >> 1].bandwidth_bps / 1e3
    conns = {(f.src, f.dst, f.key) for f in busiest}
    return (
        f"{name:<14} {nbytes // MiB:>4} MiB {t_coarse / 1e3:>9.2f} {t_chunked / 1e3:>9.2f}"
        f" {100 * (t_chunked / t_coarse - 1):>+6.1f}% {chain / 1e3:>9.2f} {len(conns):>3} {load:>9.2f}"
        f" {d_coarse / 1e3:>9.2f} {d_chunked / 1e3:>9.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16,64,256", help="MiB, comma-separated")
    sizes = [int(s) * MiB for s in ap.parse_args().sizes.split(",")]
    print(f"{'topology':<14} {'size':>8} {'coarse':>9} {'chunked':>9} {'gap':>7} {'chain':>9} {'con':>3} {'spine':>9}"
          f" {'delay co':>9} {'delay ch':>9}")  # fmt: skip
    for hosts in (2, 4):
        for fat in (False, True):
            name = f"{hosts} hosts{' fat' if fat else ''}"
            topo = testbed(hosts, fat)
            for nbytes in sizes:
                print(row(name, topo, nbytes), flush=True)


if __name__ == "__main__":
    main()
