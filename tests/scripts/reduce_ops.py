"""Every reduction a training program hands NCCL, as a CUDA + NCCL script (tests/test_nccl_redop_live.py).

For each (op, dtype) of `CALLS`, one all-reduce of `argv[1]` bytes and one reduce-scatter of as many, through
torch.distributed; then a functional all-reduce (max) and reduce-scatter (avg), which go through the same process
group. FSDP2 reduce-scatters its gradients with PREMUL_SUM (`_make_nccl_premul_sum`), as below.
"""

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import phantora.runtime as pr

R = dist.ReduceOp
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int32": torch.int32}
CALLS = [(op, d) for d in ("bf16", "fp32", "int32") for op in ("sum", "avg", "max")]
CALLS += [("mulsum", "bf16"), ("mulsum", "fp32")]

dist.init_process_group("nccl")
n = dist.get_world_size()
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
OPS = {"sum": R.SUM, "avg": R.AVG, "max": R.MAX, "mulsum": dist._make_nccl_premul_sum(1.0 / n)}
size = int(sys.argv[1])
for op, d in CALLS:
    dtype = DTYPES[d]
    count = size // torch.tensor([], dtype=dtype).element_size()
    x = torch.empty(count, dtype=dtype, device="cuda")
    dist.all_reduce(x, op=OPS[op])
    dist.reduce_scatter_tensor(torch.empty(count // n, dtype=dtype, device="cuda"), x, op=OPS[op])
y = torch.empty(size // 4, dtype=torch.float32, device="cuda")
funcol.wait_tensor(funcol.all_reduce(y, "max", dist.group.WORLD))
funcol.wait_tensor(funcol.reduce_scatter_tensor(y, "avg", 0, dist.group.WORLD))
torch.cuda.synchronize()
pr.step()
