"""A send's protocol and channels under PHANTORA_NCCL_VERSION, against NCCL's enqueue.cc `addP2pToPlan`:

- 2.29 on (v2.29.2-1 .. v2.30.7-1): the channels from the Simple parts (one node: at least p2pChunkSize / 8 =
  64 KiB a part), then LL if the bytes are at most 16 KiB (NCCL_P2P_LL_THRESHOLD) a channel;
- 2.22 - 2.28 (v2.22.3-1 .. v2.28.9-1): LL if the bytes are at most 16 KiB for each channel a peer may have
  (`thresholdLL = nChannelsMax * ncclParamP2pLLThreshold()`, nChannelsMax = p2pnChannelsPerPeer), then the parts
  cut by LL's step: its buffer (8 x 512 x 8 x 16 B) over NCCL_STEPS (8), 64 KiB, one node's parts at least 1/8 of
  it (8 KiB). Network peers have no LL buffers: Simple.

A peer over an H100 host's NVSwitch may have 32 p2p channels (nChannelsMax: 2 x 18 NVLinks, pow2Up, at most the
host's 32 p2p channels: tests/test_nccl_p2p_nchannels.py); a transfer takes at least nChannelsMin of them, 32 halved
while the communicator's ranks x it exceed 32: 16 on a pair, 4 on 8 ranks."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose, platform_of
from phantora.collectives.nccl.p2p_group import plan_parts
from phantora.collectives.nccl.settings import nccl_env, settings_of
from phantora.topology import Topology, dgx_host, leaf_spine

KiB = 1 << 10
HOST = dgx_host(gpu="h100")
LL_PART = 8 * 512 * 8 * 16 // 8 // 8  # LL's step over 8: 8 KiB
PEER_MOST, PAIR_LEAST = 32, 16  # a peer's p2p channels at most, and a pair's transfer's at least


def send(nbytes: int, version: str, topo: Topology = HOST, ranks: tuple[int, ...] = (0, 1)) -> tuple[str, int]:
    env = nccl_env({"PHANTORA_NCCL_VERSION": version} if version else {})
    c = choose(Collective("send_recv", ranks, nbytes, "uint8"), topo, AlgoOptions(nccl_env=env))
    assert c is not None
    return c.protocol, c.channels


@pytest.mark.parametrize("version", ["", "2.30", "2.29.2", "2.21"])
def test_from_2_29_a_64k_send_is_simple_on_one_channel(version: str) -> None:
    """64 KiB: one Simple part of 64 KiB, so one channel, and 64 KiB > 1 x 16 KiB: Simple (2.21's 64 KiB part
    is above its 16 KiB a part too)."""
    assert send(64 * KiB, version) == ("Simple", 1)


@pytest.mark.parametrize("version", ["2.22.3", "2.26", "2.28.9"])
def test_2_22_to_2_28_take_ll_up_to_16k_a_peer_channel(version: str) -> None:
    assert send(64 * KiB, version) == ("LL", 64 * KiB // LL_PART)  # 8 parts of 8 KiB
    assert send(16 * KiB, version) == ("LL", 2)
    assert send(PEER_MOST * 16 * KiB, version) == ("LL", PAIR_LEAST)  # the boundary, 512 KiB: 64 parts, 16 channels
    assert send(PEER_MOST * 16 * KiB + 16, version)[0] == "Simple"


def test_2_26_ll_send_is_faster_than_2_30s_simple_one() -> None:
    """The LL send on 8 channels beats the Simple one on 1: LL's lower latency and more channels."""
    env26 = nccl_env({"PHANTORA_NCCL_VERSION": "2.26"})
    ll = choose(Collective("send_recv", (0, 1), 64 * KiB, "uint8"), HOST, AlgoOptions(nccl_env=env26))
    simple = choose(Collective("send_recv", (0, 1), 64 * KiB, "uint8"), HOST, AlgoOptions())
    assert ll is not None and simple is not None
    assert ll.time_us < simple.time_us


def test_2_26_across_hosts_stays_simple() -> None:
    two = leaf_spine(1, 16, 0, gpus_per_host=8)
    assert send(64 * KiB, "2.26", two, (0, 8))[0] == "Simple"


def test_2_26_all_to_all_of_256k_a_peer_is_ll() -> None:
    """8 H100s, 2 MiB: 256 KiB a peer <= 32 x 16 KiB: LL, on min(4, 256 KiB / 8 KiB) = 4 channels; 2.30: Simple
    (256 KiB on 4 Simple channels is 64 KiB a channel)."""
    ranks = tuple(range(8))
    for version, proto in (("2.26", "LL"), ("2.30", "Simple")):
        env = nccl_env({"PHANTORA_NCCL_VERSION": version})
        c = choose(Collective("all_to_all", ranks, 2048 * KiB, "uint8"), HOST, AlgoOptions(nccl_env=env))
        assert c is not None and (c.protocol, c.channels) == (proto, 4)


def test_a_group_plans_its_transfers_by_the_same_rule() -> None:
    """A batch_isend_irecv's transfers (p2p_group.plan_parts) follow the release's rule as a lone send does."""
    p = platform_of(HOST, (0, 1))
    for version, want in (("2.26", ("LL", 8)), ("2.30", ("Simple", 1))):
        st = settings_of((("PHANTORA_NCCL_VERSION", version),))
        part = plan_parts(p, st, (0, 0), {(0, 1): 64 * KiB})[(0, 1)]
        assert (part.protocol, len(part.channels)) == want
