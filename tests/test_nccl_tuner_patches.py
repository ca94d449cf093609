"""Older NCCL tuners tag by tag (old_tuners.py): each rating from that tag's src/graph/tuning.cc by hand, including
the patch releases that changed a constant (a minor named alone is its newest patch).

Platforms (published tables' machines): 2 H100 hosts (ring graph 8 x 48 GB/s, NVLS graph 8 x 40 / 48), 1 H100 host
(ring 12 x 30, NVLS 8 x 40), 1 A100 host (ring 12 x 20), 2 A100 hosts (ring 8 x 24), 2 B200 hosts (ring 8 x 48),
1 B200 host (ring 16 x 45), 4 B200 hosts (NVLS 8 x 80 / 48), 4 H100 hosts (NVLS 8 x 40 / 48)."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl import old_tuners, tuning
from phantora.collectives.nccl.channels import ring_graph
from phantora.collectives.nccl.platform import Platform, platform_of
from phantora.collectives.nccl.published import machine, tables
from phantora.collectives.nccl.settings import settings_from_env

ALL = {t.name: t for t in tables(include_degraded=True, include_held_out=True)}
H100_2 = "h100_16gpu_2node_ndr400_all_reduce_nccltests309_baremetal"
H100_1 = "h100_8gpu_1node_all_reduce_azure_ndh100v5_nvls"
H100_4 = "h100_32gpu_4node_ndr400_all_reduce_nccltests309_vm"
A100_1 = "a100_8gpu_1node_all_reduce_azure_nda100v4"
A100_2 = "a100_16gpu_2node_hdr200_all_reduce_mscclppndmv4"
B200_2 = "b200_16gpu_2node_roce400_all_gather_dranetgke"
B200_2_AR = "b200_16gpu_2node_roce400_all_reduce_gkea4deepep"
B200_1 = "b200_8gpu_1node_all_reduce_gkea4deepep"
B200_4 = "b200_32gpu_4node_ib400_sendrecv_togetherp2p"
MiB = 1 << 20


def _platform(name: str) -> Platform:
    t = ALL[name]
    return platform_of(machine(t), tuple(range(t.gpus)))


def _pick(name: str, version: str, kind: str, nbytes: int) -> tuple[str, str]:
    choice = tuning.select(kind, _platform(name), settings_from_env({"PHANTORA_NCCL_VERSION": version}), nbytes)
    assert choice is not None
    return choice.algorithm, choice.protocol


def test_versions_read_as_the_tables_state_them():
    """A stated patch is kept (2.17.1, 2.26.2); the B200 pods' NCCL is the newest out when their README was
    published (2025-10-27: v2.28.7-1 of 2025-10-17; v2.28.9-1 came on 2025-11-10)."""
    assert ALL[A100_2].env["PHANTORA_NCCL_VERSION"] == "2.17.1"
    assert ALL[H100_4].env["PHANTORA_NCCL_VERSION"] == "2.26.2"
    assert ALL[B200_2_AR].env["PHANTORA_NCCL_VERSION"] == "2.28.7"
    assert old_tuners.release((2, 28)) == (2, 28, old_tuners.NEWEST_PATCH)
    assert old_tuners.release((2, 28, 7)) == (2, 28, 7)


@pytest.mark.parametrize(
    ("version", "lat"), [((2, 28, 3), 53.0), ((2, 28, 7), 53.0), ((2, 28, 9), None), ((2, 28), None), ((2, 30), None)]
)
def test_nvls_tree_network_hop_is_14_us_until_v2_28_7(version, lat):
    """2 H100 hosts: hwLat[NET][NVLS_TREE] is 14 µs in v2.28.3-1 and v2.28.7-1, 20.9 from v2.28.9-1, so NVLS-Tree
    costs 25 + 2 x 14 = 53 µs there (2.30's 25 + 2 x 20.9 = 66.8); its bandwidth is 2.30's: 8 x min(40 x 0.85 x 7/8
    x 2, 48 x 2, 57.7) x 16 / 30 = 246.19 GB/s."""
    p = _platform(H100_2)
    got = old_tuners.nvls_tree_rating(version, p, 8, 40.0, 48.0, 30)
    assert got == (None if lat is None else (lat, pytest.approx(8 * 57.7 * 16 / 30)))
    st = settings_from_env({"PHANTORA_NCCL_VERSION": ".".join(map(str, version))})
    cost = next(c for c in tuning.costs("all_reduce", p, st) if c.algorithm == "nvls_tree")
    assert cost.lat_us == pytest.approx(66.8) and cost.algbw == pytest.approx(246.18666)
    rated = tuning.rated(cost, "all_reduce", p, st)
    assert rated is not None and rated.lat_us == pytest.approx(66.8 if lat is None else lat)
    assert rated.algbw == pytest.approx(cost.algbw)


@pytest.mark.parametrize(("size", "v2_28_7", "v2_28_9"), [(1, "nvls_tree", "tree"), (2, "nvls_tree", "tree")])
def test_two_h100_hosts_pick_nvls_tree_from_1_mib_only_up_to_v2_28_7(size, v2_28_7, v2_28_9):
    """Tree LL128 costs 48.5 µs at 146.8 x 0.6 (the tree correction at 1-2 MiB) GB/s: 60.40 / 72.31 µs at 1 / 2 MiB;
    NVLS-Tree 53 + S / 246.19 = 57.26 / 61.52 µs by v2.28.7-1 and 66.8 + S / 246.19 = 71.06 / 75.32 from v2.28.9-1."""
    s = size * MiB
    tree = 48.5 + s / (1000 * 146.8 * 0.6)
    assert 53 + s / 246_186.67 < tree < 66.8 + s / 246_186.67
    assert _pick(H100_2, "2.28.7", "all_reduce", s)[0] == v2_28_7
    assert _pick(H100_2, "2.28.9", "all_reduce", s) == (v2_28_9, "LL128")
    assert _pick(H100_2, "2.28", "all_reduce", s) == (v2_28_9, "LL128")


@pytest.mark.parametrize(
    ("version", "lat", "cap"), [((2, 28, 7), 81.0, 43.1), ((2, 28, 9), 108.6, 43.8), ((2, 29, 7), 108.6, 43.8)]
)
def test_blackwell_nvls_tree_beyond_two_hosts_by_patch(version, lat, cap):
    """4 B200 hosts: NVLS-Tree's per-channel cap beyond two nodes is 43.1 (v2.28.3-1, v2.28.7-1), 43.8 (v2.28.9-1 to
    v2.29.7-1), 80 from v2.30.3-1 (2.30's: None); 8 x min(80 x 0.74 x 7/8 x 2, 48, cap) x 32 / 62 GB/s and
    25 + 2 x 2 x (14 or 20.9) µs."""
    p = _platform(B200_4)
    g = tuning.nvls_graph(p)
    assert (g.nchannels, g.bw_intra, g.bw_inter) == (8, 80.0, 48.0)
    got = old_tuners.nvls_tree_rating(version, p, 8, 80.0, 48.0, 62)
    assert got == (pytest.approx(lat), pytest.approx(8 * cap * 32 / 62))
    assert old_tuners.nvls_tree_rating((2, 30, 3), p, 8, 80.0, 48.0, 62) is None


@pytest.mark.parametrize(
    ("name", "version", "bus"),
    [
        (B200_2, (2, 26, 6), 0.92 * 384),  # 73.4 a channel: the graph's 0.92 binds
        (B200_2, (2, 28, 3), 0.92 * 384),
        (B200_2, (2, 28, 7), 8 * 34.6),  # two nodes 34.6 from v2.28.7-1
        (B200_2, (2, 29, 3), 8 * 34.6),
        (B200_2, (2, 29, 7), None),  # 40 from v2.29.7-1: 2.30's
        (B200_1, (2, 28, 9), 0.92 * 720),  # one node 73.4 until v2.29.2-1
        (B200_1, (2, 29, 2), 16 * 34.5),
        (B200_1, (2, 30), None),
    ],
)
def test_blackwell_ring_ll128_per_channel_cap_by_patch(name, version, bus):
    p = _platform(name)
    g = ring_graph(p)
    raw = g.nchannels * g.bw_intra
    assert raw == (384.0 if p.nnodes == 2 else 720.0)
    got = old_tuners.graph_bus_bw(version, "all_gather", "ring", "LL128", p, raw, g.nchannels, 0.0)
    assert got == (None if bus is None else pytest.approx(bus))


def test_b200_pods_all_gather_at_64_mib_runs_ll128_under_2_26_6():
    """2 B200 hosts, all-gather over 16 ranks: ring LL128 costs 14 + 14 x 1.9 + 4.0 = 44.6 µs and Simple 8.4 + 14 x
    3.4 + 14 = 70.0; Simple moves 384 x 16/15 = 409.6 GB/s and LL128 353.28 x 16/15 = 376.83 in 2.26.6 (73.4 a
    channel) but 320 x 16/15 = 341.33 in 2.30 (40 a channel): they cross at 114.1 MiB and 49.6 MiB, so 64 MiB runs
    LL128 under the pods' NCCL and Simple under 2.30."""

    def cross(ll128: float) -> float:
        return (70.0 - 44.6) / (1 / (1000 * ll128 * 16 / 15) - 1 / (1000 * 409.6)) / MiB

    assert 114.0 < cross(353.28) < 114.2 and 49.5 < cross(320.0) < 49.7
    assert _pick(B200_2, "2.26.6", "all_gather", 64 * MiB) == ("ring", "LL128")
    assert _pick(B200_2, "2.30", "all_gather", 64 * MiB) == ("ring", "Simple")


def test_blackwell_tree_caps_before_v2_28_3():
    """2 B200 hosts: perChMaxTreeBws[Blackwell][N2] 82.8 and perChMaxTreeLL128Bws 73.4 in v2.25.1-1 to v2.27.7-1
    (42.8 and 31.67 from v2.28.3-1): tree Simple min(0.92 x 384, 8 x 82.8) = 353.28 (2.30: 8 x 42.8 = 342.4), tree
    LL128 min(353.28 x 120/128, 8 x 73.4) = 331.2 (2.30: 8 x 31.67 = 253.36)."""
    p = _platform(B200_2)

    def tree(version: tuple[int, ...], proto: str) -> float | None:
        return old_tuners.graph_bus_bw(version, "all_reduce", "tree", proto, p, 384.0, 8, 0.0)

    assert tree((2, 26, 6), "Simple") == pytest.approx(353.28)
    assert tree((2, 26, 6), "LL128") == pytest.approx(331.2)
    assert tree((2, 28, 3), "Simple") is None
    st = settings_from_env({})
    ll128 = next(c for c in tuning.costs("all_reduce", p, st) if (c.algorithm, c.protocol) == ("tree", "LL128"))
    assert ll128.algbw == pytest.approx(8 * 31.67 * 0.5)


@pytest.mark.parametrize(
    ("version", "simple", "ll"),
    [
        ((2, 17, 1), 2 * 7 * 28.0, 4.4 + 2 * 7 * 0.52),  # v2.17: base 0 / 4.4, 28 and .52 µs a hop
        ((2, 18, 1), 2 * 7 * 28.0, None),
        ((2, 18, 3), 2 * 7 * 4.0, None),  # v2.18.3-1 to v2.18.6-1: 4 µs on NVLink, base 0
        ((2, 18, 5), 2 * 7 * 4.0, None),
        ((2, 18), 2 * 7 * 4.0, None),
        ((2, 19, 3), 2 * 7 * 28.0, None),
        ((2, 23, 4), None, None),  # 2.30's: 8.4 + 2 x 7 x 4
    ],
)
def test_tree_latency_on_one_a100_host_by_tag(version, simple, ll):
    p = _platform(A100_1)
    assert old_tuners.tree_lat_us(version, "all_reduce", 2, p) == (None if simple is None else pytest.approx(simple))
    assert old_tuners.tree_lat_us(version, "all_reduce", 0, p) == (None if ll is None else pytest.approx(ll))


def test_tree_ll_across_two_a100_hosts_in_v2_17():
    """v2.17.1-1 slows LL's intra-node hop x 1.8 across nodes: 4.4 + 2 x (7 x 0.52 x 1.8 + 1 x 5.0) = 27.504 µs."""
    assert old_tuners.tree_lat_us((2, 17, 1), "all_reduce", 0, _platform(A100_2)) == pytest.approx(27.504)


@pytest.mark.parametrize(
    ("version", "pi", "lat"),
    [
        ((2, 22, 3), 2, 8.4 + 26 * 3.4 + 4 * 14.0),  # all-reduce crosses the network 2 nNodes = 4 times
        ((2, 22, 3), 0, 6.6 + 26 * 1.0 + 4 * 2.7),  # LL's 0.6 floored at the 1 µs net overhead
        ((2, 17, 1), 2, 8.4 + 26 * 3.4 + 4 * 9.6),  # v2.17: the network's ring Simple 9.6, no floor
        ((2, 17, 1), 0, 3.6 + 26 * 0.47 * 1.8 + 4 * 2.7),
        ((2, 23, 4), 2, None),  # 2.30's: 8.4 + 28 x 3.4 + 2 x 14 = 131.6
    ],
)
def test_ring_all_reduce_latency_on_two_h100_hosts_before_v2_23_4(version, pi, lat):
    p = _platform(H100_2)
    got = old_tuners.ring_lat_us(version, "all_reduce", pi, p, 30, 1.0)
    assert got == (None if lat is None else pytest.approx(lat))


def test_ring_plateau_of_v2_17():
    """2 A100 hosts (16 ranks, sm80): from 16 / 16 x 64 KiB the ring Simple all-reduce latency is x 1.9 in v2.17.1-1
    (x 1.5 only from sm90); from v2.18.1-1 the model's rule (None)."""
    p = _platform(A100_2)
    assert old_tuners.ring_plateau((2, 17, 1), p, 65535) == 1.0
    assert old_tuners.ring_plateau((2, 17, 1), p, 65536) == 1.9
    assert old_tuners.ring_plateau((2, 18, 1), p, 65536) is None
    ring = tuning.Cost("ring", "Simple", 100.0, 100.0)
    t = tuning.model_time_us(ring, "all_reduce", p, 1 << 20, 8, (2, 17, 1))
    assert t == pytest.approx(190.0 + (1 << 20) / 100_000)


def test_hopper_ll_ceiling_and_ring_ll_before_v2_21_5():
    """1 H100 host: llMaxBws[Hopper][N1] is 87.7 before v2.21.5-1 (141 after), so ring LL all-reduce is
    min(87.7, 360 / 4) = 87.7 (the model's old ceiling gave 90), and from v2.21.5-1 min(141, 360 / 2): 2.30's."""
    p = _platform(H100_1)
    assert old_tuners.graph_bus_bw((2, 20, 5), "all_reduce", "ring", "LL", p, 360.0, 12, 141.0) == 87.7
    assert old_tuners.graph_bus_bw((2, 18, 5), "all_reduce", "ring", "LL", p, 360.0, 12, 141.0) == 87.7
    assert old_tuners.graph_bus_bw((2, 21, 5), "all_reduce", "ring", "LL", p, 360.0, 12, 141.0) is None


def test_one_host_nvls_before_v2_19():
    """1 H100 host, NVLS graph 8 x 40: v2.18.3-1+ rate it 8 x 40 x 5/6 = 266.67 GB/s at 23 µs (its base latency),
    v2.18.1-1 x 0.75 = 240; v2.17 at 40 µs on the ring graph (12 x 30 x 0.75 = 270, its bus capped at 370); 23 µs
    until v2.20.5-1, 25 (2.30's) from v2.21.5-1. All-gather: no NVLS in v2.18, x 5/6 in v2.19-2.22 (266.67),
    unconverted from 2.23 (320)."""
    p = _platform(H100_1)
    assert old_tuners.nvls_algbw((2, 18, 5), "all_reduce", p, 8, 40.0, 40.0) == pytest.approx(266.667, abs=1e-3)
    assert old_tuners.nvls_algbw((2, 18, 1), "all_reduce", p, 8, 40.0, 40.0) == pytest.approx(240.0)
    assert [old_tuners.nvls_lat_us(v, p) for v in ((2, 17, 1), (2, 18, 5), (2, 20, 5), (2, 21, 5))] == [
        40.0,
        23.0,
        23.0,
        None,
    ]
    st = settings_from_env({"PHANTORA_NCCL_VERSION": "2.17.1"})
    nvls = next(c for c in tuning.costs("all_reduce", p, st) if c.algorithm == "nvls")
    rated = tuning.rated(nvls, "all_reduce", p, st)
    assert rated is not None and (rated.lat_us, rated.algbw) == (40.0, pytest.approx(270.0))
    # v2.17's 370 GB/s Hopper bus cap binds a faster graph: 16 x 30 = 480 -> 370 x 0.75 = 277.5
    assert old_tuners.nvls_algbw((2, 17, 1), "all_reduce", p, 16, 30.0, 30.0) == pytest.approx(277.5)
    assert not old_tuners.available((2, 18, 5), "nvls", "all_gather")
    assert old_tuners.available((2, 17, 1), "nvls", "all_gather")
    assert old_tuners.available((2, 19), "nvls", "all_gather")
    assert old_tuners.nvls_algbw((2, 22, 3), "all_gather", p, 8, 40.0, 40.0) == pytest.approx(266.667, abs=1e-3)
    assert old_tuners.nvls_algbw((2, 23, 4), "all_gather", p, 8, 40.0, 40.0) == pytest.approx(320.0)


def test_nvls_tree_of_v2_18():
    """4 H100 hosts: v2.18 rates NVLS-Tree at 23 + 2 (4 - 1) x 19 = 137 µs and 8 x 48 x 0.7 x 4 / (2 x 3) = 179.2
    GB/s (bwInter beyond two nodes)."""
    assert old_tuners.nvls_tree_rating((2, 18, 5), _platform(H100_4), 8, 40.0, 48.0) == (137.0, pytest.approx(179.2))
