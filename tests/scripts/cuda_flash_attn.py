"""A CUDA program that calls FlashAttention 3 and 2 as on an H100 host that has them: `import flash_attn_interface`
and `import flash_attn` find phantora's simulated packages here. torch's own FA3 registration is activated as
torchtitan does on SM 9.0. Writes, as JSON to argv[1], the largest differences from torch's SDPA on the host (causal,
grouped key heads): FA3's dense output and gradients, FA2's packed output, FA3's op writing into a given `out`."""

import json
import sys

import flash_attn
import flash_attn_interface
import torch
import torch.nn.functional as F
from torch.nn.attention import activate_flash_attention_impl, current_flash_attention_impl

activate_flash_attention_impl("FA3")
torch.manual_seed(0)
B, S, H, HK, D = 2, 16, 4, 2, 32
host = [torch.randn(B, S, h, D, dtype=torch.bfloat16) for h in (H, HK, HK)]
q, k, v = (x.to("cuda").requires_grad_() for x in host)
out = flash_attn_interface.flash_attn_func(q, k, v, causal=True)
out.float().sum().backward()

ref = [x.float().requires_grad_() for x in host]
want = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in ref), is_causal=True, enable_gqa=True)
want = want.transpose(1, 2)
want.sum().backward()

cum = torch.arange(0, B * S + 1, S, dtype=torch.int32, device="cuda")
packed = flash_attn.flash_attn_varlen_func(*(x.detach().flatten(0, 1) for x in (q, k, v)), cum, cum, S, S, causal=True)
given = torch.empty_like(q)
written = torch.ops.flash_attn_3.fwd(q.detach(), k.detach(), v.detach(), out=given, is_causal=True)[0]
json.dump(
    {
        "simulated": [getattr(m, "__phantora_simulated__", False) for m in (flash_attn_interface, flash_attn)],
        "impl": current_flash_attention_impl(),
        "device": str(out.device),
        "error": (out.detach().cpu().float() - want.detach()).abs().max().item(),
        "grad_error": max(
            (x.grad.cpu().float() - r.grad).abs().max().item() for x, r in zip((q, k, v), ref, strict=True)
        ),
        "packed_error": (packed.cpu().float() - want.detach().flatten(0, 1)).abs().max().item(),
        "out_written": written is given and (given.cpu().float() - want.detach()).abs().max().item() < 0.05,
    },
    open(sys.argv[1], "w"),
)
