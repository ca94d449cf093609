"""Rank script for tests/test_simcuda_rms_norm.py: one RMSNorm forward and backward on the simulated GPU, for torch's
`nn.RMSNorm` and the simulated apex's `FusedRMSNorm`. Writes JSON to argv[1]: for each, the ops the session charged
during the forward and the backward (name, bytes, ns; the ops of no time, views and detaches, left out), the autograd
node, and (real mode) the output, rstd and gradients next to their closed forms on the host."""

import json
import sys

import torch
from apex.normalization import FusedRMSNorm

from phantora.runtime import session

ROWS, D, EPS = 32, 256, 1e-6
s = session.current()
seen: list = []
charge = s.charge


def recording(name, cost):
    if cost.ns:
        seen.append([name, cost.nbytes, cost.ns])
    return charge(name, cost)


s.charge = recording
phantom = torch.ones(1, device="cuda").elem.is_meta
torch.manual_seed(0)
host_x, host_g = torch.randn(ROWS, D), torch.randn(ROWS, D)
g = host_g.to("cuda")
out = {"phantom": phantom}
for name, norm in (("torch", torch.nn.RMSNorm(D, eps=EPS)), ("apex", FusedRMSNorm(D, eps=EPS))):
    with torch.no_grad():
        norm.weight.copy_(1 + torch.arange(D) / D)
    norm = norm.cuda()
    x = host_x.to("cuda").requires_grad_()
    seen.clear()
    y = norm(x)
    node = y.grad_fn
    saved = getattr(node, "_saved_result1", None)  # the rstd torch's autograd keeps for the fused backward
    y.backward(g)
    case = {"ops": list(seen), "node": type(node).__name__, "shape": list(y.shape)}
    if not phantom:
        h = host_x.clone().requires_grad_()
        w = (1 + torch.arange(D) / D).requires_grad_()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        want = h * rstd * w
        want.backward(host_g)
        case["y_error"] = (y.detach().cpu() - want.detach()).abs().max().item()
        case["dx_error"] = (x.grad.cpu() - h.grad).abs().max().item()
        case["dw_error"] = (norm.weight.grad.cpu() - w.grad).abs().max().item()
        if saved is not None:
            case["rstd_error"] = (saved.cpu() - rstd.detach()).abs().max().item()
    out[name] = case
json.dump(out, open(sys.argv[1], "w"))
