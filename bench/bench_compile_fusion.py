"""CPU cost of torch.compile's fusion layer (runtime/fusion.py) per call of a small compiled chain, in a rank.

    phantora run --topology testbed16 --nproc 1 --out D bench/bench_compile_fusion.py
    PHANTORA_COMPILE_FUSION=off phantora run --topology testbed16 --nproc 1 --out D bench/bench_compile_fusion.py

Prints the CPU µs (user + sys) of one call, eager and compiled, without and with a backward, of a 6-op chain on
64 x 64 fp32 cuda tensors (real mode: mul, add, gelu, mm, add, layer_norm). With the switch off, the compiled call
runs the per-op path as the eager one does; the difference between the two runs is the fusion layer's.
"""

import json
import resource

import torch
import torch.nn.functional as F

C = 64
CALLS = 3000
x = torch.randn(64, C, device="cuda")
w = torch.randn(C, C, device="cuda")


def chain(t: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(F.gelu(t * 2 + 1) @ w + t, (C,))


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


compiled = torch.compile(chain)
seen: dict[str, float] = {}
for grad in (False, True):
    xr = x.detach().requires_grad_(grad)
    for name, fn in (("eager", chain), ("compiled", compiled)):
        for _ in range(50):
            y = fn(xr)
            if grad:
                y.sum().backward()
        t0 = cpu_s()
        for _ in range(CALLS):
            y = fn(xr)
            if grad:
                y.sum().backward()
        seen[name + (" with backward" if grad else "")] = round((cpu_s() - t0) / CALLS * 1e6, 1)
print(json.dumps(seen))
