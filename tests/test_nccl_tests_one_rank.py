"""`phantora nccl-tests` on one rank: NCCL copies the buffer on the GPU (ncclLaunchOneRank), in place it does
nothing, so no bandwidth exceeds the GPU memory's copy rate."""

from __future__ import annotations

import pytest

from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.perfmodel.gpus import get_gpu
from phantora.report import nccl_tests as nt
from phantora.report.host_launch import host_ns_per_call
from phantora.topology import dgx_host


@pytest.mark.parametrize("test", ["all_reduce_perf", "all_gather_perf", "sendrecv_perf", "alltoall_perf"])
def test_one_rank_copies_out_of_place_at_the_memory_rate(test: str) -> None:
    topo = dgx_host(8, gpu="h100")
    bench = nt.Bench(nt.TESTS[test], topo, (0,), "float", iters=2, warmup=0, graph=True)
    sim = make_engine(EngineSpec(), topo)
    size = 8 << 30
    try:
        res = nt.bench_size(bench, sim, size)
    finally:
        sim.close()
    copy_ns = 2 * size / get_gpu("h100").mem_bw * 1e9  # read and write 8 GiB at 3.35 TB/s: 5,128.32 us
    assert res.iter_ns == [round(copy_ns)] * 2  # no host launch under -G 1
    assert res.algbw == pytest.approx(get_gpu("h100").mem_bw / 2 / 1e9, rel=1e-6)  # 1,675 GB/s, not 2e6
    p2p = test in ("sendrecv_perf", "alltoall_perf")  # a p2p call to itself copies in place too
    assert res.in_place().iter_ns == ([round(copy_ns)] * 2 if p2p else [0, 0])
    line = nt.size_line(res, nt.TESTS[test], "float", "sum", 0)
    fields = line.split()
    assert fields[5] == "5128.32" and fields[9] == ("5128.32" if p2p else "0.00")


def test_one_rank_in_place_costs_its_launch_only() -> None:
    topo = dgx_host(8, gpu="a100")
    bench = nt.Bench(nt.TESTS["all_reduce_perf"], topo, (0,), "float", iters=1, warmup=0)
    sim = make_engine(EngineSpec(), topo)
    try:
        res = nt.bench_size(bench, sim, 1 << 30)
    finally:
        sim.close()
    launch = host_ns_per_call("all_reduce", res.choice, 1, 1)
    assert res.in_place().iter_ns == [launch]
    assert res.iter_ns == [launch + round(2 * (1 << 30) / get_gpu("a100").mem_bw * 1e9)]
