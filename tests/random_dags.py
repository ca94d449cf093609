"""Flow DAGs over NVLink and the fabric, for tests that hold an engine to another on any traffic (the hybrid, the
fluid side split by host, partition workers): one random generator and one ring across testbed16's hosts, as
tests/stars.py is one star."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from phantora.netsim.base import Completion, Flow
from phantora.topology.generators import rail_optimized
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology

MIB = 1 << 20
CAPS = (0, 100_000_000_000, 400_000_000_000, 2_000_000_000_000)  # rate caps, bits/s (0: none)


def gpus_by_host(topo_name: str | Topology) -> list[list[int]]:
    """The GPU node ids of each host of a topology (or a named one), hosts in order."""
    topo = load_topology(topo_name) if isinstance(topo_name, str) else topo_name
    hosts: dict[int, list[int]] = {}
    for v, n in enumerate(topo.nodes):
        if n.kind == "gpu" and n.host is not None:
            hosts.setdefault(n.host, []).append(v)
    return [hosts[h] for h in sorted(hosts)]


def random_dag(
    rng: random.Random,
    hosts: list[list[int]],
    first: int,
    n: int,
    before: Sequence[int],
    *,
    markers: float,
    wide: float,
) -> list[Flow]:
    """`n` flows (ids from `first`): markers (no bytes, a share `markers`), NVLink pairs inside a host (0.6) and
    fabric pairs between hosts (the rest), capped or not (`CAPS`); each after 0-3 earlier flows of the batch or of
    `before` (flows of an earlier batch, any host, any side), or (a share `wide`) after 16-24 of them: a wide list."""
    flows: list[Flow] = []
    for i in range(n):
        kind = rng.random()
        h = rng.randrange(len(hosts))
        src = rng.choice(hosts[h])
        if kind < markers:
            dst, size = src, 0
        elif kind < markers + 0.6:
            dst = rng.choice([g for g in hosts[h] if g != src])
            size = rng.choice([4096, MIB, rng.randint(1, 3 * MIB)])
        else:
            dst = rng.choice(hosts[(h + rng.randint(1, len(hosts) - 1)) % len(hosts)])
            size = rng.choice([65_536, MIB, rng.randint(1, 2 * MIB)])
        pool = [f.id for f in flows] + list(before)
        if pool and rng.random() < wide:
            deps = tuple(rng.sample(pool, min(len(pool), rng.randint(16, 24))))
        else:
            deps = tuple(rng.sample(pool, min(len(pool), rng.randint(0, 3)))) if pool else ()
        cap = rng.choice(CAPS) if size else 0
        flows.append(Flow(first + i, src, dst, size, deps, rng.randint(0, 2_000), rate_bps=cap))
    return flows


def tiny_rails() -> Topology:
    """3 hosts x 2 GPUs on 2 rails, every link 100 Gb/s and 1 us: the decomposition tests' fabric (a piece a rail)."""
    return rail_optimized(3, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="rail-3x2")


def on_rails(flows: list[Flow], hosts: list[list[int]]) -> list[Flow]:
    """`flows` with each fabric flow's destination moved to its source's rail (one decomposition piece a rail)."""
    where = {g: (h, r) for h, gs in enumerate(hosts) for r, g in enumerate(gs)}
    out = []
    for f in flows:
        (hs, rs), (hd, _) = where[f.src], where[f.dst]
        out.append(f if hs == hd else dataclasses.replace(f, dst=hosts[hd][rs]))
    return out


def rail_batches(rng: random.Random, n: int) -> tuple[list[Flow], list[Flow]]:
    """Two random DAGs of `n` flows on `tiny_rails` (markers and wide lists a tenth each), the second's ids after the
    first's and its deps among them, every fabric flow on its source's rail."""
    hosts = gpus_by_host(tiny_rails())
    first = on_rails(random_dag(rng, hosts, 0, n, (), markers=0.1, wide=0.1), hosts)
    second = on_rails(random_dag(rng, hosts, n, n, [f.id for f in first], markers=0.1, wide=0.1), hosts)
    return first, second


def run_batches(sim: Any, first: list[Flow], second: list[Flow], at_ns: int = 30_000) -> list[Completion]:
    """The engine `sim` given `first` at 0, advanced to `at_ns`, given `second` there, and drained: every completion."""
    sim.submit(first, 0)
    done = list(sim.advance(at_ns))
    sim.submit(second, at_ns)
    return done + list(sim.drain())


def ring_step(g: list[int], base: int, step: int, fid: int, last: dict[tuple[int, int], tuple[int, ...]]) -> list[Flow]:
    """Step `step` of the ring gpu `base` -> `base` + 1 -> `base` + 9 -> `base` + 8 -> `base` over testbed16's GPUs
    `g` (an NVLink hop in each host, two hops across them), ids from `fid`: 256 KiB a hop on even steps, 512 KiB on
    odd ones, each after the ring's hop before it (`last`: (base, hop) -> that hop's id, updated)."""
    hops = [(g[base], g[base + 1]), (g[base + 1], g[base + 9]), (g[base + 9], g[base + 8]), (g[base + 8], g[base])]
    out = []
    for k, (src, dst) in enumerate(hops):
        out.append(Flow(fid + k, src, dst, (256 << 10) * (1 + step % 2), deps=last.get((base, k - 1), ())))
        last[(base, k)] = (fid + k,)
    last[(base, -1)] = last[(base, 3)]
    return out
