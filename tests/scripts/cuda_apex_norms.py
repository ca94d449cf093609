"""A CUDA program that uses apex's fused norms, as on a cluster with apex: `import apex` finds phantora's simulated
apex here. Writes, as JSON to argv[1], its forward and backward values next to their closed forms on the host."""

import json
import sys

import apex
import torch
from apex.normalization import FusedLayerNorm, FusedRMSNorm

torch.manual_seed(0)
host = torch.randn(4, 16)
x = host.to("cuda").requires_grad_()
ln, rms = FusedLayerNorm(16).cuda(), FusedRMSNorm(16).cuda()
y_ln = ln(x)
y_ln.sum().backward()
ln_grad = x.grad.cpu()
x.grad = None
y_rms = rms(x)
(y_rms * y_rms).sum().backward()  # a gradient that is not constant over a row
rms_grad = x.grad.cpu()

h = host.clone().requires_grad_()
want_ln = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
want_ln.sum().backward()
want_ln_grad, h.grad = h.grad, None
want_rms = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
(want_rms * want_rms).sum().backward()
json.dump(
    {
        "simulated": getattr(apex, "__phantora_simulated__", False),
        "device": str(y_ln.device),
        "ln_error": (y_ln.detach().cpu() - want_ln.detach()).abs().max().item(),
        "ln_grad_error": (ln_grad - want_ln_grad).abs().max().item(),
        "rms_error": (y_rms.detach().cpu() - want_rms.detach()).abs().max().item(),
        "rms_grad_error": (rms_grad - h.grad).abs().max().item(),
    },
    open(sys.argv[1], "w"),
)
