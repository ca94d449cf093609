"""The hosts' CPU as NCCL classes it (topo.cc `kvDictCpuArch` / `kvDictCpuVendor`): arm (NVIDIA Grace, GB200), x86
AMD or x86 Intel, and what NCCL does differently on arm, against its source (v2.29.2-1 to v2.30.7-1): the net p2p
chunk doubled on arm hosts of Blackwell GPUs (init.cc `computeBuffSizes`), no tree correction of NVLS-Tree there
(tuning.cc `ncclTopoGetAlgoTime`: cpuArch X86 only), and Intel's figures for the rest (`getNetOverhead` 1 µs,
llMaxBws row 0)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose, platform_of
from phantora.collectives.nccl.chunking import comm_p2p_chunk, p2p_chunk_bytes
from phantora.collectives.nccl.settings import nccl_env, settings_of
from phantora.collectives.nccl.tuning import Cost, _ll_max, net_overhead_us, nvls_tree_corrected
from phantora.errors import InputError
from phantora.topology import dgx_host, rail_optimized

KiB, MiB = 1 << 10, 1 << 20


def gb200_hosts(nodes: int = 2, cpu: str | None = "arm", gpu: str = "b200"):
    """Hosts of 4 Blackwell GPUs on an NVSwitch, a 400G NIC each on its rail (a GB200 tray's shape)."""
    return rail_optimized(nodes, 4, spines=4, gpu=gpu, cpu=cpu)


def st_of(version: str, **env: str):
    return settings_of((("PHANTORA_NCCL_VERSION", version), *env.items()))


@pytest.mark.parametrize(
    ("text", "vendor"),
    [
        ("arm (NVIDIA Grace)", "arm"),  # the GB200 NVL72 table's cpu=
        ("arm", "arm"),
        ("NVIDIA Grace CPU", "arm"),
        ("aarch64", "arm"),
        ("2x AMD EPYC 7742 (DGX A100 system spec)", "amd"),
        ("AuthenticAMD", "amd"),
        ("Intel Xeon Platinum 8570", "intel"),
        ("x86_64", "intel"),
    ],
)
def test_the_hosts_cpu_is_classed_as_nccl_does(text: str, vendor: str) -> None:
    topo = dgx_host(8, gpu="b200")
    topo.meta["cpu"] = text
    assert platform_of(topo, tuple(range(8))).cpu == vendor


def test_no_cpu_is_intel_and_a_cpu_model_alone_names_its_vendor() -> None:
    assert platform_of(dgx_host(8), tuple(range(8))).cpu == "intel"
    assert platform_of(dgx_host(8, cpu_model="arm"), tuple(range(8))).cpu == "arm"
    assert platform_of(dgx_host(8, cpu_model="zen"), tuple(range(8))).cpu == "amd"


def test_a_cpu_that_names_no_vendor_is_a_one_line_error_naming_the_field() -> None:
    topo = dgx_host(8)
    topo.meta["cpu"] = "sparc64"
    with pytest.raises(InputError) as err:
        platform_of(topo, tuple(range(8)))
    assert err.value.field == "cpu" and "sparc64" in str(err.value) and "\n" not in str(err.value)
    topo.meta["cpu"] = "arm"
    topo.meta["cpu_model"] = "spr"  # an Intel model on arm hosts
    with pytest.raises(InputError) as err:
        platform_of(topo, tuple(range(8)))
    assert err.value.field == "cpu_model" and "\n" not in str(err.value)
    topo.meta["cpu_model"] = "m1"
    with pytest.raises(InputError, match="expected one of"):
        platform_of(topo, tuple(range(8)))


def test_the_net_p2p_chunk_doubles_on_gbx_hosts_from_nccl_2_29() -> None:
    """init.cc: p2pChunkSize = ratio x NCCL_P2P_NET_CHUNKSIZE, ratio 2 when cpuArch is ARM and minCompCap >= 100
    (from v2.29.2-1), then at most the Simple buffer over NCCL_STEPS (4 MiB / 8)."""
    ranks = tuple(range(8))
    cases = [
        (gb200_hosts(), "2.29", {}, 256 * KiB),
        (gb200_hosts(), "2.30", {}, 256 * KiB),
        (gb200_hosts(), "2.28", {}, 128 * KiB),  # before 2.29: the default
        (gb200_hosts(cpu=None), "2.29", {}, 128 * KiB),  # x86 Blackwell hosts (DGX B200)
        (gb200_hosts(gpu="h100"), "2.29", {}, 128 * KiB),  # arm Hopper hosts (GH200): minCompCap 90
        (gb200_hosts(), "2.29", {"NCCL_P2P_NET_CHUNKSIZE": "65536"}, 128 * KiB),  # the user's chunk, doubled too
        (gb200_hosts(), "2.29", {"NCCL_P2P_NET_CHUNKSIZE": "524288"}, 512 * KiB),  # 1 MiB, capped at 4 MiB / 8
    ]
    for topo, version, env, chunk in cases:
        st = st_of(version, **env)
        assert comm_p2p_chunk(platform_of(topo, ranks, st), st) == chunk, (version, env)
    one_node = dgx_host(72, gpu="b200", cpu="arm")  # an NVL72 domain: NCCL_P2P_NVL_CHUNKSIZE, never doubled
    st = st_of("2.29")
    assert comm_p2p_chunk(platform_of(one_node, tuple(range(72)), st), st) == 512 * KiB


def test_a_gbx_send_recv_moves_the_doubled_steps_and_stripes_by_them() -> None:
    """addP2pToPlan: a transfer to another node starts on nChannelsMin channels of at least half a step each and
    doubles them (up to nChannelsMax, 4 for a 400G NIC) while a part exceeds one step. 512 KiB between two hosts of
    4: from 2 channels (16 p2p channels / 8 ranks), parts of 256 KiB: one GB200 step (kept at 2), two x86 steps of
    128 KiB (doubled to 4). The steps are the chunk, halved below 8 steps and quartered below one."""
    env = AlgoOptions(nccl_env=nccl_env({}))
    arm = choose(Collective("send_recv", (0, 4), 512 * KiB), gb200_hosts(), env)
    x86 = choose(Collective("send_recv", (0, 4), 512 * KiB), gb200_hosts(cpu=None), env)
    assert arm is not None and x86 is not None and arm.algorithm == x86.algorithm == "p2p"
    assert (arm.channels, x86.channels) == (2, 4)
    st = st_of("2.30")
    p = platform_of(gb200_hosts(), tuple(range(8)), st)
    assert p2p_chunk_bytes("Simple", p, st, 64 * MiB, network=True) == 256 * KiB
    assert p2p_chunk_bytes("Simple", p, st, 1 * MiB, network=True) == 128 * KiB  # < 8 steps: half
    assert p2p_chunk_bytes("Simple", p, st, 128 * KiB, network=True) == 64 * KiB  # < 1 step: a quarter


def test_arm_hosts_take_intels_net_overhead_and_ll_ceiling() -> None:
    """getNetOverhead: 2 µs on x86 AMD, 1 on anything else; llMaxBws across nodes: row 1 for AMD (or mixed)
    hosts, row 0 (Intel's: 39.0 on two nodes, 20.4 on more) for every other."""
    st = st_of("2.30")
    for nodes, ceiling in ((2, 39.0), (4, 20.4)):
        p = platform_of(gb200_hosts(nodes), tuple(range(4 * nodes)), st)
        assert p.cpu == "arm"
        assert net_overhead_us(p, st) == 1.0
        assert _ll_max(p) == ceiling


def test_no_nvls_tree_correction_on_arm_hosts() -> None:
    """tuning.cc (v2.29.2-1 on): the tree correction of NVLS-Tree all-reduce is applied when minCompCap >= 100
    and cpuArch is X86; GB200's Grace hosts are ARM."""
    cost = Cost("nvls_tree", "Simple", 10.0, 100.0)
    ranks = tuple(range(8))
    arm = platform_of(gb200_hosts(), ranks)
    x86 = platform_of(gb200_hosts(cpu="intel"), ranks)
    assert nvls_tree_corrected(cost, "all_reduce", x86, (2, 29))
    assert not nvls_tree_corrected(cost, "all_reduce", arm, (2, 29))
