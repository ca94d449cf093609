"""Registered NVLS (-R 1): NCCL's registered chunk and CTAs in the chunking and the pipeline fill, against closed
forms from NCCL's code (enqueue.cc calcCollChunking v2.27.3-1 .. v2.30.7-1: a registered NVLS all-gather or
reduce-scatter takes a whole Simple step, NCCL_BUFFSIZE / NCCL_STEPS; otherwise the NVLS ladder on the CTAs that
run; all_gather.h / reduce_scatter.h / all_reduce.h with regUsed: one pass through the multicast object, so no
pipeline fill inside a node).
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose, nccl_chunk
from phantora.collectives.nccl.pipeline import NVLS_HEAD_CHUNK_COST_US
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import dgx_host

KiB, MiB = 1 << 10, 1 << 20
H100 = dgx_host(gpu="h100")
RANKS = tuple(range(8))
HEADS = 8  # one NVLS head per GPU of the host


def opts(**env: str) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env({"NCCL_ALGO": "NVLS", **env}))


def choice(kind: str, nbytes: int, **env: str) -> dict:
    return decompose(Collective(kind, RANKS, nbytes, "fp32"), H100, opts(**env)).choice or {}


def chunk(kind: str, nbytes: int, **env: str) -> int:
    coll = Collective(kind, RANKS, nbytes, "fp32")
    got = choose(coll, H100, opts(**env))
    assert got is not None
    return nccl_chunk(coll, H100, opts(**env), got)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_a_registered_all_gather_or_reduce_scatter_takes_a_whole_simple_step(kind):
    """2.27+: NCCL_BUFFSIZE / NCCL_STEPS = 4 MiB / 8 = 512 KiB, and 1 MiB with an 8 MiB buffer; before 2.27 the
    NVLS ladder on the registered CTAs: 16 MiB over 4 CTAs is 4 MiB a channel, 8 heads, so 128 KiB -> 64 KiB
    (4 MiB < 64 x 8 x 128 KiB) and no further (4 MiB is not < 8 x 8 x 64 KiB)."""
    assert chunk(kind, 16 * MiB, PHANTORA_NCCL_REGISTER="1") == 512 * KiB
    assert chunk(kind, 16 * MiB, PHANTORA_NCCL_REGISTER="1", NCCL_BUFFSIZE=str(8 * MiB)) == MiB
    old = choice(kind, 16 * MiB, PHANTORA_NCCL_REGISTER="1", PHANTORA_NCCL_VERSION="2.26")
    assert old["channels"] == (4 if kind == "all_gather" else 5)
    if kind == "all_gather":
        assert chunk(kind, 16 * MiB, PHANTORA_NCCL_REGISTER="1", PHANTORA_NCCL_VERSION="2.26") == 64 * KiB


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_registered_nvls_has_no_fill_and_no_chunk_overhead_over_nccls_bandwidth(kind):
    """16 MiB on 8 H100s: unregistered NVLS pays a two-stage fill and, on 16 channels x 8 heads, 32 KiB chunks
    (1 MiB a channel: < 64 x 8 x 128 KiB, < 8 x 8 x 64 KiB, not < 2 x 8 x 32 KiB), so 4 loops of 128 KiB an
    operation where NCCL's bandwidth holds 1: 3 loops x 8 heads x 0.525 us more. Registered: NCCL's latency plus
    the bytes at NCCL's bandwidth, no fill (one pass), its 512 KiB chunk holding no extra loop."""
    plain = choice(kind, 16 * MiB)
    reg = choice(kind, 16 * MiB, PHANTORA_NCCL_REGISTER="1")
    assert plain["fill_us"] > 0 and "fill_us" not in reg and reg["registered"]
    overhead = 3 * HEADS * NVLS_HEAD_CHUNK_COST_US
    raw_plain = plain["model_time_us"] - plain["model_lat_us"] - overhead  # bytes at NCCL's bandwidth, us
    assert reg["model_lat_us"] == plain["model_lat_us"]
    assert reg["model_time_us"] == pytest.approx(reg["model_lat_us"] + raw_plain, abs=2e-3)
    assert reg["model_algbw_gbs"] == pytest.approx(16 * MiB / 1000 / raw_plain, rel=1e-4)


def test_a_registered_all_reduce_keeps_the_ladder_on_its_fewer_ctas():
    """1 MiB all-reduce: 4 registered CTAs x 8 heads = 32 operations of 32 KiB; the ladder gives 16 KiB chunks
    (256 KiB a channel < 2 x 8 x 32 KiB), so 2 loops where 16 channels ran 1 (8 KiB an operation): one loop x
    8 heads x 0.525 us more than unregistered, and no fill."""
    plain = choice("all_reduce", MiB)
    reg = choice("all_reduce", MiB, PHANTORA_NCCL_REGISTER="1")
    assert chunk("all_reduce", MiB, PHANTORA_NCCL_REGISTER="1") == 16 * KiB
    assert reg["channels"] == 4 and "fill_us" not in reg
    assert reg["model_time_us"] == pytest.approx(plain["model_time_us"] + HEADS * NVLS_HEAD_CHUNK_COST_US, abs=2e-3)
