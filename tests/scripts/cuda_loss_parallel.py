"""A vocabulary-sharded output under TP's `loss_parallel`, as torchtitan and pytorch/examples' TP programs run it.

The output layer is `ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)` on 2 ranks; the program takes
`F.cross_entropy` (two targets ignored) and its backward inside `loss_parallel()`. Rank 0 writes to argv[1] the loss,
the closed form's loss and the largest difference of its weight shard's gradient from the closed form's (real mode).
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

mesh = init_device_mesh("cuda", (2,))
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Module()
model.lm_head = nn.Linear(16, 32, bias=False, device="cuda")
weight = model.lm_head.weight.detach().cpu().double()
parallelize_module(model, mesh, {"lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
x = torch.randn(8, 16, device="cuda")
target = torch.randint(0, 32, (8,), device="cuda")
target = torch.where(torch.arange(8, device="cuda") % 4 == 1, -100, target)  # rows 1, 5 ignored: a mean of 6
with loss_parallel():
    logits = model.lm_head(x)
    loss = F.cross_entropy(logits, target)
    loss.backward()
seen: dict[str, object] = {"placement": str(logits.placements[0]), "loss_type": type(loss).__name__}
if len(sys.argv) > 2 and sys.argv[2] == "real":  # phantom tensors have no values to compare
    hx, ht = x.cpu().double(), target.cpu()
    z = hx @ weight.T  # the whole logits, on the host
    valid = ht != -100
    safe = ht.clamp(min=0)
    per_row = z.logsumexp(-1) - z.gather(1, safe[:, None])[:, 0]  # -log softmax(z)[t]
    seen["loss"] = float(loss.full_tensor())
    seen["closed_form"] = float(per_row[valid].sum() / valid.sum())
    dz = (z.softmax(-1) - F.one_hot(safe, 32).double()) * valid[:, None] / valid.sum()
    grad = (dz.T @ hx)[rank * 16 : (rank + 1) * 16]  # this rank's rows of the weight's gradient
    seen["grad_diff"] = float((model.lm_head.weight.grad.to_local().cpu().double() - grad).abs().max())
torch.cuda.synchronize()
if rank == 0:
    json.dump(seen, open(sys.argv[1], "w"))
dist.destroy_process_group()
