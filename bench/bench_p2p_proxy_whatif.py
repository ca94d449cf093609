"""What-if, not the model: would the proxy's per-step cost explain cross-host send/recv running below the NIC?

    .venv/bin/python bench/bench_p2p_proxy_whatif.py               # closed forms, then the three variants below
    .venv/bin/python bench/bench_p2p_proxy_whatif.py --flow-only   # closed forms and the H100 ring only

A GPU whose proxy relays one send (PXN) and serves one receive per p2p chunk (sendrecv_perf's ring across hosts)
spends 2 c per chunk of NCCL_P2P_NET_CHUNKSIZE, so c caps it at chunk / (2 c) each way. The script prints that cap
at the model's PROXY_STEP_US and at the c that example-cluster01's H100 sendrecv (45.87 GB/s, NCCL 2.29.2, its
400G NIC not stated; SOURCES.md) implies, the model's figure for that H100 ring, then bench_nccl_tests' summary
lines under: (a) the model as it is; (b) PROXY_STEP_US set to that c (one cost for every proxy step, collectives'
LL/LL128 ones included); (c) that cap on cross-host p2p only (`shape._net_caps`, a GPU's flows from other nodes).
Only the summary lines that differ from (a) are printed. docs/validation.md ("Held-out tables", 2026-12-04).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nccl_tests import compare, overall, split, test_calls, verdict

from phantora.collectives import AlgoOptions
from phantora.collectives.nccl import proxy, shape
from phantora.collectives.nccl.published import tables
from phantora.topology import rail_optimized

H100_SENDRECV = 45.87  # GB/s, example-cluster01's 2-host sendrecv_perf (SOURCES.md, the alltoall row's log)
CHUNK = 128 << 10  # NCCL_P2P_NET_CHUNKSIZE's default (init.cc, v2.29.7-1)


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
def p2p_cap(gbs: float) -> Iterator[None]:
    """Cross-host p2p flows into a GPU capped at `gbs` together (`Choice.net_bw`), restored after."""
    old: Callable[..., Any] = shape._net_caps

    def capped(flows: Any, wire: Any, caps: Any, choice: Any, topo: Any, share: Any = None) -> Any:
        if choice.algorithm == "p2p":
            choice = replace(choice, net_bw=min(choice.net_bw, gbs) if choice.net_bw > 0 else gbs)
        return old(flows, wire, caps, choice, topo, share)

    shape._net_caps = capped
    try:
        yield
    finally:
        shape._net_caps = old


def h100_ring(size: int) -> float:
    """The model's busbw (GB/s) of sendrecv_perf's 16-rank ring on two H100 hosts of 8 x 400G rails, one call."""
    from bench_nccl_tests import bus_bandwidth

    topo = rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="h100")
    bus, _ = bus_bandwidth(test_calls("send_recv", tuple(range(16)), size), topo, AlgoOptions(), "flow")
    return bus


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
    ap.add_argument("--variant", choices=("model", "steps", "p2p"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    c = implied_step_us(H100_SENDRECV)
    if args.variant:
        ctx = {"model": step_cost(proxy.PROXY_STEP_US), "steps": step_cost(c), "p2p": p2p_cap(cap_gbs(CHUNK, c))}
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
