"""NCCL 2.22+'s split of one collective over its channels and the chunk each channel's part gets (enqueue.cc
`scheduleCollTasksToPlan` and `calcCollChunking` at v2.22.3-1, v2.26.2-1 and v2.30.7-1). Every expected value is
worked out by hand in the docstring from the source's arithmetic: traffic = bytes x 2 for all-reduce, x nranks for
all-gather; budget = traffic // channels; cells of 16 B (2.22) or of MinTrafficPerChannel traffic (16 KiB from
2.23, 32 KiB from 2.29); the lo part floor (2.22) or ceil (2.23+) of budget / traffic per cell, each mid part ceil,
the hi part the rest."""

from __future__ import annotations

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.channel_split import busiest, split
from phantora.collectives.nccl.channels import plan_channels
from phantora.collectives.nccl.chunking import chunk_bytes
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.proxy import steps_per_connection
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.topology import load_topology

MiB = 1 << 20


def h100s(nodes: int, per_node: int = 8) -> Platform:
    """`nodes` hosts of `per_node` H100s on NVSwitch and 400G NICs, as NCCL's tuner sees them."""
    return Platform("hopper", 90, nodes * per_node, nodes, per_node, "nvlink", True, 360.0, 50.0 if nodes > 1 else 0.0,
                    per_node if nodes > 1 else 0)  # fmt: skip


def chunk(version: str, algo: str, proto: str, p: Platform, nbytes: int, ops: int, **env: str) -> int:
    return chunk_bytes(algo, proto, p, settings_from_env({"PHANTORA_NCCL_VERSION": version, **env}), nbytes, ops)


def test_before_2_22_there_is_no_split() -> None:
    """NCCL 2.21 strides every channel through the whole buffer (computeCollChunkInfo on the total bytes)."""
    assert split((2, 21), "all_reduce", "LL128", 8, 4 * MiB, 24) is None
    assert busiest((2, 21), "all_reduce", "LL128", 8, 4 * MiB, 24) is None


def test_ring_ll128_4mib_24_channels_at_2_22_26_30() -> None:
    """4 MiB all-reduce, 24 channels: traffic 8,388,608, budget 349,525.
    2.22: 16 B cells (32 B of traffic): 262,144 cells, mid = ceil(349,525 / 32) = 10,923, lo = floor = 10,922,
    22 mids (251,222 // 10,923), hi = 251,222 - 22 x 10,923 = 10,916: 24 parts, the busiest 174,768 B.
    2.26: 8 KiB cells (16 KiB of traffic): 512 cells, lo = mid = ceil(349,525 / 16,384) = 22, 22 mids, hi = 6:
    the busiest 180,224 B, the last 49,152 B. 2.30: budget rounded up to 16 B (349,536), 16 KiB cells (32 KiB of
    traffic): 256 cells, lo = mid = 11, 22 mids, hi = 3: the same 180,224 B and 49,152 B."""
    old = split((2, 22), "all_reduce", "LL128", 8, 4 * MiB, 24)
    assert old == (10_922 * 16, *[10_923 * 16] * 22, 10_916 * 16)
    new = split((2, 26), "all_reduce", "LL128", 8, 4 * MiB, 24)
    assert new == (180_224, *[180_224] * 22, 49_152)
    assert split((2, 30), "all_reduce", "LL128", 8, 4 * MiB, 24) == new
    assert sum(new) == 4 * MiB
    assert busiest((2, 26), "all_reduce", "LL128", 8, 4 * MiB, 24) == (180_224, 24)


def test_tree_ll128_1mib_one_host_uses_22_of_24_channels_from_2_23() -> None:
    """1 MiB all-reduce on one host of 8, 24 channels: budget 2,097,152 // 24 = 87,381.
    2.22: 65,536 cells of 16 B, mid ceil(87,381 / 32) = 2,731, lo 2,730, 22 mids, hi 2,724: 24 channels, the
    busiest 43,696 B. 2.26: 128 cells of 8 KiB, lo = mid = ceil(87,381 / 16,384) = 6, 20 mids (122 // 6), hi 2:
    22 channels, the busiest 49,152 B. The chunk is the same at both: the ladder (nstepsLL128 = 1.8, rungs 14.4 and
    3.6 chunks) halves 576,000 to 72,000 and then, at 0 and 1 chunk of 43,696 or 49,152 B, to 18,000, cut to 9
    grains of 1,920 B: 17,280."""
    old = split((2, 22), "all_reduce", "LL128", 8, MiB, 24)
    assert old is not None and len(old) == 24 and max(old) == 43_696
    new = split((2, 26), "all_reduce", "LL128", 8, MiB, 24)
    assert new == (49_152, *[49_152] * 20, 16_384)
    assert chunk("2.22", "tree", "LL128", h100s(1), MiB, 24) == chunk("2.26", "tree", "LL128", h100s(1), MiB, 24)
    assert chunk("2.26", "tree", "LL128", h100s(1), MiB, 24) == 17_280


def test_tree_ll128_chunk_follows_the_busiest_part_not_the_mean() -> None:
    """3,407,872 B (416 cells of 8 KiB), one host of 8, 24 channels. 2.21: 3,407,872 // (24 x 72,000) = 1 < 3.6
    and // (24 x 36,000) = 3 < 3.6, so 18,000. 2.26: budget 6,815,744 // 24 = 283,989, lo = mid = 18 cells
    (147,456 B), 22 mids, hi 2; 147,456 // 72,000 = 2 < 3.6 halves to 36,000, and 147,456 // 36,000 = 4 stops:
    18 grains, 34,560. (The mean share, 141,994 B, would halve once more.)"""
    assert chunk("2.21", "tree", "LL128", h100s(1), 3_407_872, 24) == 18_000
    assert chunk("2.26", "tree", "LL128", h100s(1), 3_407_872, 24) == 34_560


def test_nvls_tree_simple_8_hosts_24_ctas() -> None:
    """NVLS-Tree on 8 hosts of 8 (chunk min(128 KiB, 64 KiB from 4 nodes) = 65,536), 24 CTAs (NCCL_MIN_CTAS=24,
    #309's tuned run: the communicator's NVLS channels too), 8 heads.
    128 MiB at 2.26: 16,384 cells of 8 KiB, budget 268,435,456 // 24 = 11,184,810, lo = mid = 683 cells, 22 mids,
    hi 675: the busiest 5,595,136 B, above 4 x 8 x 65,536, so 65,536 (as 2.21 from the total). 12,451,840 B:
    2.21 from the total: below 1 x 192 x 65,536 = 12,582,912, so 32,768; 2.26: 1,520 cells, budget 1,037,653,
    lo = mid = 64 cells = 524,288 B, not below 1 x 8 x 65,536 = 524,288: 65,536 (the hi part, 48 cells, would get
    32,768)."""
    parts = split((2, 26), "all_reduce", "Simple", 64, 128 * MiB, 24)
    assert parts == (683 * 8192, *[683 * 8192] * 22, 675 * 8192)
    ctas = {"NCCL_MIN_CTAS": "24"}
    assert chunk("2.21", "nvls_tree", "Simple", h100s(8), 128 * MiB, 24 * 8, **ctas) == 65_536
    assert chunk("2.26", "nvls_tree", "Simple", h100s(8), 128 * MiB, 24 * 8, **ctas) == 65_536
    assert chunk("2.21", "nvls_tree", "Simple", h100s(8), 12_451_840, 24 * 8, **ctas) == 32_768
    assert chunk("2.26", "nvls_tree", "Simple", h100s(8), 12_451_840, 24 * 8, **ctas) == 65_536


def test_all_gather_cells_carry_nranks_traffic_per_byte() -> None:
    """All-gather of 8 MiB on 8 ranks (count 1 MiB), 2.26: traffic 8 x 1 MiB, 16 KiB of it per cell = 2 KiB of
    count; budget 349,525, lo = mid = 22 cells, 22 mids, hi 6. 2.26 LL counts 4 x the traffic: 512 B cells, budget
    4 x 8,388,608 // 24 = 1,398,101, lo = mid = ceil(1,398,101 / 16,384) = 86 cells, 22 mids (1,962 // 86), hi 70:
    24 channels."""
    assert split((2, 26), "all_gather", "Simple", 8, MiB, 24) == (45_056, *[45_056] * 22, 12_288)
    assert busiest((2, 26), "all_gather", "Simple", 8, 8 * MiB, 24) == (8 * 45_056, 24)  # nranks x the count part
    ll = split((2, 26), "all_gather", "LL", 8, MiB, 24)
    assert ll == (86 * 512, *[86 * 512] * 22, 70 * 512)


def test_small_collective_on_one_channel_and_excess_off_the_last_part() -> None:
    """100 B LL all-reduce at 2.26 on 24 channels: 2 x 4 traffic a byte, cells of 16 KiB / 8 = 2 KiB, traffic
    max(16 KiB, 800) and the budget max(16 KiB, 16,384 // 24): lo = min(1 cell, ceil(16,384 / 16,384)) = 1, so one
    channel of 100 B (2,048 - 1,948 of excess off lo)."""
    assert split((2, 26), "all_reduce", "LL", 8, 100, 24) == (100,)


def test_proxy_steps_come_from_the_busiest_part() -> None:
    """A 401,408 B tree LL128 all-reduce on 2 hosts of 8, 24 channels (NCCL_MIN_NCHANNELS=24: the communicator
    has 16 by default, too few for 24). 2.26: 49 cells of 8 KiB, budget
    802,816 // 24 = 33,450 (above 16 KiB), lo = mid = ceil(33,450 / 16,384) = 3 cells, 15 mids, hi 1: 17 channels,
    the busiest 24,576 B. The ladder (nstepsLL128 = 1 + 1 + 0.8 = 2.8, rungs 22.4 and 5.6 chunks) halves 576,000 to
    72,000, then at 0 chunks to 36,000 and 18,000: 9 grains, 17,280 B. The proxy's steps on a busiest channel's
    connection: ceil(24,576 / 17,280) = 2 (an even share, 16,725 B, would take 1)."""
    st = settings_from_env({"PHANTORA_NCCL_VERSION": "2.26", "NCCL_MIN_NCHANNELS": "24"})
    assert chunk("2.26", "tree", "LL128", h100s(2), 401_408, 24, NCCL_MIN_NCHANNELS="24") == 17_280
    assert steps_per_connection("all_reduce", "tree", "LL128", h100s(2), st, 401_408, 24) == 2


def test_a_split_past_the_algorithms_channels_goes_on_the_communicators_next_one() -> None:
    """scheduleCollTasksToPlan (v2.30.7-1) budgets by the channels the algorithm runs (16 here) but overflows
    only past the communicator's (nMaxChannels[kind]). 524,292 B all-reduce at 2.30: cells of 16 KiB (32 KiB of
    traffic), 33 of them (540,672 B, 16,380 of excess); budget (1,048,584 // 16 = 65,536) rounded up to 16 B:
    65,536, so lo = mid = 2 cells, 15 mids (31 // 2), hi 1 cell: 17 parts. On 24 channels the 17th goes on the
    next channel: 16 parts of 32,768 B and one of 16,384 - 16,380 = 4 B. On a communicator of 16 it overflows:
    14 mids of (33 - 2) // 15 = 2 cells, hi 2 + 31 % 15 = 3 cells less the excess, 32,772 B."""
    on_24 = split((2, 30), "all_reduce", "Simple", 8, 524_292, 16, 24)
    assert on_24 == (*[32_768] * 16, 4)
    on_16 = split((2, 30), "all_reduce", "Simple", 8, 524_292, 16, 16)
    assert on_16 == (*[32_768] * 15, 32_772)
    assert sum(on_24) == sum(on_16) == 524_292


def test_a_communicator_of_one_channel_takes_the_whole_count() -> None:
    """v2.22.3-1, 1,000 B all-reduce, an algorithm on one channel: 63 cells of 16 B (1,008 B, 8 of excess);
    budget max(512, 2,000 // 1) = 2,000, lo = floor(2,000 / 32) = 62 cells, mid ceil = 63, hi 1 cell: on a
    communicator of 24 channels 992 B on channel 0 and 8 B on channel 1; on one of 1 channel (NCCL_MAX_NCHANNELS=1)
    'on last channel everything goes to lo': the whole 1,000 B."""
    assert split((2, 22), "all_reduce", "LL", 8, 1000, 1, 24) == (992, 8)
    assert split((2, 22), "all_reduce", "LL", 8, 1000, 1, 1) == (1000,)


def test_the_communicators_channels_follow_nccls_variables() -> None:
    """nMaxChannels[kind]: comm->nChannels for ring and tree (8 A100s: 2 x 12 search channels = 24; NCCL_MAX_
    NCHANNELS=4 -> 4; NCCL_MIN_NCHANNELS=32 -> 32), comm->nvlsChannels for NVLS and NVLS-Tree (16 on Hopper;
    NCCL_MIN_CTAS=24 -> 24; NCCL_MIN_NCHANNELS does not touch it)."""
    a100 = Platform("ampere", 80, 8, 1, 8, "nvlink", True, 240.0, 0.0, 0)
    assert plan_channels("ring", a100, settings_from_env({})) == 24
    assert plan_channels("ring", a100, settings_from_env({"NCCL_MAX_NCHANNELS": "4"})) == 4
    assert plan_channels("tree", a100, settings_from_env({"NCCL_MIN_NCHANNELS": "32"})) == 32
    assert plan_channels("nvls", h100s(1), settings_from_env({})) == 16
    assert plan_channels("nvls_tree", h100s(2), settings_from_env({"NCCL_MIN_CTAS": "24"})) == 24
    assert plan_channels("nvls", h100s(1), settings_from_env({"NCCL_MIN_NCHANNELS": "32"})) == 16


def test_nvls_ctas_follow_the_cta_bounds_not_nccl_max_nchannels() -> None:
    """nvls.cc (v2.18.5-1 to v2.30.7-1) clamps comm->nvlsChannels to [minCTAs, maxCTAs] only; NCCL_MAX_NCHANNELS
    bounds comm->nChannels (connect.cc), whose minimum is applied after the maximum (copyChannels) and so wins.
    16 MiB all-reduce on testbed16 (2 x 8 H100): NVLS-Tree on its 16 CTAs under NCCL_MAX_NCHANNELS=4, on 4 under
    NCCL_MAX_CTAS=4; a ring under NCCL_MAX_NCHANNELS=4 with NCCL_MIN_NCHANNELS=8 opens 8."""
    assert plan_channels("nvls_tree", h100s(2), settings_from_env({"NCCL_MAX_NCHANNELS": "4"})) == 16
    assert plan_channels("nvls_tree", h100s(2), settings_from_env({"NCCL_MAX_CTAS": "4"})) == 4
    both = settings_from_env({"NCCL_MAX_NCHANNELS": "4", "NCCL_MIN_NCHANNELS": "8"})
    assert plan_channels("ring", h100s(2), both) == 8
    topo, coll = load_topology("testbed16"), Collective("all_reduce", tuple(range(16)), 16 * MiB, "fp32")
    for env, channels in (({"NCCL_MAX_NCHANNELS": "4"}, 16), ({"NCCL_MAX_CTAS": "4"}, 4)):
        choice = choose(coll, topo, AlgoOptions(nccl_env=nccl_env(env)))
        assert (choice.algorithm, choice.channels) == ("nvls_tree", channels)


def test_proxy_steps_deal_the_parts_onto_the_communicators_channels() -> None:
    """A 524,276 B tree LL all-reduce at 2.22 on 2 hosts of 8 (16 channels by default), the tree on 16: cells of
    16 B, 32,768 of them (12 B of excess), budget 1,048,552 // 16 = 65,534, lo floor(65,534 / 32) = 2,047 cells,
    mids ceil = 2,048: 15 mids and a hi of 1 cell, 17 parts. With NCCL_MIN_NCHANNELS=32 the 17th (4 B) goes on
    channel 16 and the busiest part is 32,768 B: one LL step of 32,768 B (the 512 KiB LL buffer's 8 steps, half
    data); on the default 16 channels the rest overflows onto the last, 2,049 cells less 12 B = 32,772 B: 2 steps."""
    default = settings_from_env({"PHANTORA_NCCL_VERSION": "2.22"})
    wider = settings_from_env({"PHANTORA_NCCL_VERSION": "2.22", "NCCL_MIN_NCHANNELS": "32"})
    assert steps_per_connection("all_reduce", "tree", "LL", h100s(2), default, 524_276, 16) == 2
    assert steps_per_connection("all_reduce", "tree", "LL", h100s(2), wider, 524_276, 16) == 1
