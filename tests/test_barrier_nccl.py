"""`dist.barrier()` on a NCCL group is what ProcessGroupNCCL makes of it: an all-reduce of one float (`at::zeros({1})`,
kFloat) on the group's stream, so it costs NCCL's time for a 4-byte all-reduce (Ring/LL on one H100 host: its
latency), not the cheap one-byte tree `decompose` gives a workload's barrier. Before, a live barrier on 8 H100s took
0.714 us against the 15.001 us of a 4-byte all-reduce. Its wait synchronises the current stream on the host, so the
host launches each barrier of a loop from the last one's end: each costs the host launch h (runtime/nccl_launch.py)
plus its GPU time g, nccl-tests' time less its first launch over the iterations."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.report import nccl_tests as nt
from phantora.topology import dgx_host

SCRIPT = """
    import os
    import torch, torch.distributed as dist
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    dist.barrier()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(4):
        dist.barrier()
    e.record()
    torch.cuda.synchronize()
    if dist.get_rank() == 0:
        print("barrier", round(s.elapsed_time(e) * 1000 / 4, 3))
"""


@pytest.mark.slow
def test_a_barrier_costs_a_one_float_all_reduce(tmp_path: Path) -> None:
    script = tmp_path / "barrier.py"
    script.write_text(textwrap.dedent(SCRIPT))
    topo = dgx_host(8, gpu="h100")
    rep = launch(RunConfig(str(script), [], topo, nproc=8, tensors="phantom", out_dir=tmp_path / "run", timeout_s=600))
    us = float(re.search(r"^barrier ([0-9.]+)$", rep.logs["rank 0"], re.M).group(1))
    assert rep.summary["nccl"]["choices"] == {"all_reduce": {"Ring/LL": 5}}
    bench = nt.Bench(nt.TESTS["all_reduce_perf"], topo, tuple(range(8)), "float", iters=4, warmup=1)
    sim = make_engine(EngineSpec(), topo)
    try:
        res = nt.bench_size(bench, sim, 4)
    finally:
        sim.close()
    launch_ns = 4260 + 32 * res.choice["channels"]  # nccl-tests' first launch; its later ones overlap its GPUs
    g = res.time_ns - launch_ns / 4
    h = round(host_launch_us(DEFAULT_BATCHES) * 1000)  # a rank's launch, after the last barrier's end each time
    assert us == pytest.approx((h + g) / 1e3, abs=0.002)
