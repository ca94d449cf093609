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

from bridge.core import DONE, RUN, CoordinatorCore
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


def ring_times(
    topo: Any,
    algo: AlgoOptions,
    nbytes: int,
    grouped: bool = True,
    issue: dict[int, int] | None = None,
    order: list[int] | None = None,
) -> dict[int, int]:
    """Each rank's time (ns) for a send to r + 1 and a receive from r - 1 issued together at T0 (or T0 + `issue`[r])
    through the coordinator, as `batch_isend_irecv` issues them (on the world's communicator when `grouped`), the
    ranks' messages arriving in `order` (default: rank order)."""
    n = topo.num_ranks
    issue = issue or {}
    sent: dict[int, list[Message]] = {r: [] for r in range(n)}
    core = CoordinatorCore(
        FlowSimulator(topo), topo, n, window_ns=0, algo=algo, send=lambda r, raw: sent[r].append(decode(raw))
    )

    def msg(rank: int, type_: str, t: int = T0, **fields: Any) -> None:
        core.on_message(rank, decode(encode(type_, t, **fields)))

    comm = {"comm": list(range(n))} if grouped else {}
    for r in order or range(n):
        t = T0 + issue.get(r, 0)
        msg(r, "p2p", t, h=1, peer=(r + 1) % n, send=True, tag=0, seq=0, nbytes=nbytes, name="", **comm)
        msg(r, "p2p", t, h=2, peer=(r - 1) % n, send=False, tag=0, seq=0, nbytes=nbytes, name="", **comm)
    done: dict[int, dict[int, int]] = {r: {} for r in range(n)}  # rank -> handle -> its end, as the ranks learn them
    seen = dict.fromkeys(range(n), 0)
    for _ in range(12):  # a rank waits for whichever of its two is not in yet, and finishes once both are
        for r in order or range(n):
            if seen[r] == len(sent[r]) and core.ranks[r].state == RUN:
                now = max(done[r].values(), default=T0 + issue.get(r, 0))
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
    P2P off, takes nccl-tests' sendrecv_perf time with the rank's host launch h of its first call in place of
    nccl-tests' own, over the calls (as tests/test_torch_collective_perf.py checks on NVLink hosts). Slow: a live run
    of 8 ranks."""
    from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
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
        h = round(host_launch_us(DEFAULT_BATCHES) * 1000)  # the rank's first launch, after the synchronise
        assert us == pytest.approx((res.time_ns + (h - launch_ns) / iters) / 1e3, abs=0.006), size
        assert res.nbytes / (res.time_ns / 1e9) < 3.01e9 or size < 64 * MiB  # the uplink's share, 24 / 8


def staggered_ends_ns(nbytes: int, d: int) -> dict[int, float]:
    """Closed form: the ring of 4 on one switch with P2P off, rank r issuing at r x d. Pair r -> r + 1 runs from
    (r + 1) x d (both kernels run), 3 -> 0 from 3d; k pairs in flight share the 24 GB/s uplink, 24 / k each."""
    assert d == 1_000_000 and nbytes == 64 * MiB  # the phases below: p01 alone, then with p12, then all four
    left01 = nbytes - 24 * d - 12 * d  # bytes per ns: 24 alone, 12 in two
    left12 = nbytes - 12 * d
    e01 = 3 * d + left01 / 6  # four pairs at 6
    left12 -= left01  # moved at 6 while p01 ran
    e12 = e01 + left12 / 8  # three at 8
    left23 = nbytes - left01 - 8 * (e12 - e01)
    e23 = e12 + left23 / 12  # two at 12
    return {0: e23, 1: e12, 2: e23, 3: e23}  # rank r ends with its send r -> r + 1 and its receive r - 1 -> r


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 1, 0, 2]])
def test_a_group_whose_ranks_launch_apart_is_rated_in_its_schedule(order: list[int]) -> None:
    """Rank r of a 4-rank ring issues its batch at r ms (P2P off, one switch): each pair starts when both its
    ranks' kernels run and shares the uplink with the pairs in flight then (`staggered_ends_ns`), whatever order the
    ranks' messages arrive in; each rank's time is that end plus NCCL's latency (sendrecv_perf's time less its
    transfer at 24 / 4 GB/s). Before, pairs of one group that started apart were rated without each other (p01 and
    p12 alone at 24 GB/s)."""
    topo = pcie_host(4)
    nbytes, d = 64 * MiB, 1_000_000
    lat = sendrecv_perf_ns(topo, P2P_OFF, nbytes) - nbytes / 6
    assert 0 < lat < 100_000
    got = ring_times(topo, P2P_OFF, nbytes, issue={r: r * d for r in range(4)}, order=order)
    want = staggered_ends_ns(nbytes, d)
    for r in range(4):
        assert got[r] == pytest.approx(want[r] + lat, abs=4), r


def test_pairs_launched_out_of_start_order_keep_their_group() -> None:
    """P2pBatches as window mode can call it: rank 1's launch receives from 0 (issued at 0) and sends to 2 (issued
    at 300), so 1 -> 2 starts at 300 and 0 -> 1 at 100; 1 -> 2 is launched first (alone: nothing else known), then
    0 -> 1, which still sees it, starting 200 ns after it. Before, a launch at another start time than the last
    forgot the pairs launched before it."""
    from bridge.matching import Call, Rendezvous
    from bridge.p2p_batch import P2pBatches

    comm = (0, 1, 2)
    batches = P2pBatches()
    calls = {}
    for rank, h, kind, t, launch in [(0, 1, "send", 0, 5), (1, 1, "recv", 100, 7), (1, 2, "send", 100, 7),
                                     (2, 1, "recv", 300, 9)]:  # fmt: skip
        calls[(rank, h)] = Call(rank, h, kind, MiB, "uint8", None, t, "", (), comm)
        batches.issued(calls[(rank, h)], launch)
    late = Rendezvous(("p2p", 1, 2, 0, 0), (1, 2), {1: calls[(1, 2)], 2: calls[(2, 1)]})
    early = Rendezvous(("p2p", 0, 1, 0, 0), (0, 1), {0: calls[(0, 1)], 1: calls[(1, 1)]})
    assert batches.inflight(late, 300) == ((), ())
    assert batches.inflight(early, 100) == (((0, 1), (1, 2)), ((1, 2, 200, MiB),))


STAGGERED = """
    import torch, torch.distributed as dist
    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    a = torch.ones(2048, 2048, device="cuda")
    for _ in range(r):  # rank r launches its batch r matmuls later
        a = a @ a
    buf = torch.ones(16 * 1024 * 1024, device="cuda")  # 64 MiB
    out = torch.empty_like(buf)
    ops = [dist.P2POp(dist.isend, buf, (r + 1) % n), dist.P2POp(dist.irecv, out, (r - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


def uplink_ends_ns(starts: dict[Any, float], nbytes: int, uplink: float = 24.0) -> dict[Any, float]:
    """Closed form for SHM pairs under one switch: the k pairs in flight share the uplink, uplink / k bytes a ns
    each; each pair starts at its own time and moves `nbytes`."""
    left = dict.fromkeys(starts, float(nbytes))
    ends: dict[Any, float] = {}
    now = min(starts.values())
    while len(ends) < len(starts):
        on = [p for p in starts if p not in ends and starts[p] <= now]
        nxt = min((s for p, s in starts.items() if p not in ends and s > now), default=float("inf"))
        if not on:
            now = nxt
            continue
        rate = uplink / len(on)
        step = min(min(left[p] for p in on) / rate, nxt - now)
        now += step
        for p in on:
            left[p] -= rate * step
            if left[p] < 1e-3:
                ends[p] = now
    return ends


@pytest.mark.slow
def test_a_torch_ring_whose_ranks_launch_apart_shares_the_uplink_in_time(tmp_path: Path) -> None:
    """A real torch.distributed program on 4 PCIe GPUs under one switch, P2P off: rank r runs r matmuls, then its
    batch_isend_irecv ring of 64 MiB, so the pairs start apart (each when both its ranks' kernels run). Each pair
    ends when the closed form `uplink_ends_ns` says from the recorded starts, plus NCCL's latency (sendrecv_perf's
    time less its transfer at 24 / 4 GB/s). Before, the pairs that started apart were rated without each other.
    Slow: a live 4-rank run (about 15 s)."""
    from phantora.launcher import RunConfig, launch
    from tests.test_runtime_e2e import write

    topo = pcie_host(4)
    nbytes = 64 * MiB
    script = write(tmp_path, "staggered.py", STAGGERED)
    cfg = RunConfig(str(script), topology=topo, nproc=4, trace="none", timeout_s=300, tensors="phantom",
                    env={"NCCL_P2P_DISABLE": "1"})  # fmt: skip
    rep = launch(cfg)
    pairs = {tuple(c["group"]): c for c in rep.cosim.collectives if c["kind"] == "send_recv"}
    assert sorted(pairs) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    starts = {p: float(c["t_start"]) for p, c in pairs.items()}
    assert len(set(starts.values())) >= 3  # they do start apart
    lat = sendrecv_perf_ns(topo, P2P_OFF, nbytes) - nbytes / 6
    want = uplink_ends_ns(starts, nbytes)
    for p, c in pairs.items():
        assert c["end_ns"] == pytest.approx(want[p] + lat, abs=4), p


def test_inflight_at_must_name_pairs_of_the_group() -> None:
    """A start for a pair that is not in `inflight` is a one-line error naming the field."""
    from phantora.collectives import Collective
    from phantora.errors import InputError

    with pytest.raises(InputError, match="inflight_at"):
        Collective("send_recv", (0, 1), MiB, "uint8", None, (0, 1, 2), ((0, 1), (1, 2)), ((2, 0, 5, MiB),))
