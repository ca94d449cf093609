"""A plain torch.distributed program's collective times against `phantora nccl-tests` (examples/collective_perf.py).

Both model the same NCCL call, so on an idle network a call of the program takes the GPU time of nccl-tests' call:
nccl-tests' timed loop of n calls also holds the host's launch of its first call (`report/host_launch.py`: 4.26 us
+ 32 ns a work batch; the later launches overlap the GPUs at -g 1), and so does the program's, whose timed loop
starts after a synchronise: a rank launches its first call h after it (runtime/nccl_launch.py, at 24 work batches:
it does not know the channels), so torch = nccl-tests + (h - launch) / n. The live runs are slow (spawned ranks).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.report import nccl_tests as nt
from phantora.results.run_dir import nccl_args
from phantora.topology import dgx_host, rail_optimized

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "collective_perf.py"
TESTS = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf", "sendrecv": "sendrecv_perf"}
ITERS, WARMUP = 4, 1


def _torch_times(topo, nproc: int, dedup: int, out: Path, gpu: str | None = None) -> dict[tuple[str, int], float]:
    args = ["--ops", *TESTS, "-b", "1M", "-e", "64M", "-f", "64", "-n", str(ITERS), "-w", str(WARMUP)]
    cfg = RunConfig(
        str(EXAMPLE), args, topo, gpu=gpu, nproc=nproc, tensors="phantom", dedup=dedup, out_dir=out, timeout_s=600
    )
    rep = launch(cfg)
    rows = re.findall(r"^\s*(\w+)\s+(\d+)\s+\d+\s+([0-9.]+)\s", rep.logs["rank 0"], re.M)
    return {(op, int(size)): float(us) for op, size, us in rows}


def _nccl_tests(topo, op: str, size: int) -> nt.SizeResult:
    n = topo.num_ranks
    bench = nt.Bench(nt.TESTS[TESTS[op]], topo, tuple(range(n)), "float", iters=ITERS, warmup=WARMUP)
    sim = make_engine(EngineSpec(), topo)
    try:
        return nt.bench_size(bench, sim, size)
    finally:
        sim.close()


def _check(topo, nranks: int, dedup: int, tmp: Path, gpu: str | None = None) -> None:
    """The program's call times on `topo` (run with --gpu `gpu`) against nccl-tests' on `topo` with that GPU."""
    times = _torch_times(topo, nranks, dedup, tmp, gpu)
    assert len(times) == 6
    if gpu is not None:
        topo = copy.copy(topo)
        topo.gpu_model = gpu
    for (op, size), us in times.items():
        res = _nccl_tests(topo, op, size)
        launch_ns = 4260 + 32 * res.choice["channels"]  # one work batch a channel (send/recv: one peer)
        assert res.iter_ns[0] - res.iter_ns[-1] == launch_ns  # the first call waits for its launch, the rest do not
        h = round(host_launch_us(DEFAULT_BATCHES) * 1000)  # the rank's first launch, after the synchronise
        assert res.time_ns * ITERS - launch_ns >= ITERS * h  # the GPU-bound loop: max(n h + g, h + n g) = h + n g
        assert us == pytest.approx((res.time_ns + (h - launch_ns) / ITERS) / 1e3, abs=0.006), (op, size)


@pytest.mark.slow
def test_one_host_takes_nccl_tests_gpu_time(tmp_path: Path) -> None:
    """8 H100s on an NVSwitch, 2 live ranks: all-reduce, all-gather and a send/recv ring at 1 and 64 MiB."""
    _check(dgx_host(8, gpu="h100"), 8, 2, tmp_path)


@pytest.mark.slow
def test_gpu_option_sets_nccls_generation(tmp_path: Path) -> None:
    """`phantora run --gpu a100` on a topology of H100s runs NCCL as on A100s, as `phantora nccl-tests --gpu a100
    --topology` does: the GPU sets NCCL's tuning, the links stay the topology's (phantora/run_gpu.py). A100 has no
    NVLink SHARP (NCCL enables NVLS from compute capability 9.0), so no call runs NVLS; before, the program's
    64 MiB all-reduce ran NVLS as on H100 (376.98 GB/s bus bandwidth against nccl-tests' Ring 196.48)."""
    _check(dgx_host(8, gpu="h100"), 8, 2, tmp_path, gpu="a100")
    nccl = json.loads((tmp_path / "results.json").read_text())["nccl"]["choices"]
    assert nccl["all_reduce"] and not any(c.startswith("NVLS") for c in nccl["all_reduce"])
    assert json.loads((tmp_path / "results.json").read_text())["gpu"].startswith("A100")


@pytest.mark.slow
def test_two_hosts_take_nccl_tests_gpu_time(tmp_path: Path) -> None:
    """2 rail-optimised hosts of 8 H100s, 8 live ranks each standing for a mirror 8 above: the send/recv ring's
    cross-host pairs 7 -> 8 and 15 -> 0 both run on the world communicator's channels, as nccl-tests' (before,
    the mirrored pair ran on its 2-rank communicator's and took 4056.93 us at 64 MiB against nccl-tests' 5399.33).
    Rank 7's send is recorded with its own pair's choice (4 channels across the network), not rank 6's to it."""
    _check(rail_optimized(2, 8, gpu="h100"), 16, 8, tmp_path)
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    send = next(e for e in trace if e["pid"] == 7 and e["name"].startswith("send#") and e["args"]["bytes"] == 1 << 26)
    assert send["args"]["nccl"]["channels"] == 4
    recv = next(e for e in trace if e["pid"] == 0 and e["name"].startswith("recv#") and e["args"]["bytes"] == 1 << 26)
    assert recv["args"]["nccl"]["channels"] == 4  # the pair 15 -> 0 (a mirror of 7 -> 8)


def test_a_send_recv_record_names_each_ends_own_call() -> None:
    """Every rank's first send is send#0: a pair's choice goes to its sender's send and its receiver's recv only."""
    inside = {"algorithm": "p2p", "channels": 16}
    across = {"algorithm": "p2p", "channels": 4}
    records = [
        {"name": "send#0", "group": [6, 7], "names": [[6, "send#0"], [7, "recv#0"]], "nccl": inside},
        {"name": "send#0", "group": [7, 8], "names": [[0, "recv#0"], [7, "send#0"]], "nccl": across},
        {"name": "all_reduce#0", "group": [0, 1], "nccl": inside},
    ]
    args = nccl_args(records)
    assert args[(7, "send#0", (8,))]["nccl"] is across and args[(7, "recv#0", (6,))]["nccl"] is inside
    assert args[(0, "recv#0", None)]["nccl"] is across  # rank 0 stands for 8: its peer is a mirror of 7
    assert not any(k[0] == 8 for k in args)
    assert args[(1, "all_reduce#0", (0, 1))]["nccl"] is inside
