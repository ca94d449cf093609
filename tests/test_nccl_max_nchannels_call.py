"""NCCL_MAX_NCHANNELS against the channels a call runs, not the communicator's (tuning.channel_limit).

NVIDIA/nccl enqueue.cc `topoGetAlgoInfo` (v2.26.2-1, the same in v2.30.7-1): a ring or tree call starts from
comm->nChannels and drops one channel while nBytes < nc x nThreads x threadThreshold (Simple: 512 threads, 64 bytes
each). NCCL_MAX_NCHANNELS caps comm->nChannels only (connect.cc), so a cap at or above the call's own count leaves
the call's kernel as it was: the same channels, threads and bytes. On 8 A100s NCCL opens 24 channels; a Simple ring
all-reduce of 256 KiB runs 8 of them, of 640 KiB 20. The expected counts below come from that rule, written out here.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.tuning import channel_limit
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host

KiB, GiB = 1 << 10, 1 << 30
RING = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
A100_CHANNELS = 24  # NCCL's own comm->nChannels on an 8-GPU A100 host (12 NVLinks: 12 found, doubled)


def own_channels(nbytes: int, comm: int) -> int:
    """topoGetAlgoInfo's ring channel tuning for Simple: 512 threads x 64 bytes a channel."""
    nc = comm
    while nbytes < nc * 512 * 64 and nc >= 2:
        nc -= 1
    return nc


def _run(nbytes: int, env: dict[str, str]) -> tuple[float, dict]:
    topo = dgx_host(gpu="a100")
    coll = Collective("all_reduce", tuple(range(8)), nbytes, "bf16")
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(env)))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()), dag.choice or {}


@pytest.mark.parametrize(("nbytes", "cap"), [(128 * KiB, 4), (256 * KiB, 16), (256 * KiB, 8), (512 * KiB, 16)])
def test_a_cap_at_or_above_the_calls_own_channels_changes_nothing(nbytes: int, cap: int) -> None:
    """The call runs own_channels(nbytes, 24) <= cap channels with or without the cap: the same time and rate
    (before, every capped call was slowed by cap / 24, 256 KiB under a cap of 16 by 5.6 %)."""
    own = own_channels(nbytes, A100_CHANNELS)
    assert own <= cap
    t0, free = _run(nbytes, RING)
    t1, capped = _run(nbytes, {**RING, "NCCL_MAX_NCHANNELS": str(cap)})
    assert free["channels"] == capped["channels"] == own
    assert capped["model_algbw_gbs"] == free["model_algbw_gbs"]
    assert t1 == t0


@pytest.mark.parametrize("nbytes", [128 * KiB, 256 * KiB, 512 * KiB, 640 * KiB, 704 * KiB, GiB])
def test_the_share_is_the_capped_calls_channels_over_the_uncapped_calls(nbytes: int) -> None:
    """Under NCCL_MAX_NCHANNELS=16 the share of the kernel's rate is own_channels(n, 16) / own_channels(n, 24):
    1 up to 512 KiB, 16/20 at 640 KiB, 16/22 at 704 KiB, 16/24 from 768 KiB on (a 1 GiB call)."""
    topo = dgx_host(gpu="a100")
    ranks = tuple(range(8))
    st = settings_from_env({**RING, "NCCL_MAX_NCHANNELS": "16"})
    p = platform_of(topo, ranks, st)
    want = min(1.0, own_channels(nbytes, 16) / own_channels(nbytes, A100_CHANNELS))
    assert channel_limit("ring", "Simple", p, st, nbytes) == pytest.approx(want, rel=1e-12)
    assert channel_limit("ring", "Simple", p, settings_from_env(RING), nbytes) == 1.0
