"""Compiled chains on the simulated GPU, each timed with CUDA events (tests/test_compile_fusion.py checks them against
closed forms). Writes {case: simulated ns} to argv[1]."""

import json
import sys
from typing import Any

import torch
import torch.nn.functional as F

N, C = 4096, 1024
x = torch.randn(N, C, device="cuda")
w = torch.randn(C, C, device="cuda")


def chain(t: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(F.gelu(t * 2 + 1), (C,))


def chain_mm(t: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(F.gelu(t * 2 + 1) @ w, (C,))


def two_axes(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A row sum and a column sum of one product: reductions of one tensor along its two axes."""
    y = t * 2
    return y.sum(1), y.sum(0)


@torch.compile(mode="max-autotune")
def relu3(t: torch.Tensor) -> torch.Tensor:
    return torch.relu(t) * 3


def timed(fn: Any, *args: Any) -> int:
    fn(*args)  # a first call (a compiler would compile here)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*args)
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) * 1e6)


seen = {}
with torch.no_grad():
    seen["eager"] = timed(chain, x)
    seen["compiled"] = timed(torch.compile(chain), x)
    seen["compiled_mm"] = timed(torch.compile(chain_mm), x)
    seen["mm"] = timed(torch.mm, x, w)
    seen["module"] = timed(torch.compile(torch.nn.Sequential(torch.nn.LayerNorm(C, elementwise_affine=False))), x)
    seen["decorated"] = timed(relu3, x)
    seen["two_axes"] = timed(torch.compile(two_axes), x)  # as the installed torch's Inductor (2.10 on) fuses them
    from phantora.runtime import fusion, session

    layer = fusion.mode_of(session.current())
    layer.mix_order = False  # as a torch before 2.10 (PHANTORA_TORCH_VERSION=2.5) fuses them
    seen["two_axes_before_2.10"] = timed(torch.compile(two_axes), x)
    layer.mix_order = True
xr = x.detach().requires_grad_()
compiled = torch.compile(chain)
seen["forward_for_grad"] = timed(compiled, xr)
loss = compiled(xr).sum()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
loss.backward()
end.record()
end.synchronize()
seen["backward"] = round(start.elapsed_time(end) * 1e6)
json.dump(seen, open(sys.argv[1], "w"))
