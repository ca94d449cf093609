"""Time never falls as the size grows for a fixed NCCL choice: every nccl-tests test, on two 8-GPU H100 hosts
(testbed16), one 8-GPU H100 host, 4 one-GPU hosts and a PCIe host, with NCCL's default choice and every forced
NCCL_ALGO x NCCL_PROTO that NCCL accepts there (a pair it cannot run is its one-line error, enqueue.cc's "no
algorithm/protocol available"), one call of each size from 8 B to 256 MiB (x2) on the flow network, as
`phantora nccl-tests -n 1 -w 0` times it.

A forced pair still varies its channels with the size (enqueue.cc runs fewer for small sizes), and the default
changes its algorithm and protocol; NCCL's model (latency plus bytes over bandwidth, each pair's own) rises with
the size for each, and its choice is the least of them, so its time does not fall at a switch either: no case is
excluded. The ring LL128 broadcast on testbed16 fell 20.89 / 20.80 / 20.64 µs at 128 / 256 / 512 KiB while the
proxy's turns were netted against NCCL's model transfer instead of the simulated one (proxy.py, shape.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from phantora.collectives import AlgoOptions
from phantora.collectives.nccl.settings import nccl_env
from phantora.errors import InputError
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.report import nccl_tests as nt
from phantora.topology import dgx_host, leaf_spine, load_topology
from phantora.topology.model import Topology

SIZES = [8 << i for i in range(26)]  # 8 B .. 256 MiB
TOPOLOGIES: dict[str, Callable[[], Topology]] = {
    "testbed16": lambda: load_topology("testbed16"),
    "h100x8": lambda: dgx_host(8, gpu="h100"),
    "4x1gpu": lambda: leaf_spine(2, 2, 1, gpus_per_host=1, gpu="h100"),
    "pcie8_2s": lambda: load_topology("pcie8_2s"),
}
ALGOS = ("Ring", "Tree", "NVLS", "NVLSTree", "PAT", "CollnetDirect", "CollnetChain")
PROTOS = ("LL", "LL128", "Simple")
P2P_TESTS = ("alltoall_perf", "sendrecv_perf")  # NCCL_ALGO does not apply to send/recv
REFUSED = "no NCCL algorithm/protocol available"


def _envs(test: str) -> list[dict[str, str]]:
    if test in P2P_TESTS:
        return [{}] + [{"NCCL_PROTO": p} for p in PROTOS]
    return [{}] + [{"NCCL_ALGO": a, "NCCL_PROTO": p} for a in ALGOS for p in PROTOS]


def _curve(topo: Topology, test: str, env: dict[str, str]) -> list[tuple[int, float, str]] | None:
    """(size, time ns, choice) of one call of each size; None where NCCL refuses the forced pair at every size."""
    spec = nt.find_test(test)
    ranks = tuple(range(topo.num_ranks))
    bench = nt.Bench(spec, topo, ranks, "float", iters=1, warmup=0, opts=AlgoOptions(nccl_env=nccl_env(env)))
    sim = make_engine(EngineSpec(network="flow"), topo)
    out: list[tuple[int, float, str]] = []
    refused = 0
    try:
        for size in SIZES:
            try:
                r = nt.bench_size(bench, sim, size)
            except InputError as e:
                assert REFUSED in str(e), f"{test} {env} at {size} B: {e}"
                refused += 1
                continue
            c = r.choice or {}
            out.append((size, r.time_ns, f"{c.get('algorithm')}/{c.get('protocol')}/{c.get('channels')}"))
    finally:
        sim.close()
    assert refused in (0, len(SIZES)), f"{test} {env}: NCCL refuses {refused} of {len(SIZES)} sizes"
    return out if out else None


@pytest.mark.parametrize("test", list(nt.TESTS))
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_time_never_falls_as_size_grows(name: str, test: str) -> None:
    topo = TOPOLOGIES[name]()
    ran = 0
    drops: list[str] = []
    for env in _envs(test):
        curve = _curve(topo, test, env)
        if curve is None:
            assert env, f"{test} on {name}: NCCL's default refused"
            continue
        ran += 1
        for (s0, t0, c0), (s1, t1, c1) in zip(curve, curve[1:], strict=False):
            if t1 < t0:
                drops.append(f"{env or 'default'}: {s0} B {t0 / 1000:.3f} us ({c0}) > {s1} B {t1 / 1000:.3f} us ({c1})")
    assert ran >= 2, f"{test} on {name}: only {ran} choices ran"
    assert not drops, "\n".join(drops)
