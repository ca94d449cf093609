"""A CUDA program that takes torch's GPU-only fused paths: dropout and a masked softmax (and backwards).

Writes the values of the masked softmax next to those of softmax(masked_fill) in real mode, to argv[1].
"""

import json
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(0)
x = torch.randn(2, 4, 64, 64, device="cuda", requires_grad=True)
causal = torch.ones(64, 64, dtype=torch.bool, device="cuda").triu(1)
fused = torch._masked_softmax(x, causal.expand_as(x), -1, 2)
plain = torch.softmax(x.masked_fill(causal, float("-inf")), dim=-1)
plain_sm = torch.softmax(x, dim=-1)
y = F.dropout(fused, 0.1, True)
y.sum().backward()
torch.cuda.synchronize()
out: dict[str, object] = {}
if len(sys.argv) > 2 and sys.argv[2] == "real":  # phantom tensors have no values to compare
    out["max_diff"] = float((fused - plain).abs().max())
out["shapes"] = [list(fused.shape), list(x.grad.shape), list(plain_sm.shape)]
json.dump(out, open(sys.argv[1], "w"))
