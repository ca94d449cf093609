"""torch.profiler with CPU and CUDA activity on the simulated GPU (tests/test_simcuda_profiler.py): 5 steps of a matmul,
an all-reduce and a copy to the host on each rank, profiled with a schedule of 1 wait, 1 warmup and 2 active steps.
Rank 0 exports its trace to `argv[1]/rank0.json`, rank 1 to `rank1.json.gz`; each writes its `key_averages()` rows
(name, count, CUDA times) to `argv[1]/avg<R>.json` and its table, sorted by self CUDA time, to `table<R>.txt`."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

out = Path(sys.argv[1])
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
a = torch.randn(512, 512, device="cuda")
x = torch.ones(1 << 20, device="cuda")


def ready(prof: profile) -> None:
    prof.export_chrome_trace(str(out / ("rank0.json" if rank == 0 else "rank1.json.gz")))
    rows = [
        {"name": e.key, "count": e.count, "self_cuda_us": e.self_device_time_total, "cuda_us": e.device_time_total}
        for e in prof.key_averages()
    ]
    (out / f"avg{rank}.json").write_text(json.dumps(rows))
    (out / f"table{rank}.txt").write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20))


with profile(
    activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
    schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
    on_trace_ready=ready,
) as prof:
    for _ in range(5):
        b = a @ a
        dist.all_reduce(x)
        c = b.cpu()
        torch.cuda.synchronize()
        prof.step()
dist.destroy_process_group()
