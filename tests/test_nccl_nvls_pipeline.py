"""NVLS and NVLS-Tree as NCCL's kernels pipeline them: the chunk NCCL_NVLS_CHUNKSIZE gives (enqueue.cc
`calcCollChunking`), the one-node NVLS all-reduce's three stages (all_reduce.h: scatter, the reduce-and-multicast
call, gather) and the chunked NVLS-Tree's order (each loop's NVLS reduce, then its tree, then its multicast).

Expected values are closed forms of NCCL's chunk arithmetic and of the NVLS bytes, written out here from NCCL's
source (v2.28.7-1), not the code's own earlier output.
"""

from __future__ import annotations

import math

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl import choose, platform_of
from phantora.collectives.nccl.chunking import collective_chunk
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.topology import dgx_host, rail_optimized

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
B200_ENV = {"NCCL_NVLS_CHUNKSIZE": "524288", "PHANTORA_NCCL_VERSION": "2.28.7"}  # the held-out A4 host's setting


def nccl_nvls_chunk(part: int, heads: int, step: int, nvls_chunk: int) -> int:
    """calcCollChunking's NVLS chunk for one channel's `part` bytes (from 2.22: nChannels = 1, so the concurrent
    operations are the heads): min(Simple step, nvlsChunkSize), then 64 KiB below 64 x ops x chunk, 32 KiB below
    8 x ops x chunk, 16 KiB below 2 x ops x chunk, then whole 512-byte grains."""
    chunk = min(step, nvls_chunk)
    for factor, size in ((64, 64 * KiB), (8, 32 * KiB), (2, 16 * KiB)):
        if part < factor * heads * chunk and chunk > size:
            chunk = size
    return chunk // 512 * 512


@pytest.mark.parametrize(
    ("size", "chunk", "loops"),
    [(8 * MiB, 16 * KiB, 3), (16 * MiB, 32 * KiB, 3), (128 * MiB, 64 * KiB, 11), (8 * GiB, 512 * KiB, 86)],
)
def test_nvls_chunksize_sets_the_chunk_as_calccollchunking_does(size: int, chunk: int, loops: int) -> None:
    """8 B200s, NCCL_NVLS_CHUNKSIZE=512 KiB, 24 NVLS CTAs of 8 heads (NCCL 2.28): a channel's part is about
    size / 24, so 8 MiB (341 KiB a channel) runs 16 KiB chunks in ceil(341 / 128) = 3 loops, 16 MiB 32 KiB, 128 MiB
    64 KiB in 11 loops, and only from 64 x 8 x 512 KiB = 256 MiB a channel (6 GiB) does the 512 KiB chunk hold:
    8 GiB in ceil(341.3 MiB / 4 MiB) = 86 loops."""
    st = settings_from_env(B200_ENV)
    p = platform_of(dgx_host(gpu="b200"), tuple(range(8)), st)
    choice = choose(Collective("all_reduce", tuple(range(8)), size, "fp32"), dgx_host(gpu="b200"), opts(**B200_ENV))
    assert (choice.algorithm, choice.channels) == ("nvls", 24)
    part = size // 24
    assert nccl_nvls_chunk(part, 8, 512 * KiB, 512 * KiB) == chunk  # (the closed form at these sizes)
    assert collective_chunk("all_reduce", "nvls", "Simple", p, st, size, 24) == chunk
    assert math.ceil(part / (8 * chunk)) == loops


def test_nvls_chunksize_above_the_step_is_cut_to_the_step() -> None:
    """NVLS's chunk starts at the Simple step (NCCL_BUFFSIZE / 8) and takes NCCL_NVLS_CHUNKSIZE only below it: 1 MiB
    asked with the default 4 MiB buffer runs 512 KiB chunks at 16 GiB (682.7 MiB a channel, not below 64 x 8 x
    512 KiB); an 8 MiB buffer lets the 1 MiB through (not below 64 x 8 x 1 MiB = 512 MiB)."""
    env = {**B200_ENV, "NCCL_NVLS_CHUNKSIZE": "1048576"}
    topo = dgx_host(gpu="b200")
    for buff, want in ((None, 512 * KiB), ("8388608", MiB)):
        st = settings_from_env({**env, **({"NCCL_BUFFSIZE": buff} if buff else {})})
        p = platform_of(topo, tuple(range(8)), st)
        assert collective_chunk("all_reduce", "nvls", "Simple", p, st, 16 * GiB, 24) == want


def opts(granularity: str = "coarse", **env: str) -> AlgoOptions:
    return AlgoOptions(granularity=granularity, nccl_env=nccl_env(env))


def nvls_tree_dag(size: int):
    """The chunked flows of an NVLS-Tree all-reduce of `size` on 2 hosts x 8 H100s (16 CTAs x 8 heads)."""
    topo = rail_optimized(2, 8, gpu="h100")
    return decompose(Collective("all_reduce", tuple(range(16)), size, "fp32"), topo, opts("chunked"))


def test_chunked_nvls_tree_keeps_each_gpus_nvls_bytes() -> None:
    """Split into each loop's reduce and multicast, a host's NVLS flows still carry S (m + 1) / m bytes a GPU each
    way (a head's NVLink: its copy of every chunk up and its reduced chunks down, then its chunks up once and every
    chunk down), S = 64 MiB, m = 8, as the coarse flows do."""
    size = 64 * MiB
    dag = nvls_tree_dag(size)
    assert (dag.choice or {})["algorithm"] == "NVLSTree"
    intra = [f for f in dag.flows if "nvls_tree/intra" in f.tag and f.size and not is_credit(f)]
    sent: dict[int, int] = {}
    for f in intra:
        sent[f.src] = sent.get(f.src, 0) + f.size
    assert len(sent) == 16
    assert set(sent.values()) == {math.ceil(size * 9 / 8)}


def test_chunked_nvls_tree_orders_each_loop_reduce_tree_multicast() -> None:
    """runNvlsTree's order, loop by loop (16 MiB: 128 KiB a channel, 64 KiB chunks after the ladder, 2 loops): every
    tree chunk a host sends up (or, at the root, down) in loop k waits for its host's NVLS reduce of loop k, and
    the host's multicast of loop k waits for every tree chunk of loop k to be back at the host; no multicast waits
    for a later loop's tree."""
    dag = nvls_tree_dag(16 * MiB)
    by_id = {f.id: f for f in dag.flows}
    done = {f.id: f for f in dag.flows if f.tag.endswith("/done")}
    back = {f.id: f for f in dag.flows if f.tag.endswith("/back")}
    assert len(done) == len(back) == 2 * 2  # 2 hosts x 2 loops
    for f in done.values():
        loop = int(f.tag.split("/loop")[1].split("/")[0])
        assert all(by_id[d].tag.endswith(f"reduce/chunk{loop}") for d in f.deps)
        assert len(f.deps) == 8  # every GPU's reduce flow of the loop
    tree = [f for f in dag.flows if "nvls_tree/inter" in f.tag and f.size]
    waits = [f for f in tree if any(d in done for d in f.deps)]
    assert waits  # the tree's first hops wait for their host's reduce
    for f in waits:
        chunk = int(f.tag.rsplit("chunk", 1)[1]) if "chunk" in f.tag else 0
        loops = {int(done[d].tag.split("/loop")[1].split("/")[0]) for d in f.deps if d in done}
        assert loops == {chunk}
    for f in back.values():
        loop = int(f.tag.split("/loop")[1].split("/")[0])
        tags = [by_id[d].tag for d in f.deps]
        assert tags and all("nvls_tree/inter" in t or "/done" in t for t in tags)
        assert all(t.rsplit("chunk", 1)[1] == str(loop) for t in tags if "nvls_tree/inter" in t)
    multicast = [f for f in dag.flows if "multicast" in f.tag]
    assert multicast and all(any(d in back for d in f.deps) for f in multicast)
