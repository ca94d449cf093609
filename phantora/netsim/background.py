"""Background traffic (scenario `background`): Poisson flow arrivals at a target load, sizes from a CDF.

Each chosen host starts flows as a Poisson process of rate ``load x NIC rate / (8 x mean size)`` (so each
host offers `load` of its NIC), to a destination drawn uniformly among the other chosen hosts, as HPCC's
traffic_gen does. Sizes come from `phantora.netsim.flowsizes`. The draws use numpy's PCG64 seeded with
(scenario seed or the event's own, event index): the same scenario gives the same flows.
"""

from __future__ import annotations

import numpy as np

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.flowsizes import load_cdf
from phantora.netsim.scenario import Background, Scenario, relocated
from phantora.topology.model import Topology

TAG = "background"


def nic_rate_bps(topo: Topology, node: int) -> int:
    """The rate of an endpoint's fabric NIC: its links to switches (summed), else all its links."""
    to_switch = [topo.channel_bandwidth(ch) for v, ch in topo.neighbours(node) if topo.nodes[v].kind == "switch"]
    return sum(to_switch) or sum(topo.channel_bandwidth(ch) for _, ch in topo.neighbours(node))


def background_flows(sc: Scenario, ev: Background, topo: Topology, first_id: int) -> list[Flow]:
    """The flows of one background event, ids from `first_id`, each delayed to its arrival (submit at 0)."""
    try:
        cdf = load_cdf(ev.cdf, sc.source)
    except InputError as exc:
        if exc.file is not None:
            raise
        raise relocated(exc, sc, ev, "cdf") from None
    ranks = list(ev.hosts) if ev.hosts is not None else list(range(topo.num_ranks))
    nodes = [topo.node_of_rank(r) for r in ranks]
    if len(nodes) < 2:
        raise relocated(InputError("background traffic needs 2+ hosts"), sc, ev, "hosts")
    seed = sc.seed if ev.seed is None else ev.seed
    rng = np.random.default_rng([seed, ev.index])
    assert ev.at_ns is not None and ev.duration_ns is not None
    mean = cdf.mean()
    times: list[np.ndarray] = []
    srcs: list[np.ndarray] = []
    for i, node in enumerate(nodes):
        gap_ns = mean * 8e9 / (ev.load * nic_rate_bps(topo, node))  # mean inter-arrival
        t = _arrivals(rng, gap_ns, ev.duration_ns)
        times.append(t)
        srcs.append(np.full(len(t), i, dtype=np.int64))
    t_all, s_all = np.concatenate(times), np.concatenate(srcs)
    order = np.lexsort((s_all, t_all))
    t_all, s_all = t_all[order], s_all[order]
    d_all = rng.integers(0, len(nodes) - 1, len(t_all))
    d_all = d_all + (d_all >= s_all)  # uniform over the other hosts
    sizes = cdf.sample(rng, len(t_all))
    tag = f"{TAG}/{ev.label}"
    rows = zip(t_all.tolist(), s_all.tolist(), d_all.tolist(), sizes.tolist(), strict=True)
    return [
        Flow(first_id + k, nodes[s], nodes[d], int(n), (), ev.at_ns + int(t), tag, key=first_id + k)
        for k, (t, s, d, n) in enumerate(rows)
    ]


def _arrivals(rng: np.random.Generator, gap_ns: float, window_ns: int) -> np.ndarray:
    """Arrival times (int ns) of a Poisson process of mean gap `gap_ns` in [0, window_ns)."""
    out: list[np.ndarray] = []
    t0 = 0.0
    while True:
        n = int(window_ns / gap_ns * 0.1) + 64
        t = t0 + np.cumsum(rng.exponential(gap_ns, n))
        out.append(t[t < window_ns])
        if t[-1] >= window_ns:
            return np.floor(np.concatenate(out)).astype(np.int64)
        t0 = float(t[-1])


def scenario_background(sc: Scenario, topo: Topology, first_id: int) -> list[Flow]:
    """The flows of every background event of a scenario, numbered from `first_id`."""
    flows: list[Flow] = []
    for ev in sc.background():
        flows += background_flows(sc, ev, topo, first_id + len(flows))
    return flows
