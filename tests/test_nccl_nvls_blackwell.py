"""NVLS on Blackwell and on NVLink domains of more than 32 GPUs, as NCCL sizes it (closed forms of its source):
- the NVLS CTAs (nvls.cc `ncclNvlsInit` / `ncclNvlsTuning`): 16 on Hopper; on Blackwell 32 up to 2.26, then 24
  inside one node and 32 across nodes, and from 2.30 the SM100 NVLS-Tree tuning's count, chunk and tree chunk;
- the NVLS heads: at most NCCL_MAX_NVLS_ARITY = 32 (search.cc), so a 72-GPU NVL72 domain runs 32;
- a chunk's fixed cost is paid per head in a CTA's loop, so its cost per byte does not depend on the heads."""

from __future__ import annotations

import dataclasses

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose, platform_of
from phantora.collectives.nccl.channels import default_nvls_channels, nvls_channels, nvls_heads, sm100_nvls_tree
from phantora.collectives.nccl.chunking import chunk_bytes, nvls_tree_max_of
from phantora.collectives.nccl.nvls_kernel import nvls_kernel_algbw
from phantora.collectives.nccl.nvls_switch import switch_bound_algbw
from phantora.collectives.nccl.pipeline import NVLS_HEAD_CHUNK_COST_US, chunk_overhead_us
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings, nccl_env, settings_from_env
from phantora.topology import dgx_host, rail_optimized

KiB, MiB = 1 << 10, 1 << 20


def b200_host(gpus: int = 8) -> Platform:
    return platform_of(dgx_host(gpus_per_host=8, gpu="b200"), tuple(range(gpus)))


def b200_hosts(n: int, nic: str = "400Gbps") -> Platform:
    topo = rail_optimized(n, 8, spines=8, nic_rate=nic, gpu="b200")
    return platform_of(topo, tuple(range(8 * n)))


def nvl72() -> Platform:
    """One NVLink domain of 72 B200s, which NCCL's MNNVL sees as one node."""
    p = b200_host()
    return dataclasses.replace(p, nranks=72, ppn=72)


def version(v: str) -> NcclSettings:
    return settings_from_env({"PHANTORA_NCCL_VERSION": v})


def test_nvls_ctas_by_gpu_version_and_nodes():
    """nvls.cc: NVLS_NCHANNELS_SM90 16, NVLS_NCHANNELS_SM100 32 (every Blackwell comm before v2.27.3-1, and across
    nodes after), NVLS_NCHANNELS_SM100_NVL 24 (one node or one MNNVL domain, v2.27.3-1 on)."""
    h100 = platform_of(dgx_host(8, gpu="h100"), tuple(range(8)))
    assert default_nvls_channels(h100, (2, 26)) == default_nvls_channels(h100, (2, 30)) == 16
    assert default_nvls_channels(b200_host(), (2, 25)) == default_nvls_channels(b200_host(), (2, 26)) == 32
    assert default_nvls_channels(b200_host(), (2, 27)) == default_nvls_channels(b200_host(), (2, 30)) == 24
    assert default_nvls_channels(nvl72(), (2, 25)) == 32 and default_nvls_channels(nvl72(), (2, 28)) == 24
    assert default_nvls_channels(b200_hosts(2), (2, 28)) == 32
    assert default_nvls_channels(b200_hosts(4), (2, 29)) == 32
    # NCCL_NVLS_NCHANNELS and the CTA bounds still win
    assert nvls_channels(b200_host(), settings_from_env({"NCCL_NVLS_NCHANNELS": "16"})) == 16
    assert nvls_channels(b200_hosts(2), settings_from_env({"NCCL_MAX_CTAS": "20"})) == 20


def test_sm100_nvls_tree_tuning_of_nccl_2_30():
    """`ncclNvlsTreeSm100Tuning` (v2.30.3-1): two nodes with NICs of 48 GB/s or more: 32 CTAs, 128 KiB tree chunk,
    64 KiB with 8 GPUs a node behind a PCIe switch and NICs under 96 GB/s; three or more nodes: 24 CTAs (at most
    8 GPUs a node), tree chunk 64 KiB under 96 GB/s NICs (PXB), 256 KiB (with a 256 KiB chunk) from 96; none
    before 2.30 or on one node."""
    assert sm100_nvls_tree(b200_hosts(2), (2, 30)) == (32, 128 * KiB, 64 * KiB)
    assert sm100_nvls_tree(b200_hosts(2, "800Gbps"), (2, 30)) == (32, 128 * KiB, 128 * KiB)
    assert sm100_nvls_tree(b200_hosts(4), (2, 30)) == (24, 128 * KiB, 64 * KiB)
    assert sm100_nvls_tree(b200_hosts(4, "800Gbps"), (2, 30)) == (24, 256 * KiB, 256 * KiB)
    assert sm100_nvls_tree(b200_hosts(2, "200Gbps"), (2, 30)) is None
    assert sm100_nvls_tree(b200_hosts(2), (2, 29)) is None and sm100_nvls_tree(b200_host(), (2, 30)) is None
    assert default_nvls_channels(b200_hosts(4), (2, 30)) == 24
    # a user's NCCL_NVLS_CHUNKSIZE keeps its chunk, but the tuning's tree chunk still caps NVLS-Tree (2.30 only)
    env = {"NCCL_NVLS_CHUNKSIZE": "524288"}
    st30 = settings_from_env(env)
    st28 = settings_from_env({**env, "PHANTORA_NCCL_VERSION": "2.28"})
    assert nvls_tree_max_of(b200_hosts(2), st30) == 64 * KiB
    assert nvls_tree_max_of(b200_hosts(2), st28) == 512 * KiB


def test_a_72_gpu_domain_runs_32_heads():
    """search.cc caps the NVLS graph at NCCL_MAX_NVLS_ARITY = 32 channels, one head each: 32 heads of 72 GPUs,
    each head's NVLink carrying S + S/32, so its links allow 721.8 x 0.74 x 32/33 GB/s (B200: 18 links x 40.1);
    the rack's 18 switch chips adding 71 inputs an element bound it lower (tests/test_nccl_nvls_switch.py)."""
    assert nvls_heads(b200_host()) == 8 and nvls_heads(nvl72()) == 32
    links = 18 * 40.1 * 0.74 * 32 / 33
    assert nvls_kernel_algbw("all_reduce", nvl72()) == pytest.approx(min(links, switch_bound_algbw(nvl72())))


def test_nvl72_chunk_ladder_on_its_32_heads():
    """NCCL 2.25 on 72 GPUs: 32 CTAs x 32 heads; 512 MiB: each channel's 16 MiB over its 32 heads takes the
    128 KiB chunk to 64 KiB (16 MiB < 64 x 32 x 128 KiB) but not to 32 KiB (16 MiB is not < 8 x 32 x 64 KiB);
    counting 72 heads it would have gone to 32 KiB (16 MiB < 8 x 72 x 64 KiB)."""
    st = version("2.25")
    ch = nvls_channels(nvl72(), st)
    assert ch == 32
    assert chunk_bytes("nvls", "Simple", nvl72(), st, 512 * MiB, ch * nvls_heads(nvl72())) == 64 * KiB


def test_the_chunk_cost_per_byte_does_not_depend_on_the_heads():
    """16 MiB on 16 H100 NVLS CTAs: 8 heads run 4 chunks of 32 KiB an operation where the largest chunk (128 KiB)
    takes 1: 3 extra x 8 heads; 4 heads run 8 where 2 would do: 6 extra x 4 heads. Both 24 x 0.525 = 12.6 µs."""
    st = NcclSettings()
    h8 = platform_of(dgx_host(8, gpu="h100"), tuple(range(8)))
    h4 = platform_of(dgx_host(8, gpu="h100"), tuple(range(4)))
    expected = 24 * NVLS_HEAD_CHUNK_COST_US
    assert expected == pytest.approx(12.6)
    assert chunk_overhead_us("nvls", "Simple", h8, st, 16 * MiB, 16, "all_reduce") == pytest.approx(expected)
    assert chunk_overhead_us("nvls", "Simple", h4, st, 16 * MiB, 16, "all_reduce") == pytest.approx(expected)


def test_a_two_host_b200_nvls_tree_runs_32_ctas():
    """Across B200 hosts NCCL runs NVLS-Tree on NVLS_NCHANNELS_SM100 = 32 CTAs (every version), not the one-node 24."""
    topo = rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="b200")
    coll = Collective("all_reduce", tuple(range(16)), 256 * MiB, "bf16")
    choice = choose(coll, topo, AlgoOptions(nccl_env=nccl_env({"PHANTORA_NCCL_VERSION": "2.28"})))
    assert choice.algorithm == "nvls_tree" and choice.channels == 32


def test_nccl_2_29_corrects_nvls_tree_on_blackwell_x86_hosts():
    """tuning.cc (v2.29.2-1 on): NVLS-Tree all-reduce on Blackwell with x86 hosts takes treeCorrectionFactor[Simple]
    up to log2(bytes / 64) = 23: at 64 MiB (log 20) x 0.8, so NCCL's time grows by bytes / algbw x (1 / 0.8 - 1);
    none from 1 GiB (log 24), none on Hopper, none in 2.28's rating."""
    from phantora.collectives.nccl import tuning

    p = b200_hosts(2)
    nvls_tree = tuning.Cost("nvls_tree", "Simple", 50.0, 400.0)
    size = 64 * MiB
    plain = 50.0 + size / (1000.0 * 400.0)
    assert tuning.model_time_us(nvls_tree, "all_reduce", p, size, 16, (2, 28)) == pytest.approx(plain)
    assert tuning.model_time_us(nvls_tree, "all_reduce", p, size, 16, (2, 29)) == pytest.approx(
        50.0 + size / (1000.0 * 400.0 * 0.8)
    )
    assert tuning.tree_correction_us(nvls_tree, "all_reduce", size, p) == pytest.approx(
        size / (1000.0 * 400.0) * (1 / 0.8 - 1)
    )
    assert tuning.tree_correction_us(nvls_tree, "all_reduce", 1 << 30, p) == 0.0
    h100 = platform_of(rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="h100"), tuple(range(16)))
    assert tuning.tree_correction_us(nvls_tree, "all_reduce", size, h100) == 0.0
