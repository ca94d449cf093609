"""torch.compile(fullgraph=True) of a function on cuda tensors, as torch's own context parallelism compiles
create_block_mask: runs eagerly on the simulated GPU. Writes the result to argv[1]."""

import json
import sys

import torch


def f(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum()


x = torch.arange(4.0, device="cuda")
out = torch.compile(f, dynamic=False, fullgraph=True)(x)
json.dump({"value": out.item(), "device": str(out.device)}, open(sys.argv[1], "w"))
