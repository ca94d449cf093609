"""NCCL_MIN_P2P_NCHANNELS / NCCL_MAX_P2P_NCHANNELS, against NCCL's own arithmetic (paths.cc
`ncclTopoComputeP2pChannels`, v2.18.5-1 to v2.30.7-1): p2pnChannels = pow2Up(max(min(nChannels, MAX), MIN)), at
most MAXCHANNELS (64); a transfer's channels are at most them (enqueue.cc `addP2pToPlan`). An 8-GPU H100 host has
24 channels, so 32 p2p channels by default."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.dag import ecmp_key
from phantora.collectives.nccl import choose, platform_of, summarize_choices
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.p2p import p2p_channels
from phantora.collectives.nccl.settings import nccl_env, settings_of
from phantora.errors import InputError
from phantora.topology import dgx_host

MiB = 1 << 20
HOST = dgx_host(gpu="h100")
LINK = T.NVLINK_BW_PER_LINK["hopper"]  # NCCL's per-NVLink rate: a send/recv channel moves one, an a2a's half


def opts(granularity: str = "coarse", **env: str) -> AlgoOptions:
    return AlgoOptions(granularity=granularity, nccl_env=nccl_env(env))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 32),  # pow2Up(24)
        ({"NCCL_MAX_P2P_NCHANNELS": "16"}, 16),
        ({"NCCL_MAX_P2P_NCHANNELS": "17"}, 32),  # the boundary: pow2Up(17)
        ({"NCCL_MAX_P2P_NCHANNELS": "8", "NCCL_MIN_P2P_NCHANNELS": "12"}, 16),  # the least is applied last
        ({"NCCL_MIN_P2P_NCHANNELS": "33"}, 64),  # more p2p channels than the communicator's 24
        ({"NCCL_MIN_P2P_NCHANNELS": "100"}, 64),  # MAXCHANNELS
        ({"NCCL_MAX_P2P_NCHANNELS": "0"}, 1),  # max(min(24, 0), 1)
    ],
)
def test_p2p_channels_follow_nccls_arithmetic(env: dict[str, str], expected: int) -> None:
    p = platform_of(HOST, tuple(range(8)))
    assert p2p_channels(p, settings_of(tuple(env.items()))) == expected


def test_fewer_p2p_channels_slow_a_send_recv_and_an_all_to_all() -> None:
    """256 MiB. A send/recv's transfer is split over up to its p2p channels (16 by default on a pair of the host's
    GPUs, 16 x one NVLink = 329.6 GB/s); NCCL_MAX_P2P_NCHANNELS=4: 4 channels, 4 x 20.6 = 82.4 GB/s (nccl-tests
    measures 79.5 GB/s on 4 channels a peer, tests/data/nccl_tests/SOURCES.md). An all-to-all on 4 p2p channels:
    at least 1 channel a peer (4 halved while 8 ranks x it exceed 4), doubled once as a 32 MiB transfer exceeds
    32 x the 512 KiB chunk: 2 a peer; its 7 peers' parts cover all 4 channels, each moving half a link: 41.2 GB/s
    over NVLink, an algbw of 41.2 x 8 / 7 (its own block does not move)."""
    size = 256 * MiB
    free = choose(Collective("send_recv", (0, 1), size, "fp32"), HOST, opts())
    four = choose(Collective("send_recv", (0, 1), size, "fp32"), HOST, opts(NCCL_MAX_P2P_NCHANNELS="4"))
    assert free is not None and four is not None
    assert (free.channels, four.channels) == (16, 4)
    assert free.algbw == pytest.approx(16 * LINK) and four.algbw == pytest.approx(4 * LINK)
    a2a = choose(Collective("all_to_all", tuple(range(8)), size, "fp32"), HOST, opts(NCCL_MAX_P2P_NCHANNELS="4"))
    assert a2a is not None and a2a.channels == 2
    assert a2a.algbw == pytest.approx(4 * LINK / 2 * 8 / 7)


def test_the_flows_run_on_the_p2p_channels_only() -> None:
    """Chunked all-to-all flows: on 4 p2p channels every part of GPU 0's transfers runs on a channel 0-3 (NCCL's
    base of each round, masked to the p2p channels; a flow's ECMP key is its channel's); by default the host's 32
    are used beyond them."""

    def channels(**env: str) -> set[int]:
        dag = decompose(Collective("all_to_all", tuple(range(8)), 64 * MiB, "fp32"), HOST, opts("chunked", **env))
        src = HOST.node_of_rank(0)
        keys = {f.key: (f.src, f.dst) for f in dag.flows if f.src == src}
        return {c for c in range(T.MAX_CHANNELS) for k, (s, d) in keys.items() if k == ecmp_key(s, d, c)}

    assert channels(NCCL_MAX_P2P_NCHANNELS="4") == {0, 1, 2, 3}
    assert max(channels()) >= 4


@pytest.mark.parametrize("var", ["NCCL_MIN_P2P_NCHANNELS", "NCCL_MAX_P2P_NCHANNELS"])
@pytest.mark.parametrize("value", ["four", "-1", "2.5"])
def test_bad_values_are_one_line_errors_naming_the_variable(var: str, value: str) -> None:
    with pytest.raises(InputError, match=var) as err:
        settings_of(((var, value),))
    assert "\n" not in str(err.value)


def test_the_variables_are_recorded_with_the_others() -> None:
    """What a run records (the NCCL_* variables honoured, results.json `nccl.env`) carries both."""
    env = {"NCCL_MIN_P2P_NCHANNELS": "2", "NCCL_MAX_P2P_NCHANNELS": "8", "UNRELATED": "1"}
    recorded = nccl_env(env)
    assert dict(recorded) == {"NCCL_MIN_P2P_NCHANNELS": "2", "NCCL_MAX_P2P_NCHANNELS": "8"}
    assert summarize_choices([], recorded)["env"] == {"NCCL_MIN_P2P_NCHANNELS": "2", "NCCL_MAX_P2P_NCHANNELS": "8"}
