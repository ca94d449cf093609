# ruff: noqa: N803 - triton kernels take their compile-time constants in capitals
"""A CUDA program with its own triton kernels, one plain, one autotuned, one calling a @triton.jit helper. Prints
whether their outputs are right (on the simulated GPU: triton's interpreter runs them on the host data in real mode)."""

import os
import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from phantora.runtime import phantom


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 512})], key=["n"])
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _square(v):
    return v * v


@triton.jit
def square_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # calls a @triton.jit helper, as TRL's kernels do
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, _square(tl.load(x_ptr + offs, mask=mask)), mask=mask)


N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
x = torch.arange(N, dtype=torch.float32, device="cuda")
y = torch.ones(N, device="cuda")
out = torch.empty_like(x)
add_kernel[(triton.cdiv(N, 256),)](x, y, out, N, BLOCK=256)
scaled = torch.empty_like(x)
for _ in range(2):
    scale_kernel[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, scaled, N)
squared = torch.empty_like(x)
square_kernel[(triton.cdiv(N, 256),)](x, squared, N, BLOCK=256)
if not phantom():  # phantom tensors have no values to compare
    right = (torch.equal(out, x + y), torch.equal(scaled, 2 * x), torch.equal(squared, x * x))
    print("add right {} scale right {} square right {}".format(*right), flush=True)
dist.destroy_process_group()
