"""Attention called as the aten op (as an exported graph calls it) and as `F.scaled_dot_product_attention`.

Forward and backward of each (fp32, no dropout), then the op once more under `sdpa_kernel(MATH)`, forward only.
Writes to argv[1] the largest differences between the two calls' outputs and gradients (real mode only) and the
math call's shape.
"""

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", requires_grad=True) for _ in range(3))
by_function = F.scaled_dot_product_attention(q, k, v)
grads_function = torch.autograd.grad(by_function.sum(), (q, k, v))
by_op = torch.ops.aten.scaled_dot_product_attention.default(q, k, v)
grads_op = torch.autograd.grad(by_op.sum(), (q, k, v))
with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
    math = torch.ops.aten.scaled_dot_product_attention.default(q, k, v)
torch.cuda.synchronize()
out: dict[str, object] = {"math_shape": list(math.shape)}
if sys.argv[2] == "real":  # phantom tensors have no values to compare
    out["out_diff"] = float((by_op - by_function).abs().max())
    out["grad_diff"] = max(float((a - b).abs().max()) for a, b in zip(grads_op, grads_function, strict=True))
    out["math_diff"] = float((math - by_function).abs().max())
json.dump(out, open(sys.argv[1], "w"))
