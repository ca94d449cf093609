"""Calls of count 0 that NCCL launches (phantora/collectives/nccl/empty_kernel.py): a send/recv of 0 bytes is an
empty step (Simple: the p2p message's latency; LL: the launch alone), a collective before 2.20 a kernel that runs no
step. Against the model's own latency constants in closed form, and ALCF's published alltoall_perf rows of count 0
(tests/data/nccl_small/empty_p2p_calls.csv, held out: nothing was fitted to them)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.empty_kernel import empty_latency_us, launches_empty
from phantora.collectives.nccl.published import data_dir, machine, read_table
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.nccl.tuning import Choice
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.report import nccl_tests as nt
from phantora.report.host_launch import host_launch_us
from phantora.topology import dgx_host

ROWS = Path(__file__).parent / "data" / "nccl_small" / "empty_p2p_calls.csv"
LL, SIMPLE = T.PROTOCOLS.index("LL"), T.PROTOCOLS.index("Simple")


def _alcf() -> tuple[object, AlgoOptions]:
    """ALCF Sophia's two DGX A100 (AMD EPYC 7742), NCCL 2.22.3, as the compared alltoall table builds them."""
    table = read_table(data_dir() / "a100_16gpu_2node_hdr200assumed_alltoall_alcfsophia.csv")
    return machine(table), AlgoOptions(nccl_env=nccl_env(table.env))


def test_which_empty_calls_nccl_launches() -> None:
    """enqueue.cc: a p2p task of 0 bytes always; a collective of count 0 before 2.20; ncclAlltoAll (2.28+) is a
    collective."""
    assert launches_empty("send_recv", (2, 30)) and launches_empty("all_to_all", (2, 30))
    assert launches_empty("all_to_all", (2, 27), alltoall_api=True)
    assert not launches_empty("all_to_all", (2, 28), alltoall_api=True)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        assert launches_empty(kind, (2, 19)) and not launches_empty(kind, (2, 20))


def test_the_kernel_of_an_empty_call() -> None:
    """Simple p2p: the whole p2p latency (the receiver waits for the empty step); LL p2p and a collective: the base
    latency of the algorithm and protocol (no line, no loop iteration)."""
    assert empty_latency_us(Choice("p2p", "Simple", 1, 54.4, 0.0, 54.4)) == 54.4
    assert empty_latency_us(Choice("p2p", "LL", 1, 7.2, 0.0, 7.2)) == T.BASE_LAT["ring"][LL]
    assert empty_latency_us(Choice("tree", "LL128", 1, 20.0, 0.0, 20.0)) == T.BASE_LAT["tree"][1]
    with pytest.raises(ValueError, match="base latency"):
        empty_latency_us(Choice("sym", "LL", 1, 5.0, 0.0, 5.0))


def _empty(coll: Collective, topo: object, opts: AlgoOptions) -> tuple[set[int], set[int]]:
    dag = decompose(coll, topo, opts)  # type: ignore[arg-type]
    assert dag.flows and {f.size for f in dag.flows} == {0} and {f.rate_bps for f in dag.flows} == {0}
    assert all(dag.rank_last[r] for r in coll.ranks)  # every rank waits for its kernel
    return {f.delay_ns for f in dag.flows if not f.deps}, {f.delay_ns for f in dag.flows if f.deps}


def test_a_zero_byte_sendrecv_inside_a_host_is_an_ll_launch() -> None:
    """Two GPUs of one H100 host: NCCL takes LL for 0 bytes and stores no line, so the kernel is the launch, the
    ring's LL base latency (6.6 µs), no NVLink step; forced to Simple it waits for the empty step: base + one
    NVLink step of Simple (8.4 + 3.4 µs)."""
    topo = dgx_host(8)
    coll = Collective("send_recv", (0, 1), 0, "fp32")
    assert _empty(coll, topo, AlgoOptions()) == ({round(T.BASE_LAT["ring"][LL] * 1000)}, set())
    simple = (T.BASE_LAT["ring"][SIMPLE] + T.HW_LAT["nvlink"]["ring"][SIMPLE]) * 1000
    assert _empty(coll, topo, AlgoOptions(protocol="Simple")) == ({round(simple)}, set())


def test_a_zero_byte_sendrecv_across_hosts_is_the_p2p_message() -> None:
    """GPU 0 to GPU 8 of ALCF's two DGX A100: Simple (no LL buffers on the network's p2p connections), one channel,
    one proxy op each way (2 us each on AMD hosts): the launch, a network step and the ops, 8.4 + 14.0 + 2 x 2."""
    topo, opts = _alcf()
    want = T.BASE_LAT["ring"][SIMPLE] + T.HW_LAT["net"]["ring"][SIMPLE] + 2 * T.NET_OVERHEAD_US["amd"]
    assert _empty(Collective("send_recv", (0, 8), 0, "fp32"), topo, opts)[0] == {round(want * 1000)}


def test_an_empty_collective_before_2_20_is_its_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL 2.19: a task and a kernel whose loop runs no step: one flow from each rank to itself after its choice's
    base latency; from 2.20 nothing at all."""
    topo = dgx_host(8)
    coll = Collective("all_gather", tuple(range(8)), 0, "fp32")
    old = AlgoOptions(nccl_env=(("PHANTORA_NCCL_VERSION", "2.19"),))
    dag = decompose(coll, topo, old)
    choice = dag.choice or {}
    base = T.BASE_LAT[choice["algorithm"].lower()][T.PROTOCOLS.index(choice["protocol"])]
    assert [(f.src, f.dst, f.size, f.delay_ns) for f in dag.flows] == [(e, e, 0, round(base * 1000))
                                                                       for e in topo.endpoints[:8]]  # fmt: skip
    assert decompose(coll, topo, AlgoOptions(nccl_env=(("PHANTORA_NCCL_VERSION", "2.20"),))).flows == []


def _rows(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[tuple[float, float]]:
    assert main(argv) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#")]
    return [(float(r[5]), float(r[9])) for r in rows if r[0] == "0"]


def test_sendrecv_perf_of_0_bytes_is_the_launch_behind_the_host(capsys: pytest.CaptureFixture[str]) -> None:
    """sendrecv_perf -b 0 on 8 GPUs, a process each: every iteration is the 6.6 µs LL launch, the first one after
    the host's launch of one channel (launch_bound): (host + 20 x 6.6) / 20."""
    host = round(host_launch_us(1) * 1000)
    want = round((host + 20 * round(T.BASE_LAT["ring"][LL] * 1000)) / 20 / 1e3, 2)
    rows = _rows(["nccl-tests", "sendrecv_perf", "-b", "0", "-e", "0", "-g", "1", "--np", "8", "-w", "1"], capsys)
    assert rows == [(want, want)]


@pytest.mark.parametrize(("test", "version", "launched"), [("gather_perf", "2.27", True),
                                                           ("gather_perf", "2.28", False),
                                                           ("hypercube_perf", "2.30", True)])  # fmt: skip
def test_nccl_tests_groups_of_0_bytes_launch_until_the_collective_api(
    test: str, version: str, launched: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gather_perf runs a group of sends and receives before ncclGather (2.28), which NCCL launches (the LL launch
    and more), then the collective, discarded (the empty call's 0.12 µs under -g 1); hypercube_perf always sends."""
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", version)
    rows = _rows(["nccl-tests", test, "-b", "8", "-e", "8", "-g", "1", "--np", "8", "-w", "1"], capsys)
    assert len(rows) == 1
    assert (rows[0][0] > T.BASE_LAT["ring"][LL]) if launched else rows[0] == (0.12, 0.12)


def _published() -> list[float]:
    with ROWS.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [float(r[c]) for r in rows for c in ("time_us_out", "time_us_in")]


@pytest.mark.parametrize("network", ["flow", "ns3"])
def test_alltoall_of_count_0_across_two_dgx_a100_against_alcf(network: str, request: pytest.FixtureRequest) -> None:
    """ALCF Sophia (NCCL 2.22.3, 16 ranks, -g 1): alltoall_perf's rows of count 0 are nccl-tests' group of empty
    sends and receives, 50.31-56.48 µs (median 50.955 over 8 figures). The model: the Simple p2p message across
    nodes (8.4 + 14.0 + 16 proxy ops x 2 µs = 54.4 µs) behind the host's launches, 54.64 µs on either engine:
    1.07x the median, inside the published range. Held out: no constant was fitted to these rows."""
    if network == "ns3":
        request.getfixturevalue("ns3_lib")
    topo, opts = _alcf()
    bench = nt.Bench(nt.find_test("alltoall_perf"), topo, tuple(range(16)), "float", iters=20, warmup=5, opts=opts)
    sim = make_engine(EngineSpec(network=network), topo)  # type: ignore[arg-type]
    try:
        res = nt.bench_size(bench, sim, 32)  # 32 B over 16 ranks: 0 floats a rank
    finally:
        sim.close()
    published = _published()
    assert res.count == 0 and len(published) == 8
    assert min(published) <= res.time_us <= max(published)
    assert 1.05 <= res.time_us / statistics.median(published) <= 1.09


@pytest.mark.parametrize("network", ["flow", "ns3"])
def test_both_engines_carry_an_empty_step_across_hosts(
    network: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """sendrecv_perf of 0 bytes over testbed16's two hosts (rank 7 -> 8 crosses): flows of 0 bytes the engines end
    as they start, so both print the closed form: the Simple p2p message (8.4 + 14.0 + 2 proxy ops x 1 µs, Intel)
    behind one host launch, (host + 5 x 24.4) / 5; and the same as 4 bytes (one float) in that time."""
    if network == "ns3":
        request.getfixturevalue("ns3_lib")
    gpu = (T.BASE_LAT["ring"][SIMPLE] + T.HW_LAT["net"]["ring"][SIMPLE] + 2 * T.NET_OVERHEAD_US["intel"]) * 1000
    want = round((round(host_launch_us(1) * 1000) + 5 * round(gpu)) / 5 / 1e3, 2)
    argv = ["nccl-tests", "sendrecv_perf", "-b", "0", "-e", "4", "-i", "4", "-g", "1", "--np", "16", "-n", "5",
            "-w", "1", "--topology", "testbed16", "--network", network]  # fmt: skip
    assert main(argv) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#")]
    assert [(r[0], float(r[5]), float(r[9])) for r in rows] == [("0", want, want), ("4", want, want)]
