"""Train a Llama-3-style decoder with FSDP2, or with tensor parallelism + FSDP2 on a 2-D mesh.

    phantora run --topology testbed16 --nproc 4 examples/llama_train.py --model tiny --steps 3
    phantora run --topology testbed16 --nproc 4 examples/llama_train.py --model tiny --parallel tp-fsdp --tp 2
    phantora run --phantom --topology testbed16 --nproc 8 examples/llama_train.py --model llama3-8b --seq 8192
    torchrun --nproc_per_node 4 examples/llama_train.py --model tiny --steps 3   # the same on gloo

--parallel fsdp: `fully_shard` on every block, then on the root, over a 1-D mesh of all ranks.
--parallel tp-fsdp: a 2-D mesh ("dp", "tp"); within a tp group, wq/wk/wv and w1/w3 are
ColwiseParallel and wo/w2 RowwiseParallel (attention heads and MLP columns split over tp; one
all-reduce per sub-layer in the forward and one in the backward); the embedding, the norms and the
output head stay replicated over tp. Then `fully_shard` over the "dp" sub-mesh. Ranks of one tp
group read the same batch.

--layers N and --vocab V keep the model's shapes but for the number of blocks and the vocabulary (the
embedding and output head): a short program with the same collectives a block, e.g. for a packet-mode check
at 1024 GPUs (`--model llama3-8b --layers 2 --vocab 8192`; docs/packet-model.md).

--ac full checkpoints every block; --ac selective every other block (0, 2, 4, ...), which saves
about half the activation memory for about half the recompute; --ac op checkpoints every block at
op level, as torchtitan's selective_ac_option="op": matmul (but every second one), attention and
max outputs are kept, the rest is recomputed. --dtype bf16 uses FSDP2's
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): fp32 master weights and optimizer
state, bf16 compute and all-gathers, fp32 gradient reduce-scatters.

Data is random token ids from a generator seeded by (seed, step, dp rank), created on the default
device, so under phantom mode (default device "meta") the batch is a phantom too.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import torch.distributed as dist
from llama_model import Transformer, flops_per_token, get_config, loss_fn, param_count, set_activation_checkpointing
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

import phantora.runtime as pr

phantom = pr.phantom


def tp_plan() -> dict:
    """Megatron-style plan for one block: one all-reduce per sub-layer in the forward (the row-parallel
    output) and one in the backward. The sub-layer's input is made a replicated DTensor once, so the
    input gradients of wq, wk and wv (and of w1 and w3) add up locally before a single all-reduce."""
    shared_input = PrepareModuleInput(
        input_layouts=(Replicate(), None, None), desired_input_layouts=(Replicate(), None, None), use_local_output=False
    )
    return {
        "attention": shared_input,
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=False
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="llama3-8b, llama3-70b, llama3-405b, small, tiny")
    p.add_argument("--layers", type=int, default=None, help="override the number of blocks")
    p.add_argument(
        "--vocab", type=int, default=None, help="override the vocabulary size (the embedding and output head)"
    )
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2, help="sequences per data-parallel rank per step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--parallel", choices=["fsdp", "tp-fsdp"], default="fsdp")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (tp-fsdp)")
    p.add_argument("--ac", choices=["none", "selective", "op", "full"], default="none")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    cfg = get_config(args.model, args.layers)
    if args.vocab is not None:
        if args.vocab < 1:
            raise SystemExit(f"--vocab must be >= 1, got {args.vocab}")
        cfg = dataclasses.replace(cfg, vocab=args.vocab)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.parallel == "fsdp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        dp_mesh, tp = mesh, 1
    else:
        tp = args.tp
        if world % tp or cfg.kv_heads % tp or cfg.ffn % tp:
            raise SystemExit(
                f"--tp {tp} must divide the world ({world}), kv_heads ({cfg.kv_heads}) and ffn ({cfg.ffn})"
            )
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        dp_mesh = mesh["dp"]
    dp, dp_rank = dp_mesh.size(), dp_mesh.get_local_rank()

    torch.manual_seed(args.seed)  # every rank builds the same full model, then shards it
    # Built and sharded as with meta-device init: only the shards left at the end are device memory.
    with pr.deferred_init():
        model = Transformer(cfg, args.seq)
        checkpointed = set_activation_checkpointing(model, args.ac)
        if tp > 1:
            for block in model.layers:
                parallelize_module(block, mesh["tp"], tp_plan())
        mp = MixedPrecisionPolicy()  # fp32: no casts
        if args.dtype == "bf16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mesh=dp_mesh, mp_policy=mp)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    tokens = args.batch * args.seq * dp  # ranks of one tp group share their batch
    flops = flops_per_token(cfg, args.seq) * tokens
    pr.report_workload(tokens_per_step=tokens, flops_per_step=flops, dtype="bf16" if args.dtype == "bf16" else None)
    if rank == 0:
        print(
            f"model {args.model}: {cfg.layers} layers, dim {cfg.dim}, {param_count(cfg):,} params, "
            f"{flops / tokens:.4g} FLOP/token; {args.parallel} dp {dp} tp {tp}, ac {args.ac} "
            f"(blocks {checkpointed}), {args.dtype}, phantom {phantom()}",
            flush=True,
        )
    for step in range(args.steps):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + dp_rank)
        data = torch.randint(0, cfg.vocab, (args.batch, args.seq + 1), generator=g)
        x, y = data[:, :-1], data[:, 1:]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        pr.step()
        if rank == 0:
            value = loss.item()  # phantom mode: a NaN placeholder (tensors have no values)
            print(f"step {step:3d}  loss {value:.4f}  time {(time.perf_counter() - t0) * 1e3:.3f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
