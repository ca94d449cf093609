"""What-if, not the model: would the proxy's per-step cost explain cross-host send/recv running below the NIC?

    .venv/bin/python bench/bench_p2p_proxy_whatif.py               # closed forms, then the three variants below
    .venv/bin/python bench/bench_p2p_proxy_whatif.py --flow-only   # closed forms and the H100 ring only
    .venv/bin/python bench/bench_p2p_proxy_whatif.py --channels    # the B200 cluster's NICs by connections
    .venv/bin/python bench/bench_p2p_proxy_whatif.py --turns       # (d) below, the summary lines it moves
    .venv/bin/python bench/bench_p2p_proxy_whatif.py --depth       # the slot loop a depth bound would need

A GPU whose proxy relays one send (PXN) and serves one receive per p2p chunk (sendrecv_perf's ring across hosts)
spends 2 c per chunk of NCCL_P2P_NET_CHUNKSIZE, so c caps it at chunk / (2 c) each way. The script prints that cap
at the model's PROXY_STEP_US and at the c that example-cluster01's H100 sendrecv (45.87 GB/s, NCCL 2.29.2, its
400G NIC not stated; SOURCES.md) implies, the model's figure for that H100 ring, then bench_nccl_tests' summary
lines under: (a) the model as it is; (b) PROXY_STEP_US set to that c (one cost for every proxy step, collectives'
LL/LL128 ones included); (c) that cap on cross-host p2p only (`shape._net_caps`, a GPU's flows from other nodes).
Only the summary lines that differ from (a) are printed. docs/validation.md ("Held-out tables", 2026-12-04).

`--channels` reads the held-out B200 tables of Together's use3a-ss cluster (one queue pair a connection) and prints,
for each run, the network connections a NIC carries each way and what the NIC moves, a p2p run's rate a channel,
and the closed form of (d): NCCL's 14 GB/s figure holds one channel's own proxy turns, and each further connection
adds its relayed send's and its receive's turns to every 128 KiB step (`turns_rate`). `--turns` prints the summary
lines that (d), applied to every cross-host p2p flow into a GPU, moves. docs/validation.md ("Held-out tables",
2026-12-04, the second block on the relay's turns).

`--depth` prints, for the same runs, the bytes a NIC's connections hold in flight each way (NCCL_STEPS steps a
connection) and the slot loop (a step's fill, send, drain and credit back) at which those bytes would move the
published rate, were the depth what binds; then the NIC's share in the two-host all-to-all tables, published and
simulated (flow). docs/validation.md ("Held-out tables", 2026-12-05).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nccl_tests import compare, overall, split, test_calls, verdict

from phantora.collectives import AlgoOptions
from phantora.collectives.nccl import p2p, proxy, shape
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.published import Table, data_dir, read_table, tables
from phantora.collectives.nccl.settings import NcclSettings
from phantora.topology import rail_optimized

H100_SENDRECV = 45.87  # GB/s, example-cluster01's 2-host sendrecv_perf (SOURCES.md, the alltoall row's log)
CHUNK = 128 << 10  # NCCL_P2P_NET_CHUNKSIZE's default (init.cc, v2.29.7-1)
NCCL_STEPS = 8  # steps a connection keeps in flight (net.cc: min(NCCL_STEPS, NCCL_SHARED_STEPS / nsubs), one sub)
RING_STEP = (4 << 20) // NCCL_STEPS  # a ring's Simple step: the 4 MiB default buffer over NCCL_STEPS (init.cc)
ALLTOALL_2HOSTS = (  # two hosts of 8 GPUs (SOURCES.md); the last one's 400G NIC is inferred, so it is not compared
    "a100_16gpu_2node_hdr200assumed_alltoall_alcfsophia",
    "a100_16gpu_2node_hdr200_alltoall_mscclppndmv4",
    "h100_16gpu_2node_nic400assumed_alltoall_xxrjuncluster01",
)


def cap_gbs(chunk: int, step_us: float) -> float:
    """GB/s each way a relay GPU's proxy allows at `step_us` a connection step: one send and one receive a chunk."""
    return chunk / (2 * step_us * 1000.0)


def implied_step_us(gbs: float, chunk: int = CHUNK) -> float:
    """The per-step cost (µs) at which `cap_gbs` equals `gbs`."""
    return chunk / (2 * gbs * 1000.0)


@contextmanager
def step_cost(step_us: float) -> Iterator[None]:
    """PROXY_STEP_US set to `step_us` for every proxy step (proxy.py), restored after."""
    old = proxy.PROXY_STEP_US
    proxy.PROXY_STEP_US = step_us
    try:
        yield
    finally:
        proxy.PROXY_STEP_US = old


@contextmanager
def p2p_choice(rechoose: Callable[[Any, list[Any], Any], Any]) -> Iterator[None]:
    """`shape._net_caps` given `rechoose(choice, flows, topo)` in place of a p2p call's choice, restored after."""
    old: Callable[..., Any] = shape._net_caps

    def patched(flows: Any, wire: Any, caps: Any, choice: Any, topo: Any, share: Any = None) -> Any:
        if choice.algorithm == "p2p":
            choice = rechoose(choice, flows, topo)
        return old(flows, wire, caps, choice, topo, share)

    shape._net_caps = patched
    try:
        yield
    finally:
        shape._net_caps = old


def p2p_cap(gbs: float) -> AbstractContextManager[None]:
    """Cross-host p2p flows into a GPU capped at `gbs` together (`Choice.net_bw`), restored after."""
    return p2p_choice(lambda c, _flows, _topo: replace(c, net_bw=min(c.net_bw, gbs) if c.net_bw > 0 else gbs))


def turns_rate(rate: float, conns: int, step_us: float, chunk: int = CHUNK) -> float:
    """GB/s of `conns` connections into a GPU that move `rate` together when each step of one also waits for the
    relay proxy's turns on the other conns - 1 connections' send and receive (2 turns of `step_us` each)."""
    return 1.0 / (1.0 / rate + 2 * (conns - 1) * step_us * 1000.0 / (conns * chunk))


def turns_in_series(step_us: float) -> AbstractContextManager[None]:
    """Cross-host p2p flows into a GPU at `turns_rate` of their channels' rate (`Choice.net_bw`), with a NIC's
    connections each way counted as the GPU's remote sources times the transfer's channels; restored after."""

    def slowed(choice: Any, flows: list[Any], topo: Any) -> Any:
        if choice.net_bw <= 0:
            return choice
        sources: dict[int, set[int]] = {}
        for f in flows:
            if f.size > 0 and not shape._inside_node(f, topo):
                sources.setdefault(f.dst, set()).add(f.src)
        conns = max((len(s) for s in sources.values()), default=1) * max(1, choice.channels)
        return replace(choice, net_bw=turns_rate(choice.net_bw, conns, step_us))

    return p2p_choice(slowed)


def h100_ring(size: int) -> float:
    """The model's busbw (GB/s) of sendrecv_perf's 16-rank ring on two H100 hosts of 8 x 400G rails, one call."""
    from bench_nccl_tests import bus_bandwidth

    topo = rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="h100")
    bus, _ = bus_bandwidth(test_calls("send_recv", tuple(range(16)), size), topo, AlgoOptions(), "flow")
    return bus


USE3A = "b200_{g}gpu_{n}node_ib400_{kind}_together{src}"  # Together's use3a-ss tables (SOURCES.md)
P2P_RUNS = ((128, 16), (64, 8), (16, 2), (32, 4))  # (GPUs, hosts) of its sendrecv-p2p-scaling tables


def held_out(name: str) -> Any:
    """The held-out table `name` (tests/data/nccl_tests)."""
    return next(t for t in tables(include_held_out=True) if t.name == name)


def last_busbw(name: str) -> float:
    """The busbw (GB/s) of table `name`'s largest size."""
    return held_out(name).rows[-1][1]


def net_peer_channels(gpus: int, hosts: int) -> tuple[int, float]:
    """NCCL's channels a network peer (`p2p.transfer_layout`'s most) and the model's GB/s a channel, on `hosts`
    B200 hosts of 8 GPUs and 8 x 400G rails."""
    topo = rail_optimized(hosts, 8, spines=8, nic_rate="400Gbps", gpu="b200")
    p = platform_of(topo, tuple(range(gpus)), NcclSettings())
    return p2p.transfer_layout(p, NcclSettings()).most, p2p.net_channel_bw(p, "all_to_all")


def channels_report() -> None:
    """The use3a-ss runs' NICs by connections, the p2p rate a channel, and the (n - 1) turns what-if."""
    ring = last_busbw(USE3A.format(g=16, n=2, kind="ringalgo_all_reduce", src="use3a")) / 8
    nvls = last_busbw(USE3A.format(g=16, n=2, kind="nvlstreealgo_all_reduce", src="use3a")) * 16 / 30 / 8
    print("use3a-ss, 2 hosts, one queue pair a connection: connections a NIC each way, GB/s a NIC each way")
    print(f"  Ring all-reduce, 16 channels over 8 NICs:       2  {ring:.1f}")
    print(f"  NVLS-Tree all-reduce, 32 channels on each head: 32  {nvls:.1f}")
    step_us = proxy.PROXY_STEP_US
    print(f"sendrecv_perf at 256 MiB; what-if t(n) = {CHUNK >> 10} KiB / c + 2 (n - 1) x {step_us} us a step")
    for gpus, hosts in P2P_RUNS:
        n, c = net_peer_channels(gpus, hosts)
        pub = last_busbw(USE3A.format(g=gpus, n=hosts, kind="sendrecv", src="p2p"))
        t_us = CHUNK / (c * 1000.0) + 2 * (n - 1) * step_us
        what_if = n * CHUNK / (t_us * 1000.0)
        print(
            f"  {hosts:2d} hosts, {n} channel(s), {n} connection(s) a NIC: {pub:.2f} GB/s, {pub / n:.2f} a channel;"
            f" model channel {c:.2f}; what-if {what_if:.2f} ({(what_if / pub - 1) * 100:+.1f}%)"
        )


def in_flight(channels: int, step: int = CHUNK) -> int:
    """Bytes a NIC's `channels` connections hold in flight each way: NCCL_STEPS steps of `step` bytes each."""
    return channels * NCCL_STEPS * step


def loop_us(nbytes: int, gbs: float) -> float:
    """The slot loop (µs) at which `nbytes` in flight move `gbs` GB/s: a depth bound moves them once a loop."""
    return nbytes / (gbs * 1000.0)


def nic_rate(table: Table, busbw: float) -> float:
    """GB/s each GPU of an all-to-all `table` sends through its NIC at `busbw`: the algbw (busbw x n / (n - 1))
    times the share of its peers on other hosts."""
    n, ppn = table.gpus, table.gpus // table.nodes
    return busbw * n / (n - 1) * (n - ppn) / n


def depth_report() -> None:
    """The use3a-ss runs' bytes in flight a NIC and the loop a depth bound would need; the all-to-alls' NIC shares."""
    print("use3a-ss, one queue pair a connection: MiB in flight a NIC each way, GB/s a NIC, slot loop for that rate")
    for gpus, hosts in P2P_RUNS:
        n, _ = net_peer_channels(gpus, hosts)
        pub = last_busbw(USE3A.format(g=gpus, n=hosts, kind="sendrecv", src="p2p"))
        w = in_flight(n)
        head = f"  sendrecv, {hosts:2d} hosts, {n} channel(s) of 128 KiB steps:"
        print(f"{head} {w >> 20}  {pub:.2f}  {loop_us(w, pub):.1f} us")
    ring = last_busbw(USE3A.format(g=16, n=2, kind="ringalgo_all_reduce", src="use3a")) / 8
    w = in_flight(2, RING_STEP)
    print(f"  ring all-reduce, 2 hosts, 2 channels of 512 KiB steps: {w >> 20}  {ring:.2f}  {loop_us(w, ring):.1f} us")
    print(f"4 channels of 128 KiB steps fill a 50 GB/s NIC at any loop under {loop_us(in_flight(4), 50.0):.1f} us")
    print("two-host all-to-all, largest size: GB/s each GPU sends through its NIC, published and simulated (flow)")
    for name in ALLTOALL_2HOSTS:
        t = read_table(data_dir() / f"{name}.csv")
        row = compare(t, "flow", t.rows[-1][0])[-1]
        nic = t.nic_gbps / 8
        pub, sim = nic_rate(t, row.published), nic_rate(t, row.simulated)
        print(f"  {name}: {pub:.2f} ({pub / nic:.1%} of {nic:g}), model {sim:.2f} ({row.choice})")


def summary() -> list[str]:
    """Each compared and held-out table's verdict, then the overall lines (bench_nccl_tests --summary's)."""
    everything = {t.name: (t, compare(t, "flow", 1 << 20)) for t in tables(include_held_out=True)}
    lines = [f"{name}: {verdict(rows)}" for name, (_, rows) in everything.items() if rows]
    fitted, held = split(everything)
    return lines + ["all tables: " + overall(fitted, "")[0], "held-out tables: " + overall(held, "")[0]]


def variant(name: str) -> list[str]:
    """`summary()` under variant `name` ("model", "steps" or "p2p"), in a fresh interpreter: the model caches its
    choices, so a variant set after a run would not reach them."""
    cmd = [sys.executable, __file__, "--variant", name]
    return list(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flow-only", action="store_true", help="closed forms and the H100 ring only, no summaries")
    ap.add_argument("--channels", action="store_true", help="the B200 NICs by connections and the p2p what-if")
    ap.add_argument("--turns", action="store_true", help="summary lines the (n - 1) turns what-if moves")
    ap.add_argument("--depth", action="store_true", help="the slot loop a depth bound would need; NIC shares")
    ap.add_argument("--variant", choices=("model", "steps", "p2p", "turns"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.channels:
        channels_report()
        return
    if args.depth:
        depth_report()
        return
    if args.turns:
        print(f"(d) {proxy.PROXY_STEP_US} us turns of every other connection on each p2p step: lines that differ")
        for before, after in zip(variant("model"), variant("turns"), strict=True):
            if before != after:
                print(f"  - {before}\n  + {after}")
        return
    c = implied_step_us(H100_SENDRECV)
    if args.variant:
        ctx = {
            "model": step_cost(proxy.PROXY_STEP_US),
            "steps": step_cost(c),
            "p2p": p2p_cap(cap_gbs(CHUNK, c)),
            "turns": turns_in_series(proxy.PROXY_STEP_US),
        }
        with ctx[args.variant]:
            print(json.dumps(summary()))
        return
    print(f"cap at PROXY_STEP_US {proxy.PROXY_STEP_US} us: {cap_gbs(CHUNK, proxy.PROXY_STEP_US):.1f} GB/s (128 KiB)")
    print(f"c for {H100_SENDRECV} GB/s at 128 KiB: {c:.3f} us; its cap at 512 KiB: {cap_gbs(4 * CHUNK, c):.1f} GB/s")
    print(f"model, H100 2x8 400G sendrecv ring: 256 MiB {h100_ring(256 << 20):.2f}, 16 GiB {h100_ring(16 << 30):.2f}")
    if args.flow_only:
        return
    base = variant("model")
    for name, label in (("steps", f"(b) PROXY_STEP_US = {c:.3f}"), ("p2p", f"(c) p2p cap {H100_SENDRECV} GB/s")):
        print(f"\n{label}: lines that differ from the model")
        for before, after in zip(base, variant(name), strict=True):
            if before != after:
                print(f"  - {before}\n  + {after}")


if __name__ == "__main__":
    main()
