"""A chunked ring's flows carry NCCL 2.22+'s own step bytes (`nccl/ring_loops.py`).

Expected byte lists are written out here from NCCL v2.30.7-1's formulas: the channel parts of enqueue.cc
`scheduleCollTasksToPlan` (32 KiB of traffic a cell from 2.29, an all-reduce's traffic 2 bytes a byte, the budget
traffic / channels rounded up to 16 B), the chunk of `calcCollChunking` (the buffer over NCCL_STEPS, 4 steps a
Simple ring chunk, whole 512 B grains) and all_reduce.h / all_gather.h `runRing` (a short last loop's chunk
alignUp(divUp(rest, nranks), 16 B), chunk j min(chunk, rest - j x chunk)). None comes from the code under test.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import rail_optimized
from tests.engine_pair import flow_and_ns3_end_ns

KiB, MiB = 1 << 10, 1 << 20
HOST8 = rail_optimized(1, 8, gpu="h100")  # one 8-GPU H100 host: 24 ring channels
HOSTS4 = rail_optimized(2, 2, gpu="h100")  # 2 hosts x 2 H100


def chunked(**env: str) -> AlgoOptions:
    return AlgoOptions(granularity="chunked", nccl_env=nccl_env(env))


def sends(dag_flows: list, channel: int, src: int, dst: int) -> list[int]:
    """The bytes `src` sends to `dst` on `channel`, in the order the flows were made (pass by pass, step by step).
    A GPU's NIC also carries the hops another GPU of its host sends to the next host (nccl/nvswitch_rings.py), so
    the receiver is named too. A Simple chunk moves as its slices (`/slice0`, `/slice1`: tests/test_ring_slices.py),
    summed here into their chunk."""
    out: dict[str, int] = {}
    for f in dag_flows:
        if (f.src, f.dst) == (src, dst) and f.tag.startswith(f"ring/ch{channel}/"):
            chunk = f.tag.rpartition("/slice")[0] or f.tag
            out[chunk] = out.get(chunk, 0) + f.size
    return list(out.values())


def test_one_mib_and_17_bytes_on_8_ranks() -> None:
    """2^20 + 17 B, Simple ring, 8 H100s (24 channels). Parts: 2 x (2^20 + 17) B of traffic over 24 channels is
    87,383.3, rounded up to 16 B: 87,392; a cell is 32 KiB of traffic, 16 KiB of count; 87,392 B is 2.67 cells,
    so 3 cells (49,152 B) a channel: 21 channels of 49,152 B and the last of 2^20 + 17 - 21 x 49,152 = 16,401 B.
    A 2 MiB chunk: one short loop on each. 49,152 B: chunk alignUp(6,144, 16) = 6,144, 8 equal chunks. 16,401 B:
    alignUp(ceil(16,401 / 8) = 2,051, 16) = 2,064, chunks 0-6 2,064 B and chunk 7 16,401 - 7 x 2,064 = 1,953 B.
    Rank 0 (ring index 0) sends chunk (0 - s - 1) mod 8 at step s of the 14: 7, 6, ..., 0, then 7, ..., 1."""
    dag = decompose(
        Collective("all_reduce", tuple(range(8)), MiB + 17, "fp32"),
        HOST8,
        chunked(NCCL_ALGO="Ring", NCCL_PROTO="Simple"),
    )
    assert dag.choice is not None and (dag.choice["algorithm"], dag.choice["channels"]) == ("Ring", 24)
    assert sum(f.size for f in dag.flows) == 14 * (MiB + 17)  # each of the 14 steps moves every channel's part
    for c in range(21):
        assert sends(dag.flows, c, 0, 1) == [6144] * 14
    chunk = [2064] * 7 + [1953]
    order = [(0 - s - 1) % 8 for s in range(7)] + [(0 - s) % 8 for s in range(7)]
    assert sends(dag.flows, 21, 0, 1) == [chunk[j] for j in order]
    assert max(int(f.tag.split("/")[1][2:]) for f in dag.flows) == 21  # 22 parts, not 24 even shares


def test_several_loops_and_a_short_last_one() -> None:
    """One channel (NCCL_MAX_NCHANNELS=1) and 4 ranks: 2 loops of 4 x 2 MiB and 40 B. Loops 0 and 1: four 2 MiB
    chunks; the last: alignUp(ceil(40 / 4), 16) = 16 B, chunks 16, 16, 8 and an empty one. Each rank sends, pass by
    pass, 6 steps; rank 0 (ring 0 1 2 3) sends chunk (0 - s - 1) mod 4 at step s < 3, (0 - s) mod 4 after."""
    size = 2 * 4 * 2 * MiB + 40
    env = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "1"}
    dag = decompose(Collective("all_reduce", (0, 1, 2, 3), size, "fp32"), HOSTS4, chunked(**env))
    assert dag.choice is not None and dag.choice["channels"] == 1
    order = [(0 - s - 1) % 4 for s in range(3)] + [(0 - s) % 4 for s in range(3)]
    last = [16, 16, 8, 0]
    assert sends(dag.flows, 0, 0, 1) == [2 * MiB] * 12 + [last[j] for j in order]
    assert sum(f.size for f in dag.flows if not is_credit(f)) == 4 * 6 * size // 4


def test_all_gather_blocks_end_in_a_short_piece() -> None:
    """An all-gather's rank block is cut in whole chunks and one short piece, not re-aligned (all_gather.h): 4
    ranks, one channel, a block of 2 MiB + 1,000 B (the output 4 blocks): pieces 2 MiB and 1,000 B, each rank
    sending 3 steps a pass."""
    block = 2 * MiB + 1000
    env = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "1"}
    dag = decompose(Collective("all_gather", (0, 1, 2, 3), 4 * block, "fp32"), HOSTS4, chunked(**env))
    assert sends(dag.flows, 0, 2, 3) == [2 * MiB] * 3 + [1000] * 3


@pytest.mark.ns3
def test_flow_and_packet_engines_carry_the_same_steps(ns3_lib) -> None:
    """A tiny case through both engines: a 128 KiB buffer (16 KiB steps, a 64 KiB chunk), one channel, 4 ranks,
    4 x 64 KiB + 40 B: one whole loop, then 16, 16, 8 and 0 B chunks. Both the flow network and ns-3 deliver
    each of those flows whole (`flow_and_ns3_end_ns` checks every flow's bytes), within 5% of each other."""
    env = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "1", "NCCL_BUFFSIZE": str(128 * KiB)}
    dag = decompose(Collective("all_reduce", (0, 1, 2, 3), 4 * 64 * KiB + 40, "fp32"), HOSTS4, chunked(**env))
    last = [16, 16, 8, 0]
    order = [(0 - s - 1) % 4 for s in range(3)] + [(0 - s) % 4 for s in range(3)]
    assert sends(dag.flows, 0, 0, 1) == [64 * KiB] * 6 + [last[j] for j in order]
    times = flow_and_ns3_end_ns(HOSTS4, dag.flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.05)


def test_a_simple_chunk_is_cut_to_grains_whole_not_step_by_step() -> None:
    """calcCollChunking (2.22+) rounds the 4-step chunk down to whole 512 B grains, not each step: NCCL_BUFFSIZE =
    8 x 65,736 B, a step of 65,736 B (200 B past 128 grains), a chunk of 262,944 B -> 513 grains = 262,656 B (four
    whole-grain steps would be 262,144). A loop of 4 such chunks on 4 ranks and one channel: every step 262,656 B,
    in 2 slices of 131,328 B (65,664 floats: divUp(65,664, 32) x 16 = 32,832 floats)."""
    env = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "1", "NCCL_BUFFSIZE": str(8 * 65_736)}
    dag = decompose(Collective("all_reduce", (0, 1, 2, 3), 4 * 262_656, "fp32"), HOSTS4, chunked(**env))
    assert {f.size for f in dag.flows if not is_credit(f)} == {131_328}
    assert set(sends(dag.flows, 0, 0, 1)) == {262_656}
