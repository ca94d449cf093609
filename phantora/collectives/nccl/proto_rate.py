"""What an A100's LL and LL128 all-reduce kernels achieve, below NCCL's ratings: an empirical rate, fitted.

NCCL's tuner rates each protocol per GPU generation (tuning.cc `llMaxBws`, `perChMaxRingLL128Bws`, LL128's 0.92);
those ratings choose the algorithm and protocol, and are NVIDIA's estimates of what each kernel reaches, not times
NCCL measures. On an A100 (sm80, NVLink3) every published one-host all-reduce curve runs LL128 at about 133-148
GB/s busbw where NCCL rates it min(0.92 x 240, 12 x 20) = 220.8, and no H100 curve falls below its rating
(docs/validation.md, "A100 ring all-reduce, one host", (f), (g)). They are the two protocols that cross an A100's
NVLink by the sender's stores: NCCL reads only the Simple buffer from the peer, on sm80 only (graph/paths.cc, P2P
read); in wire bytes the published A100 rates reach a median 97% of the link with Simple, 62% with LL128 and 47%
with LL, where an H100 stores with all three at 100 / 95 / 73% (`bench/bench_wire_rate.py`; docs/validation.md,
2026-12-05). That is a hardware limit whose size no NCCL source or published measurement gives, so the rate is
fitted, not derived: `ACHIEVED_BUSBW` holds one bus bandwidth per (architecture, protocol), fitted on one table
only (Azure ND A100 v4, NCCL 2.18.5; `bench/bench_proto_rate.py`) and checked on the others, held out. It bounds
the time of an all-reduce's ring or tree that runs the protocol, never the choice (`tuning.select` still picks by
NCCL's ratings). Other collectives keep NCCL's rating (ALCF's two-host A100 all-gather grows faster than 148
between its LL128 sizes; no A100 reduce-scatter table was found), and so do generations without an entry (H100,
H200, B200), whose tables meet it.

The rate is a per-CTA rate summed over the CTAs that ran: Azure's table ran NCCL's default channels, 24 CTAs on
an 8-GPU A100, so each CTA reaches 148 / 24 GB/s under LL128. An LL or LL128 channel is one CTA whose warps store
flagged lines into the peer's buffer while the peer's warps poll the flags (prims_ll.h, prims_ll128.h): its bytes
in flight are bounded by its own threads and its connection's NCCL_STEPS slots, so its throughput is bounded per
CTA, and the GPU's grows with the CTAs until the NVLink binds, which NCCL's rating (per channel for LL128,
`perChMaxRingLL128Bws`) already caps. It is not a whole-GPU ceiling such as the Simple all-reduce's ~230 GB/s
(`ring_kernel.kernel_busbw`, which 4 CTAs leave unbound): with `share` = CTAs run / NCCL's default the kernel
reaches min(share x NCCL's rating, share x the achieved rate), fewer CTAs under NCCL_MAX_NCHANNELS
(`tuning.channel_limit`) and at small sizes (NCCL runs fewer channels there, and a ring on one fewer threads: a CTA
weighs its threads over the protocol's most), more under NCCL_MIN_NCHANNELS / NCCL_MIN_CTAS (`tuning.cta_share`).
"""

from __future__ import annotations

from phantora.collectives.nccl.platform import Platform

# Bus bandwidth (GB/s) an (architecture, protocol) kernel reaches at most, fitted on the Azure ND A100 v4 table
# (tests/data/nccl_tests/a100_8gpu_1node_all_reduce_azure_nda100v4.csv; bench/bench_proto_rate.py --fit).
ACHIEVED_BUSBW: dict[tuple[str, str], float] = {("ampere", "LL128"): 148.0, ("ampere", "LL"): 68.0}
CAPPED_ALGORITHMS = ("ring", "tree")  # the algorithms that run LL and LL128
MEASURED_KINDS = ("all_reduce",)  # the collectives the rates were measured on (a copy, all-gather, runs faster)


def achieved_busbw(arch: str, proto: str) -> float | None:
    """The empirical bus bandwidth (GB/s) of `proto`'s kernel on `arch`; None where NCCL's rating holds."""
    return ACHIEVED_BUSBW.get((arch, proto))


def capped_algbw(
    algbw: float, kind: str, algo: str, proto: str, p: Platform, alg_per_bus: float, share: float
) -> float:
    """`algbw` (GB/s: NCCL's rating already scaled to the CTAs that run) of an all-reduce no faster than the
    protocol kernel's achieved rate on `p`'s GPU over the same CTAs: its bus bandwidth times `share` (CTAs run over
    NCCL's default) times `alg_per_bus` (the algorithm's algorithm-to-bus ratio). Unchanged for other kinds and
    algorithms and where no rate is recorded."""
    measured = kind in MEASURED_KINDS and algo in CAPPED_ALGORITHMS
    bus = achieved_busbw(p.arch, proto) if measured else None
    if bus is None or algbw <= 0:
        return algbw
    return min(algbw, bus * share * alg_per_bus)
