"""torch's `context_parallel` over `F.scaled_dot_product_attention` (Accelerate's `maybe_context_parallel`, torch's CP
tutorial) patches the function by its `__name__` (`_distribute_function`: `setattr(F, fn.__name__, wrapper)`).
phantora's replacement of the function (phantom_mode.py `use_fused_attention`) was named `sdpa`, so CP patched
`F.sdpa` and each rank attended to its own shard of the sequence alone: no key/value exchange, outputs off by up to
2.6 (bf16). It now carries torch's name: each rank's rows equal full causal attention's, computed by torch on the
CPU, and the keys and values are all-gathered (`set_rotate_method("allgather")`, as Accelerate sets it); with
grouped-query attention too (`enable_gqa=True`, Llama 3's), which stopped in CP's input check before."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from phantora.launcher import RunConfig, launch

B, H, S, D = 1, 4, 256, 32  # each rank's half-chunks 32 rows: the efficient kernel's logsumexp tile
PROGRAM = """
import sys, torch, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import set_rotate_method
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("cp",))
set_rotate_method("allgather")
seen = {}
CASES = (("bf16", torch.bfloat16, False), ("fp32", torch.float32, False), ("gqa", torch.bfloat16, True))
for name, dtype, gqa in CASES:
    q, k, v = (t.to("cuda", dtype) for t in torch.load(sys.argv[1]))
    if gqa:  # Llama 3's grouped-query attention: 2 key/value heads for 4 query heads
        k, v = k[:, : k.shape[1] // 2].contiguous(), v[:, : v.shape[1] // 2].contiguous()
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v}):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    seen[name] = out.float().cpu()
torch.save(seen, sys.argv[2] + f".{rank}")
"""


def test_context_parallel_sdpa_gathers_the_keys_and_values_and_equals_full_attention(tmp_path: Path) -> None:
    torch.manual_seed(0)
    qkv = [torch.randn(B, H, S, D) for _ in range(3)]
    torch.save(qkv, tmp_path / "qkv.pt")
    script = tmp_path / "cp.py"
    script.write_text(PROGRAM)
    launch(RunConfig(str(script), [str(tmp_path / "qkv.pt"), str(tmp_path / "seen")], "testbed16", nproc=2,
                     out_dir=tmp_path / "out"))  # fmt: skip
    # CP's load balancing: the sequence in 4 chunks, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    chunk = S // 4
    rows = {0: [*range(0, chunk), *range(3 * chunk, S)], 1: list(range(chunk, 3 * chunk))}
    for name, dtype, gqa, tol in (("bf16", torch.bfloat16, False, 1e-2), ("fp32", torch.float32, False, 1e-5),
                                  ("gqa", torch.bfloat16, True, 1e-2)):  # fmt: skip
        q, k, v = (t.to(dtype) for t in qkv)
        if gqa:
            k, v = k[:, : H // 2], v[:, : H // 2]
        full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).float()
        for rank in (0, 1):
            out = torch.load(tmp_path / f"seen.{rank}")[name]
            assert out.shape == (B, H, 2 * chunk, D)
            torch.testing.assert_close(out, full[:, :, rows[rank]], atol=tol, rtol=tol)
    comm = json.loads((tmp_path / "out" / "results.json").read_text())["ranks"][0]["comm"]
    # one all-gather of the key and value shards a call: 2 tensors x B x H x S x D elements, bf16, fp32, and the
    # grouped call's with its shared heads copied out to H (phantom_mode.py; a GPU's flash kernel would move H / 2)
    assert comm["all_gather"]["count"] == 3
    assert comm["all_gather"]["bytes"] == 2 * B * H * S * D * (2 + 4 + 2)
