"""torch.profiler with CPU and CUDA activity around a matmul on the simulated GPU (tests/test_simcuda_profiler.py),
twice; the first trace is exported to `argv[1]`."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

torch.cuda.set_device(0)
a = torch.randn(256, 256, device="cuda")
for i in range(2):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        b = a @ a
        torch.cuda.synchronize()
    if i == 0:
        prof.export_chrome_trace(sys.argv[1])
