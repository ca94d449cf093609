"""Probe the simulated GPU's RNG, FlexAttention and peak-memory reset as a CUDA program sees them.

Rank 0 writes what it saw as JSON (argv[1]).
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint

out: dict = {}
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
torch.manual_seed(0)

# The generator is counter-based: a saved state replays its draw; the offset moves on by the values drawn.
state = torch.cuda.get_rng_state()
a = torch.randn(10, device="cuda")
after = torch.cuda.get_rng_state()
b = torch.randn(10, device="cuda")
torch.cuda.set_rng_state(state)
again = torch.randn(10, device="cuda")
out["replays"] = torch.equal(a.cpu(), again.cpu())
out["successive_differ"] = not torch.equal(a.cpu(), b.cpu())
out["offset_moved"] = int(after.view(torch.int64)[1] - state.view(torch.int64)[1])
host = torch.get_rng_state()
torch.randn(10, device="cuda")
out["host_untouched"] = torch.equal(host, torch.get_rng_state())

# DTensor's RNG tracker sets the offset per shard: two draws of one sharded tensor differ.
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
d1 = distribute_tensor(torch.zeros(8, 4, device="cuda"), mesh, [Shard(0)]).normal_().to_local().cpu()
d2 = distribute_tensor(torch.zeros(8, 4, device="cuda"), mesh, [Shard(0)]).normal_().to_local().cpu()
out["dtensor_draws_differ"] = not torch.equal(d1, d2)

# Activation checkpointing replays the forward's dropout mask: d/dx sum(dropout(x)) = mask / (1 - p).
x = torch.ones(4096, device="cuda", requires_grad=True)
y = checkpoint(lambda t: F.dropout(t, 0.5, training=True), x, use_reentrant=False)
y.sum().backward()
out["checkpoint_mask_replayed"] = torch.equal(x.grad.cpu(), (y.detach().cpu() != 0).float() * 2)

# FlexAttention with a causal block mask: SDPA's values and gradients (fp32), then both timed in bf16 and fp32.
B, H, S, D = 2, 4, 256, 32
mask = create_block_mask(lambda b, h, q, kv: q >= kv, B, H, S, S, device="cuda")
q, k, v = (torch.randn(B, H, S, D, device="cuda", requires_grad=True) for _ in range(3))
ref_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
o = flex_attention(q, k, v, block_mask=mask)
ref = F.scaled_dot_product_attention(*ref_in, is_causal=True)
out["flex_device"] = str(o.device)
out["flex_max_diff"] = float((o - ref).abs().max())
o.sum().backward()
ref.sum().backward()
out["flex_grad_max_diff"] = max(float((t.grad - r.grad).abs().max()) for t, r in zip((q, k, v), ref_in, strict=True))
half = [t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
half_ref = [t.detach().clone().requires_grad_() for t in half]
ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
ev[0].record()
o16 = flex_attention(*half, block_mask=mask)
ev[1].record()
ref16 = F.scaled_dot_product_attention(*half_ref, is_causal=True)
ev[2].record()
o16.float().sum().backward()
ref16.float().sum().backward()
out["flex_ms"] = ev[0].elapsed_time(ev[1])
out["sdpa_ms"] = ev[1].elapsed_time(ev[2])

# A causal sliding window of 128 keys over 1,024 (bf16), forward and backward: charged for the blocks it keeps.
W = 1024
window = create_block_mask(lambda b, h, q, kv: (q >= kv) & (q - kv <= 128), B, H, W, W, device="cuda")
wq = [torch.randn(B, H, W, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
flex_attention(*wq, block_mask=window).float().sum().backward()

# The program's peak restarts at reset_peak_memory_stats; the run's peak (results.json) does not.
big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
del big
torch.cuda.reset_peak_memory_stats()
out["peak_after_reset"] = torch.cuda.max_memory_allocated()
out["allocated_after_reset"] = torch.cuda.memory_allocated()

if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
dist.destroy_process_group()
