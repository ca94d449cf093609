"""A torch program's grouped send/recv on a PCIe host is rated as `phantora nccl-tests sendrecv_perf` rates its
group: the pairs of one launch on one communicator share the host's links (bridge/p2p_batch.py,
`Collective.inflight`, nccl/pci_p2p.py). Closed forms: with NCCL_P2P_DISABLE=1 every pair is SHM and climbs its
socket's switch uplink (x16 Gen4, 24 GB/s): 8 pairs under one switch get 24 / 8 = 3 GB/s each, 4 a socket on two
sockets 24 / 4 = 6 (b313b15, tests/test_nccl_pcie_p2p_caps.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from bridge.core import DONE, CoordinatorCore
from bridge.protocol import INF_NS, Message, decode, encode
from phantora.collectives import AlgoOptions
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.report import nccl_tests as nt
from phantora.topology import pcie_host

MiB = 1 << 20
T0 = 1_000
P2P_OFF = AlgoOptions(nccl_env=nccl_env({"NCCL_P2P_DISABLE": "1"}))
ROOT = Path(__file__).resolve().parents[1]


def ring_times(topo: Any, algo: AlgoOptions, nbytes: int, grouped: bool = True) -> dict[int, int]:
    """Each rank's time (ns) for a send to r + 1 and a receive from r - 1 issued together at T0 through the
    coordinator, as `batch_isend_irecv` issues them (on the world's communicator when `grouped`)."""
    n = topo.num_ranks
    sent: dict[int, list[Message]] = {r: [] for r in range(n)}
    core = CoordinatorCore(
        FlowSimulator(topo), topo, n, window_ns=0, algo=algo, send=lambda r, raw: sent[r].append(decode(raw))
    )

    def msg(rank: int, type_: str, t: int = T0, **fields: Any) -> None:
        core.on_message(rank, decode(encode(type_, t, **fields)))

    comm = {"comm": list(range(n))} if grouped else {}
    for r in range(n):
        msg(r, "p2p", h=1, peer=(r + 1) % n, send=True, tag=0, seq=0, nbytes=nbytes, name="", **comm)
        msg(r, "p2p", h=2, peer=(r - 1) % n, send=False, tag=0, seq=0, nbytes=nbytes, name="", **comm)
    done: dict[int, dict[int, int]] = {r: {} for r in range(n)}  # rank -> handle -> its end, as the ranks learn them
    seen = dict.fromkeys(range(n), 0)
    for _ in range(8):  # a rank waits for whichever of its two is not in yet, and finishes once both are
        for r in range(n):
            if seen[r] == len(sent[r]) and core.ranks[r].state != DONE:
                now = max(done[r].values(), default=T0)
                missing = [h for h in (1, 2) if h not in done[r]]
                if missing:
                    msg(r, "wait", now, handles=missing, until=INF_NS)
                else:
                    msg(r, "finish", now, results={}, cpu_s=0.0)
        if all(len(d) == 2 for d in done.values()) and all(core.ranks[r].state == DONE for r in range(n)):
            break
        core.progress()
        for r in range(n):
            for m in sent[r][seen[r] :]:
                if m.type == "result":
                    done[r].update((h, t) for h, t in m["done"])
            seen[r] = len(sent[r])
    assert all(len(d) == 2 for d in done.values()), done
    return {r: max(d.values()) - T0 for r, d in done.items()}


def sendrecv_perf_ns(topo: Any, algo: AlgoOptions, nbytes: int) -> int:
    """One call of nccl-tests' sendrecv_perf on the idle flow network (phantora nccl-tests' own iteration)."""
    spec = nt.TESTS["sendrecv_perf"]
    it = nt.build_iteration(spec, tuple(range(topo.num_ranks)), nbytes, "uint8", 0, topo, algo, 0, "t")
    return nt.run_iteration(FlowSimulator(topo), it)


@pytest.mark.parametrize(("sockets", "rate"), [(1, 3e9), (2, 6e9)])
def test_a_grouped_ring_on_a_pcie_host_takes_sendrecv_perfs_time(sockets: int, rate: float) -> None:
    """64 MiB a pair, P2P off: every rank ends when nccl-tests' call does, at the pairs' share of the uplink (24 / 8
    GB/s on one switch, 24 / 4 on two sockets), plus NCCL's latency (under 100 us). Before, each pair was rated
    alone at the x16's 24 GB/s."""
    topo = pcie_host(8, sockets=sockets)
    nbytes = 64 * MiB
    want = sendrecv_perf_ns(topo, P2P_OFF, nbytes)
    got = ring_times(topo, P2P_OFF, nbytes)
    assert set(got.values()) == {want}
    assert nbytes / rate * 1e9 <= want < nbytes / rate * 1e9 + 100_000


def test_the_slowest_pair_bounds_both_with_p2p_on_two_sockets() -> None:
    """P2P on, two Ice Lake sockets: the pairs 3 -> 4 and 7 -> 0 cross the 10 GB/s CPU link, one each way, and
    bound nccl-tests' call; the ranks at their ends take that time, the others less."""
    topo = pcie_host(8, sockets=2)
    nbytes = 64 * MiB
    want = sendrecv_perf_ns(topo, AlgoOptions(), nbytes)
    got = ring_times(topo, AlgoOptions(), nbytes)
    assert max(got.values()) == want and {r for r, t in got.items() if t == want} == {0, 3, 4, 7}
    assert nbytes / 10e9 * 1e9 <= want < nbytes / 10e9 * 1e9 + 100_000


def test_a_lone_pair_is_not_rated_with_the_others() -> None:
    """Sends and receives on their own 2-rank communicators are no group: each pair keeps the x16's 24 GB/s."""
    topo = pcie_host(8)
    nbytes = 64 * MiB
    got = ring_times(topo, P2P_OFF, nbytes, grouped=False)
    assert all(nbytes / 24e9 * 1e9 <= t < nbytes / 24e9 * 1e9 + 100_000 for t in got.values())


@pytest.mark.slow
def test_collective_perf_sendrecv_on_a_pcie_host_takes_nccl_tests_gpu_time(tmp_path: Path) -> None:
    """examples/collective_perf.py's send/recv ring (one batch_isend_irecv group) on 8 PCIe A100s under one switch,
    P2P off, takes nccl-tests' sendrecv_perf time less the host's launch of its first call over the calls (as
    tests/test_torch_collective_perf.py checks on NVLink hosts). Slow: a live run of 8 ranks."""
    from phantora.launcher import RunConfig, launch
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    topo = pcie_host(8)
    iters, warmup = 4, 1
    args = ["--ops", "sendrecv", "-b", "1M", "-e", "64M", "-f", "64", "-n", str(iters), "-w", str(warmup)]
    cfg = RunConfig(
        str(ROOT / "examples" / "collective_perf.py"), args, topo, nproc=8, tensors="phantom",
        out_dir=tmp_path, timeout_s=600, env={"NCCL_P2P_DISABLE": "1"},
    )  # fmt: skip
    rows = re.findall(r"^\s*(\w+)\s+(\d+)\s+\d+\s+([0-9.]+)\s", launch(cfg).logs["rank 0"], re.M)
    times = {int(size): float(us) for op, size, us in rows if op == "sendrecv"}
    assert sorted(times) == [MiB, 64 * MiB]
    for size, us in times.items():
        bench = nt.Bench(nt.TESTS["sendrecv_perf"], topo, tuple(range(8)), "float", iters=iters, warmup=warmup)
        bench.opts = P2P_OFF
        sim = make_engine(EngineSpec(), topo)
        try:
            res = nt.bench_size(bench, sim, size)
        finally:
            sim.close()
        assert res.choice is not None
        launch_ns = 4260 + 32 * res.choice["channels"]
        assert us == pytest.approx((res.time_ns - launch_ns / iters) / 1e3, abs=0.006), size
        assert res.nbytes / (res.time_ns / 1e9) < 3.01e9 or size < 64 * MiB  # the uplink's share, 24 / 8
