"""A protocol kernel's per-CTA rate (`proto_rate.py`) times the CTAs NCCL actually runs at small sizes.

enqueue.cc `topoGetAlgoInfo` (v2.30.7-1) runs a ring or tree on fewer channels while nBytes < nc x nt x
threadThreshold (LL: 512 threads and 8 B a thread, x nranks for the ring; LL128: 640 threads and 8 B), and on one
channel halves the threads (while a multiple of 128) under the same rule. An A100's LL / LL128 all-reduce kernel
reaches its achieved bus bandwidth over NCCL's 24 CTAs on 8 GPUs, so each CTA 1/24 of it, and a CTA of fewer threads
proportionally less; the algorithm bandwidth of a ring is the bus bandwidth x n / 2(n - 1)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.proto_rate import achieved_busbw
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import dgx_host

KiB = 1 << 10
A100 = dgx_host(gpu="a100")
RING = 8 / 14  # algbw / busbw of a ring all-reduce on 8 ranks


def ring(size: int, proto: str):
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": proto}
    choice = choose(Collective("all_reduce", tuple(range(8)), size, "fp32"), A100, AlgoOptions(nccl_env=nccl_env(env)))
    assert choice is not None and (choice.algorithm, choice.protocol) == ("ring", proto)
    return choice


@pytest.mark.parametrize(
    ("size", "channels", "threads"),
    [
        (256 * KiB, 8, 512),  # 8 x 512 x 64 = 256 KiB: the boundary, 8 channels
        (256 * KiB - 1, 7, 512),  # one byte less: 7 (7 x 32 KiB = 224 KiB <= it)
        (768 * KiB, 24, 512),  # all 24 from 24 x 32 KiB
        (8 * KiB, 1, 128),  # one channel, its threads halved twice: 8 KiB >= 128 x 64 B
    ],
)
def test_ring_ll_rate_follows_the_ctas_run(size: int, channels: int, threads: int) -> None:
    choice = ring(size, "LL")
    bus = achieved_busbw("ampere", "LL")
    assert bus is not None
    assert choice.channels == channels
    assert choice.algbw == pytest.approx(bus / 24 * channels * threads / 512 * RING)


def test_ring_ll128_rate_at_half_the_channels() -> None:
    """LL128: 640 threads x 8 B = 5 KiB a channel; 60 KiB runs 12 channels, half of NCCL's 24, at half the kernel's
    achieved rate; from 120 KiB all 24 and the whole of it."""
    bus = achieved_busbw("ampere", "LL128")
    assert bus is not None
    half, full = ring(60 * KiB, "LL128"), ring(120 * KiB, "LL128")
    assert (half.channels, full.channels) == (12, 24)
    assert half.algbw == pytest.approx(bus / 2 * RING)
    assert full.algbw == pytest.approx(bus * RING)


@pytest.mark.parametrize(("size", "proto"), [(1 * KiB, "LL"), (2 * KiB, "LL"), (1 * KiB, "LL128")])
def test_a_tree_on_one_channel_keeps_all_its_threads(size: int, proto: str) -> None:
    """From NCCL 2.22 a tree runs all its threads whatever the size (enqueue.cc `topoGetAlgoInfo`: "Tree now uses
    all threads always"; the halving on one channel is the ring's): an A100 tree all-reduce of 1-2 KiB runs one
    channel, 1/24 of the protocol kernel's rate over NCCL's 24 full CTAs, at the tree's algbw / busbw of 1/2, not
    a quarter (LL: 1 KiB < 256 x 8 B would halve 512 threads twice) or a half (LL128: 1 KiB < 640 x 8 B)."""
    env = {"NCCL_ALGO": "Tree", "NCCL_PROTO": proto}
    choice = choose(Collective("all_reduce", tuple(range(8)), size, "fp32"), A100, AlgoOptions(nccl_env=nccl_env(env)))
    bus = achieved_busbw("ampere", proto)
    assert choice is not None and bus is not None
    assert (choice.algorithm, choice.channels) == ("tree", 1)
    assert choice.algbw == pytest.approx(bus / 24 * 0.5)
