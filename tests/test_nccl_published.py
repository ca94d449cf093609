"""The NCCL model against published nccl-tests tables (tests/data/nccl_tests/, SOURCES.md): the claims of
docs/validation.md that hold, checked size by size, so a change that breaks them fails here."""

from __future__ import annotations

import pytest
from script_modules import load

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import platform_of
from phantora.collectives.nccl.net_channel import coll_net_channel_bw
from phantora.collectives.nccl.published import (
    ITERS,
    SETUP_POINTS,
    Table,
    iterations,
    machine,
    not_compared,
    tables,
)
from phantora.collectives.nccl.settings import nccl_env
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.report.host_launch import host_ns_per_call
from phantora.report.nccl_tests import launch_bound

MiB = 1 << 20
BY_NAME = {t.name: t for t in tables()}
nccl_bench = load("bench/bench_nccl_tests.py")


def busbw(table: Table, size: int) -> float:
    topo = machine(table)
    env = table.env
    coll = Collective(table.kind, tuple(range(table.gpus)), size, "fp32")
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(env)))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return size / max(c.end_ns for c in sim.drain()) * coll.busbw_factor()


def loop_busbw(table: Table, size: int) -> float:
    """busbw as nccl-tests' timed loop of the table's -n calls sees it: one host thread launching its -g GPUs'
    calls."""
    n = table.gpus
    factor = 2 * (n - 1) / n if table.kind == "all_reduce" else (n - 1) / n
    gpu_ns = size / busbw(table, size) * factor
    coll = Collective(table.kind, tuple(range(table.gpus)), size, "fp32")
    choice = decompose(coll, machine(table), AlgoOptions(nccl_env=nccl_env(table.env))).choice
    loop = launch_bound(
        [round(gpu_ns)] * table.iters, host_ns_per_call(table.kind, choice, table.gpus, table.gpus_per_thread)
    )
    return size / (sum(loop) / len(loop)) * factor


def test_the_data_and_its_sources_are_there():
    assert len(tables(include_degraded=True)) >= 14
    sources = (tables()[0].path.parent / "SOURCES.md").read_text()
    for t in tables(include_degraded=True):
        assert t.path.name in sources, t.path.name
        assert t.rows and all(size > 0 and bw >= 0 for size, bw in t.rows)


def test_the_efa_table_is_kept_but_not_compared():
    """AWS p5 over EFA is outside the validation's 400G InfiniBand/RoCE (docs/validation.md, "AWS p5 over EFA"):
    its data stays, listed with the reason, and no comparison counts it."""
    name = "h100_16gpu_2node_efa_all_reduce_awsp5keitaw"
    assert name in {t.name for t in tables(include_degraded=True)}
    assert name not in {t.name for t in tables()}
    assert "EFA" in dict(not_compared())[name]


def _inversions(table: Table, drop: float) -> list[int]:
    """The compared sizes (1 MiB on) from which the published time falls by more than `drop` at twice the size,
    pairs touching a first-use point aside (`SETUP_POINTS`). Time is size / busbw up to the test's constant factor."""
    skip = SETUP_POINTS.get(table.name, {})
    rows = sorted((s, bw) for s, bw in table.rows if s >= MiB and bw > 0)
    return [
        a
        for (a, bw_a), (b, bw_b) in zip(rows, rows[1:], strict=False)
        if b == 2 * a and a not in skip and b not in skip and (b / bw_b) < (1 - drop) * (a / bw_a)
    ]


def test_the_unstable_dranet_all_gather_is_kept_but_not_compared():
    """The DraNet pods' all-gather (two A4 hosts, NCCL 2.26.6) is faster at 4 MiB than at 2 and at 32 MiB than at
    16, by more than the comparison's 15% (933.6 against 1753.7 us, 1240.7 against 1479.0: -47%, -16%); no compared
    table falls that much as the size doubles outside a first use (the most, -13.8%: Together's NVLS-enabled
    all-gather from 2 to 4 MiB). So it is listed with that reason and no comparison counts it (docs/validation.md,
    "Held-out tables")."""
    everything = {t.name: t for t in tables(include_degraded=True, include_held_out=True)}
    name = "b200_16gpu_2node_roce400_all_gather_dranetgke"
    assert _inversions(everything[name], 0.15) == [2 * MiB, 16 * MiB]
    assert name not in {t.name for t in tables(include_held_out=True)}
    assert "unstable" in dict(not_compared())[name]
    for t in tables(include_held_out=True):
        assert _inversions(t, 0.15) == [], t.name


TWO_HOSTS = (
    "h100_16gpu_2node_ndr400_all_reduce_nccltests309_baremetal",
    "h100_16gpu_2node_ib400_all_reduce_nccltests309_gjaion_default",
)


@pytest.mark.parametrize("name", TWO_HOSTS)
def test_two_h100_hosts_within_10_percent_from_64_mib(name):
    """Two independent two-host H100 clusters (8 x 400G): NVLS-Tree with its pipeline fill, every size from 64 MiB
    within 10% of the published bus bandwidth."""
    table = BY_NAME[name]
    for size, published in table.rows:
        if size >= 64 * MiB:
            assert busbw(table, size) == pytest.approx(published, rel=0.10), size


@pytest.mark.parametrize("name", TWO_HOSTS)
def test_two_h100_hosts_nvls_tree_below_64_mib_within_15_percent(name):
    """The same two clusters where NCCL runs NVLS-Tree below 64 MiB (4-32 MiB): within 15%, the one-chunk sizes
    (4 and 8 MiB) included (nvls_tree.py)."""
    table = BY_NAME[name]
    for size, published in table.rows:
        if 4 * MiB <= size < 64 * MiB:
            assert busbw(table, size) == pytest.approx(published, rel=0.15), size


@pytest.mark.parametrize(
    "name", ["h100_8gpu_1node_all_reduce_azure_ndh100v5_nvls", "h200_8gpu_1node_all_reduce_azure_ndh200v5_nvls"]
)
def test_one_h100_or_h200_host_with_nvls_within_10_percent_from_64_mib(name):
    table = BY_NAME[name]
    for size, published in table.rows:
        if size >= 64 * MiB:
            assert busbw(table, size) == pytest.approx(published, rel=0.10), size


def test_a100_ring_from_256_mib():
    """One A100 host (ring): within 10% from 256 MiB; below it the model is known fast (docs/validation.md)."""
    table = BY_NAME["a100_8gpu_1node_all_reduce_azure_nda100v4"]
    for size, published in table.rows:
        if size >= 256 * MiB:
            assert busbw(table, size) == pytest.approx(published, rel=0.10), size


ONE_HOST_EVERY_SIZE = (
    "h100_8gpu_1node_ringalgo_all_gather_togethernccltests",
    "h100_8gpu_1node_ringalgo_reduce_scatter_togethernccltests",
    "h100_8gpu_1node_nvlsenabled_reduce_scatter_togethernccltests",
    "h100_8gpu_1node_all_gather_xxrjuncluster01",
    "h100_8gpu_1node_reduce_scatter_xxrjuncluster01",
    "h100_8gpu_1node_all_reduce_azure_ndh100v5_nvls",
)


@pytest.mark.parametrize("name", ONE_HOST_EVERY_SIZE)
def test_one_h100_host_every_size_within_15_and_from_64_mib_within_10_percent(name):
    """All-gather, reduce-scatter (ring, two clusters, NCCL 2.26 and 2.29) and NVLS all-reduce on one H100 host:
    every published size from 1 MiB within 15%, from 64 MiB within 10%, timed as nccl-tests' loop (the -g 8 runs
    are bound by their host launches at 1-4 MiB)."""
    table = BY_NAME[name]
    for size, published in table.rows:
        if size >= MiB:
            rel = 0.10 if size >= 64 * MiB else 0.15
            assert loop_busbw(table, size) == pytest.approx(published, rel=rel), size


FORCED_NVLS = (
    "h100_2gpu_1node_slice2of8_nvlsalgo_all_reduce_waynehacking8scaling",
    "h100_4gpu_1node_slice4of8_nvlsalgo_all_reduce_waynehacking8scaling",
    "h100_6gpu_1node_slice6of8_nvlsalgo_all_reduce_waynehacking8scaling",
)


@pytest.mark.parametrize("name", FORCED_NVLS)
def test_forced_nvls_on_2_4_6_gpus_runs_at_the_kernels_rate(name):
    """NCCL_ALGO=NVLS on 2, 4 and 6 GPUs of one H100 host (256 MiB-8 GiB): within 10% at every size, where NCCL's
    tuner rating of NVLS on so few GPUs was 19-51% low (nvls_kernel.py)."""
    table = BY_NAME[name]
    for size, published in table.rows:
        assert loop_busbw(table, size) == pytest.approx(published, rel=0.10), size


def test_two_dgx_a100_all_to_all_runs_on_two_channels_a_gpu_across_nodes():
    """ALCF's two DGX A100 (AMD EPYC hosts: NCCL's net overhead 2 µs, one proxy op per channel part and direction)
    and Azure's NDmv4 pair: a GPU's 8 remote peers share the remote rounds' 2 channels at 14 x 1.41/1.98 GB/s each
    (p2p.py): 2-8 MiB within 15%, from 16 MiB within 10% (was +15..24% at the NICs' line rate). 1 MiB is not: it
    is +18.6% (NCCL quarters the 128 KiB network step below one step a peer, and the model has no cost per step)."""
    alcf = BY_NAME["a100_16gpu_2node_hdr200assumed_alltoall_alcfsophia"]
    assert "AMD" in alcf.cpu
    for size, published in alcf.rows:
        if size >= 2 * MiB:
            goal = 0.15 if size <= 8 * MiB else 0.10
            assert loop_busbw(alcf, size) == pytest.approx(published, rel=goal), size
    ndmv4 = BY_NAME["a100_16gpu_2node_hdr200_alltoall_mscclppndmv4"]
    assert [size for size, _ in ndmv4.rows] == [1 << 30, 4 << 30]
    for size, published in ndmv4.rows:
        assert loop_busbw(ndmv4, size) == pytest.approx(published, rel=0.10), size


A100_LARGE = (
    "a100_8gpu_1node_all_gather_mscclppndmv4",
    "a100_8gpu_1node_all_reduce_mscclppndmv4",
    "a100_8gpu_1node_alltoall_mscclppndmv4",
    "a100_16gpu_2node_hdr200_all_gather_mscclppndmv4",
    "a100_16gpu_2node_hdr200_all_reduce_mscclppndmv4",
    "a100_8gpu_1node_all_reduce_ocinccl2265",
    "a100_16gpu_2node_roce200_all_reduce_ocinccl2265",
)


@pytest.mark.parametrize("name", A100_LARGE)
def test_a100_large_sizes_within_10_percent(name):
    """A100 at 1-10 GiB, two machines: Azure ND A100 v4 (NCCL 2.17.1, microsoft/mscclpp's points) one host's
    all-gather, all-reduce and all-to-all at 1 GiB, two hosts' (8 x 200G HDR) all-gather and all-reduce at 1 and
    4 GiB; Oracle BM.GPU4.8 (NCCL 2.26.5) all-reduce at 10 GiB on one host and two (8 x 200G RoCE). Within 10%.
    (The two hosts' all-to-all is 23% fast, as ALCF's pair is: docs/validation.md.)"""
    table = BY_NAME[name]
    assert table.rows
    for size, published in table.rows:
        assert loop_busbw(table, size) == pytest.approx(published, rel=0.10), size


ONE_HOST_RING_SIMPLE = (
    "h100_2gpu_1node_slice2of8_default_all_reduce_waynehacking8scaling",
    "h100_2gpu_1node_slice2of8_ringalgo_all_reduce_waynehacking8scaling",
    "h100_4gpu_1node_slice4of8_all_gather_waynehacking8quiet",
    "h100_4gpu_1node_slice4of8_reduce_scatter_waynehacking8quiet",
)


@pytest.mark.parametrize("name", ONE_HOST_RING_SIMPLE)
def test_one_host_ring_with_its_fill_and_passes_within_10_percent_from_64_mib(name):
    """The Simple ring on 2 and 4 GPUs of one H100 host (ring_kernel.py: NVLink rate, one slice of fill, 9 µs a
    pass): within 10% at every size from 64 MiB, where NCCL's model alone was +12..22% at 64-512 MiB."""
    table = BY_NAME[name]
    for size, published in table.rows:
        if size >= 64 * MiB:
            assert loop_busbw(table, size) == pytest.approx(published, rel=0.10), size


def test_the_timed_iterations_are_read_from_nccl_tests_flags_not_mpiruns() -> None:
    """nccl-tests' -n / --iters (and "iters N") is the timed loop's length; mpirun's -n / -np before the binary is a
    process count; none stated, or two different counts, is nccl-tests' default of 20 (src/common.cu)."""
    assert ITERS == 20
    assert (
        iterations("mpirun -n 8 ./build/all_reduce_perf -b 10G -e 10G -g 1 (one rank per GPU, warmup 5, iters 20)")
        == 20
    )
    assert iterations("mpirun -n 16 ./build/all_reduce_perf -b 8 -e 8G") == ITERS
    assert iterations("mpirun -np 16 -N 8 all_reduce_perf -b 8 -e 16G -f 2 -g 1 -c 1 -n 100; NCCL_BUFFSIZE=1") == 100
    assert iterations("mpirun -map-by ppr:8:node, nccl-tests -g 1 -c 1 -w 10 -n 10") == 10
    assert iterations("srun 1 GPU per rank, -b 32M -e 64G (reduced by memory) -f 2 -w 5 -n 20, --datatype double") == 20
    assert iterations("alltoall_perf --iters 7 --warmup_iters 5 -f 2") == 7
    assert iterations("float sum, iters 2; source=x") == 2
    assert iterations("./all_reduce_perf -b 1G -e 8G -f 2 -g 2") == ITERS
    assert iterations("all_reduce_perf -n 40; iters 30") == ITERS  # two counts: not read
    by_name = {t.name: t.iters for t in tables(include_degraded=True)}
    assert by_name["a100_8gpu_1node_all_reduce_ocinccl2265"] == 20  # mpirun -n 8 ... iters 20
    assert by_name["h200_8gpu_1node_all_reduce_azure_ndh200v5_nvls"] == 40  # all_reduce_perf ... -n 40


HELD_OUT = {t.name: t for t in tables(include_held_out=True) if t.held_out}


def test_held_out_tables_are_cited_and_kept_from_the_fitting_benches() -> None:
    """The held-out tables (B200, GB200 NVL72; `held_out=yes`) are cited in SOURCES.md, and `tables()` leaves them
    out unless asked, so no bench that fits the model reads them."""
    sources = (tables()[0].path.parent / "SOURCES.md").read_text()
    assert len(HELD_OUT) >= 5  # the sixth, DraNet's all-gather, is kept but not compared (unstable)
    for name, t in HELD_OUT.items():
        assert t.path.name in sources, name
        assert name not in BY_NAME
        assert t.rows and all(size > 0 and bw > 0 for size, bw in t.rows)


@pytest.mark.parametrize("name", sorted(n for n in HELD_OUT if "sendrecv_togetherp2p" in n))
def test_b200_sendrecv_ring_across_hosts_within_16_percent(name: str) -> None:
    """sendrecv_perf's ring over 2 and 4 B200 hosts (8 x 400G): the sends that leave a host cross from GPU 7 to
    GPU 0, another rail; NCCL relays them (PXN) through GPU 0 of the sender's host, so they run at one NIC's rate.
    Every size within 16% of the published bus bandwidth (it was 41-71% low before the relay was modelled; the
    model is 11-15% fast from 64 MiB, where NCCL reaches 86-89% of the line rate; the same cluster's 16 GiB cells,
    `togetheruse3a`, are +17%: docs/validation.md)."""
    table = HELD_OUT[name]
    for size, published in table.rows:
        assert nccl_bench.simulate(table, size)[0] == pytest.approx(published, rel=0.16), size


USE3A_TWO_HOST_RINGS = (
    "b200_16gpu_2node_ib400_ringalgo_all_reduce_togetheruse3a",
    "b200_16gpu_2node_ib400_ringalgo_all_gather_togetheruse3a",
)


@pytest.mark.parametrize("name", USE3A_TWO_HOST_RINGS)
def test_b200_ring_across_two_hosts_runs_at_sixteen_channel_rates(name: str) -> None:
    """NCCL_ALGO=Ring over two B200 hosts (8 x 400G) of Together's use3a-ss cluster, the held-out sendrecv tables'
    cluster at the same NCCL 2.29.7 and default IB settings, 16 GiB: 16 ring channels, two a NIC, each moving the
    per-channel network rate fitted on #309's H100 clusters (never on these), so busbw = 16 x 21.5 = 344 GB/s at
    B200's SM clock, 86% of the 400 GB/s the NICs allow; published 344.7 (all-reduce) and 342.9 (all-gather)."""
    table = HELD_OUT[name]
    ((size, published),) = table.rows
    bus, choice = nccl_bench.simulate(table, size)
    closed = 16 * coll_net_channel_bw("ring", "Simple", platform_of(machine(table), tuple(range(table.gpus))), 16)
    assert (choice["algorithm"], choice["channels"]) == ("Ring", 16)
    assert closed == pytest.approx(344.0)
    assert bus == pytest.approx(closed, rel=0.01)
    assert bus == pytest.approx(published, rel=0.02)


def test_a_what_if_environment_overrides_the_tables_own() -> None:
    """`--env NCCL_X=V`: the table as if taken with it too. Forcing Ring on the one-host B200 table (whose NCCL picks
    NVLS from 16 MiB) makes the model choose Ring; a name phantora does not honour is refused, naming the flag."""
    table = next(t for t in tables(include_held_out=True) if t.name == "b200_8gpu_1node_all_reduce_gkea4deepep")
    size = 64 << 20
    assert nccl_bench.simulate(table, size)[1]["algorithm"] == "NVLS"
    forced = nccl_bench.with_env(table, ["NCCL_ALGO=Ring", "NCCL_NVLS_CHUNKSIZE=65536"])
    assert forced.env["NCCL_ALGO"] == "Ring" and forced.env["NCCL_NVLS_CHUNKSIZE"] == "65536"  # its own overridden
    assert forced.env["NCCL_P2P_NET_CHUNKSIZE"] == table.env["NCCL_P2P_NET_CHUNKSIZE"]  # the rest kept
    assert nccl_bench.simulate(forced, size)[1]["algorithm"] == "Ring"
    with pytest.raises(InputError, match="--env.*NCCL_FOO"):
        nccl_bench.with_env(table, ["NCCL_FOO=1"])
