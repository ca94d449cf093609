"""CUDA extensions the simulated GPU provides in place of compiling them: kernels written with torch ops.

A program that JIT-builds a known extension (`torch.utils.cpp_extension.load(name=...)`, as DeepSpeed's op
builders do) gets the module here instead, and is told so in one line. Its kernels run as torch ops on the
simulated GPU, so the compute model times them as it times any op (a fused kernel's single launch is not
modelled: each foreach op is charged on its own). Any other CUDA extension is refused (toolkit.py).

- `fused_adam` (DeepSpeed's FusedAdam): `multi_tensor_adam(chunk_size, noop_flag, [grads, params, exp_avgs,
  exp_avg_sqs], lr, beta1, beta2, eps, step, mode, bias_correction, weight_decay)`, Adam (Kingma & Ba, 2015)
  with L2 weight decay (`mode` 0) or AdamW's decoupled decay (Loshchilov & Hutter, 2019; `mode` 1). Half-precision
  tensors are updated in fp32 and written back, as a fused kernel computes.
- `quantizer` (DeepSpeed's, ZeRO++'s quantized weights): ds_quantizer.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch

from phantora.runtime.simcuda import ds_quantizer


@torch.no_grad()  # a kernel writes its tensors whatever autograd thinks of them (DeepSpeed passes bf16 leaves)
def multi_tensor_adam(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: list[list[torch.Tensor]],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    mode: int,
    bias_correction: int,
    weight_decay: float,
) -> None:
    """One Adam step over each (grad, param, exp_avg, exp_avg_sq), in place."""
    grads, params, exp_avgs, exp_avg_sqs = tensor_lists
    if not params:
        return
    half = params[0].dtype != torch.float32
    p = [x.float() for x in params] if half else list(params)
    m = [x.float() for x in exp_avgs] if half else list(exp_avgs)
    v = [x.float() for x in exp_avg_sqs] if half else list(exp_avg_sqs)
    g = [x.float() for x in grads] if grads[0].dtype != torch.float32 else list(grads)
    if mode == 0 and weight_decay != 0:
        g = list(torch._foreach_add(g, p, alpha=weight_decay))
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, g, alpha=1 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, value=1 - beta2)
    bc1 = 1 - beta1**step if bias_correction else 1.0
    bc2 = 1 - beta2**step if bias_correction else 1.0
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, math.sqrt(bc2))
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(m, denom)
    torch._foreach_div_(update, bc1)
    if mode == 1 and weight_decay != 0:
        torch._foreach_add_(update, p, alpha=weight_decay)
    torch._foreach_add_(p, update, alpha=-lr)
    if half:
        for dst, src in ((params, p), (exp_avgs, m), (exp_avg_sqs, v)):
            torch._foreach_copy_(dst, src)


MODULES: dict[str, Any] = {
    "fused_adam": SimpleNamespace(multi_tensor_adam=multi_tensor_adam),
    "quantizer": ds_quantizer.MODULE,
}


def provided(name: str) -> Any | None:
    """The simulated module of CUDA extension `name`, or None if the simulated GPU does not provide it."""
    return MODULES.get(name)
