"""A GPT trained with Megatron-Core's own pieces, written for CUDA and NCCL as Megatron's quick start is:
tensor, pipeline and data parallelism from `parallel_state`, the local (non-Transformer-Engine) layer
spec, Megatron's DistributedDataParallel and optimizer (optionally distributed, ZeRO-1 style), and its
pipeline schedules (1F1B when --pp > 1).

    phantora run --topology testbed16 --nproc 4 examples/mcore_gpt.py --tp 2             # TP 2 x DP 2
    phantora run --topology testbed16 --nproc 4 examples/mcore_gpt.py --pp 2 --microbatches 4
    torchrun --nproc_per_node 4 examples/mcore_gpt.py --tp 2                               # on 4 real GPUs

Megatron-Core needs CUDA (its RNG tracker and attention call it), so on this machine it runs only under
phantora. The corpus counts up from a random start, so the loss falls from ln(vocab) within a few steps.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

VOCAB = 512


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=2, help="microbatches per step and data-parallel rank")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dist-opt", action="store_true", help="Megatron's distributed optimizer (sharded state)")
    return p.parse_args()


def batches(args: argparse.Namespace) -> Iterator[dict[str, torch.Tensor]]:
    """This data-parallel rank's micro-batches: counting sequences, inputs and next-token labels."""
    g = torch.Generator().manual_seed(parallel_state.get_data_parallel_rank())
    positions = torch.arange(args.seq).expand(args.micro_batch, -1)
    while True:
        start = torch.randint(0, VOCAB, (args.micro_batch, 1), generator=g)
        x = (start + torch.arange(args.seq + 1)) % VOCAB
        yield {"tokens": x[:, :-1].cuda(), "labels": x[:, 1:].cuda(), "position_ids": positions.cuda()}


def loss_func(per_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron's (loss sum, token count, logged values) convention: the schedule divides by the tokens."""
    total = per_token.float().sum()
    tokens = torch.tensor(per_token.numel(), dtype=torch.int, device=per_token.device)
    return total, tokens, {"lm loss": torch.stack([total.detach(), tokens.float()])}


def forward_step(data: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module) -> tuple[Any, Callable]:
    b = next(data)
    return model(b["tokens"], b["position_ids"], None, labels=b["labels"]), partial(loss_func)


def main() -> None:
    args = parse()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(0)
    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
    model_parallel_cuda_manual_seed(123)
    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,  # the same weights for any TP size
        pipeline_dtype=torch.float32,
        finalize_model_grads_func=finalize_model_grads,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=args.seq,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    ).cuda()
    print(f"parameters {sum(p.numel() for p in model.parameters())}", flush=True)
    ddp_config = DistributedDataParallelConfig(
        overlap_grad_reduce=True, bucket_size=40_000, use_distributed_optimizer=args.dist_opt
    )
    model = DistributedDataParallel(config, ddp_config, model)
    config.no_sync_func = model.no_sync
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, use_distributed_optimizer=args.dist_opt), [model]
    )
    forward_backward = get_forward_backward_func()
    data = batches(args)
    for step in range(args.steps):
        model.zero_grad_buffer()
        opt.zero_grad()
        logged = forward_backward(
            forward_step_func=forward_step,
            data_iterator=data,
            model=model,
            num_microbatches=args.microbatches,
            seq_length=args.seq,
            micro_batch_size=args.micro_batch,
            forward_only=False,
        )
        opt.step()
        if logged:  # the last pipeline stage
            total, tokens = torch.stack([x["lm loss"] for x in logged]).sum(0).tolist()
            # phantom tensors hold no values: a count of 0 tokens (phantora's placeholder) has no loss to print
            loss = f"{total / tokens:.5f}" if tokens else "n/a (phantom tensors hold no values)"
            print(f"step {step} loss {loss}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
