"""Tensor-parallel attention on DTensors (heads sharded over 2 ranks), as pytorch/examples' TP example runs it.

Rank 0 writes to argv[1]: the largest difference of the output and the query's gradient from the same
attention on whole (unsharded) tensors, and the output's placement. argv[3] is the dtype (default float32).
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

mesh = init_device_mesh("cuda", (2,))
torch.manual_seed(0)
dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float32
q, k, v = (torch.randn(2, 4, 32, 16, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
dq, dk, dv = (distribute_tensor(t.detach(), mesh, [Shard(1)]).requires_grad_() for t in (q, k, v))
out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
out.sum().backward()
whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
whole.sum().backward()
seen: dict[str, object] = {"placement": str(out.placements[0]), "shape": list(out.shape)}
if len(sys.argv) > 2 and sys.argv[2] == "real":  # phantom tensors have no values to compare
    seen["out_diff"] = float((out.full_tensor() - whole).abs().max())
    seen["grad_diff"] = float((dq.grad.full_tensor() - q.grad).abs().max())
    hq, hk, hv = (t.detach().cpu().double() for t in (q, k, v))  # the closed form, on the host
    scores = (hq @ hk.transpose(-2, -1) / 4).masked_fill(torch.ones(32, 32).triu(1).bool(), float("-inf"))
    seen["math_diff"] = float((whole.detach().cpu().double() - scores.softmax(-1) @ hv).abs().max())
torch.cuda.synchronize()
if dist.get_rank() == 0:
    json.dump(seen, open(sys.argv[1], "w"))
dist.destroy_process_group()
