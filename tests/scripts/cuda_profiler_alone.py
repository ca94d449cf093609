"""torch.profiler on one simulated GPU, run with `--trace none` (tests/test_simcuda_profiler.py): a CUDA profile of 3
matmuls exported to `argv[1]/cuda.json`, a CPU-only profile of one exported to `argv[1]/cpu.json`, and the autograd
profiler's own CUDA profile (`use_device="cuda"`) of one exported to `argv[1]/legacy.json`."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

a = torch.randn(512, 512, device="cuda")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        b = a @ a
    torch.cuda.synchronize()
prof.export_chrome_trace(sys.argv[1] + "/cuda.json")
with profile(activities=[ProfilerActivity.CPU]) as cpu:
    b = a @ a
cpu.export_chrome_trace(sys.argv[1] + "/cpu.json")
with torch.autograd.profiler.profile(use_device="cuda") as legacy:
    b = a @ a
legacy.export_chrome_trace(sys.argv[1] + "/legacy.json")
