"""A Megatron-LM-style GPT (GPT-3 architecture) trained with tensor parallelism + DDP data parallelism.

    phantora run --tensors phantom --dedup 8 --gpu a100 --topology T --nproc 32 \
        examples/megatron_gpt.py --model gpt3-1.7b --tp 1 --global-batch 512 --micro-batch 4
    phantora run --topology testbed16 --nproc 4 examples/megatron_gpt.py --model tiny --tp 2 --global-batch 8
    torchrun --nproc_per_node 4 examples/megatron_gpt.py --model tiny --tp 2 --device cpu  # on gloo

The model follows Megatron-LM's GPT (Shoeybi et al. 2019; Narayanan et al. 2021): pre-LayerNorm
blocks, learned position embeddings, multi-head attention through
`F.scaled_dot_product_attention(is_causal=True)`, a GeLU MLP of 4 h, hidden dropout, and an output
head tied to the input (word) embedding. Configurations `gpt3-1.7b`, `gpt3-3.6b`, `gpt3-7.5b`,
`gpt3-18.4b` are the first rows of Table 1 of Narayanan et al., "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM" (SC 2021): seq 2048, vocab 51200.

Tensor parallelism is Megatron's own scheme written with explicit collectives on the "tp" groups
of a 2-D DeviceMesh ("dp", "tp"): the QKV projection and the first MLP linear are column-parallel
(heads and MLP columns split over tp), the attention output projection and the second MLP linear
are row-parallel (one all-reduce in the forward), and the conjugate operator before each
column-parallel linear all-reduces the input gradient in the backward. The word embedding is
vocab-parallel (rows split over tp, one all-reduce of the embedded batch), the tied output head
produces vocab-sharded logits, and the loss is Megatron's vocab-parallel cross-entropy (three
all-reduces of one value per token). Position embeddings and LayerNorms are replicated over tp.

Data parallelism over the "dp" groups, `--dp-impl`:
- `megatron` (default): Megatron-LM's own data parallelism at the time of the paper
  (`--DDP-impl local` with contiguous gradient buffers): every parameter's gradient is a view of
  one flat buffer, the micro-batches accumulate into it, and after the backward of the last one the
  buffer is divided by dp and all-reduced in one call, not overlapped with the backward.
- `torch`: torch's DistributedDataParallel (bucketed all-reduce overlapped with the backward of the
  last micro-batch; the other micro-batches under `no_sync`), in real and phantom mode.

Mixed precision as in Megatron: bf16 parameters, activations and gradients (the
gradient all-reduce is in bf16), fp32 master weights and AdamW state, gradient clipping at 1.0
with the norm all-reduced over tp. `--recompute full` checkpoints every block
(torch.utils.checkpoint, non-reentrant), as Megatron's full activation recomputation does.

It is written for CUDA + NCCL, as Megatron-LM is: under phantora the model lives on the simulated
GPU (phantom or real tensors), so every op runs the CUDA path of torch (e.g. dropout is one fused
kernel, the optimizer uses multi-tensor kernels); `--device cpu` runs it on gloo.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import phantora.runtime as pr

phantom = getattr(pr, "phantom", lambda: False)


@dataclass(frozen=True)
class GPTConfig:
    hidden: int
    layers: int
    heads: int
    vocab: int = 51200
    seq: int = 2048
    dropout: float = 0.1  # Megatron's default hidden dropout
    attention: str = "sdpa"  # or "unfused"/"megatron": explicit scores and softmax, as Megatron-LM in 2021
    norm_eps: float = 1e-5

    @property
    def ffn(self) -> int:
        return 4 * self.hidden


CONFIGS: dict[str, GPTConfig] = {
    # Narayanan et al. 2021, Table 1 (PP = 1 rows): hidden, layers, attention heads.
    "gpt3-1.7b": GPTConfig(hidden=2304, layers=24, heads=24),
    "gpt3-3.6b": GPTConfig(hidden=3072, layers=30, heads=32),
    "gpt3-7.5b": GPTConfig(hidden=4096, layers=36, heads=32),
    "gpt3-18.4b": GPTConfig(hidden=6144, layers=40, heads=48),
    # test size: real mode on a CPU in seconds
    "tiny": GPTConfig(hidden=64, layers=2, heads=4, vocab=512, seq=64),
}

# The published runs these configurations reproduce (Table 1 of Narayanan et al. 2021): tensor- and
# pipeline-parallel degree, GPUs, global batch (sequences), achieved TFLOP/s per GPU (A100 80GB, peak 312).
TABLE1: dict[str, dict[str, int]] = {
    "gpt3-1.7b": {"tp": 1, "pp": 1, "gpus": 32, "batch": 512, "tflops": 137},
    "gpt3-3.6b": {"tp": 2, "pp": 1, "gpus": 64, "batch": 512, "tflops": 138},
    "gpt3-7.5b": {"tp": 4, "pp": 1, "gpus": 128, "batch": 512, "tflops": 142},
    "gpt3-18.4b": {"tp": 8, "pp": 1, "gpus": 256, "batch": 1024, "tflops": 135},
}


def get_config(name: str, layers: int | None = None, seq: int | None = None) -> GPTConfig:
    """A named configuration, optionally with another number of blocks or sequence length."""
    if name not in CONFIGS:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(CONFIGS)}")
    cfg = CONFIGS[name]
    if layers is not None:
        cfg = dataclasses.replace(cfg, layers=layers)
    if seq is not None:
        cfg = dataclasses.replace(cfg, seq=seq)
    if cfg.hidden % cfg.heads:
        raise SystemExit(f"hidden {cfg.hidden} is not a multiple of heads {cfg.heads}")
    return cfg


def param_count(cfg: GPTConfig) -> int:
    """Exact parameter count of `GPT(cfg)` (any tp degree, summed over the tp group), from the config.

    Per block: QKV 3 h^2 + 3 h, output projection h^2 + h, MLP 8 h^2 + 5 h, two LayerNorms 4 h;
    plus word (tied with the head) and position embeddings and the final LayerNorm.
    """
    h = cfg.hidden
    return cfg.layers * (12 * h * h + 13 * h) + (cfg.vocab + cfg.seq) * h + 2 * h


def megatron_flops(cfg: GPTConfig, batch: int, seq: int | None = None) -> float:
    """FLOPs of one training iteration by Megatron's formula (Narayanan et al. 2021, eq. 3), which
    counts the forward, the activation recomputation and the backward (2x forward) of every block,
    plus the logit layer's forward and backward: 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))."""
    s = seq if seq is not None else cfg.seq
    h, layers = cfg.hidden, cfg.layers
    return 96.0 * batch * s * layers * h * h * (1 + s / (6 * h) + cfg.vocab / (16 * layers * h))


# --- tensor parallelism (Megatron's f / g operators on a process group) -------------------------------


@dataclass
class TP:
    group: dist.ProcessGroup | None = None
    size: int = 1
    rank: int = 0


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity in the forward, all-reduce of the input gradient in the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # noqa: ANN205
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce in the forward, identity in the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group) -> torch.Tensor:  # noqa: ANN001
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # noqa: ANN205
        return grad, None


def copy_to_tp(x: torch.Tensor, tp: TP) -> torch.Tensor:
    return _CopyToTP.apply(x, tp.group) if tp.size > 1 else x


def reduce_from_tp(x: torch.Tensor, tp: TP) -> torch.Tensor:
    return _ReduceFromTP.apply(x, tp.group) if tp.size > 1 else x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits whose vocabulary is split over tp (Megatron's
    vocab_parallel_cross_entropy): all-reduces of the max, of the target logit and of the sum of
    exponentials, one value per token each; the backward is local."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, tp: TP) -> torch.Tensor:
        part = logits.shape[-1]
        start = tp.rank * part
        logits_max = logits.max(dim=-1).values
        if tp.size > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=tp.group)
        logits = logits - logits_max.unsqueeze(-1)
        outside = (target < start) | (target >= start + part)
        local = (target - start).masked_fill(outside, 0)
        picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = logits.exp()
        sum_exp = exp.sum(dim=-1)
        if tp.size > 1:
            dist.all_reduce(picked, group=tp.group)
            dist.all_reduce(sum_exp, group=tp.group)
        loss = torch.log(sum_exp) - picked
        exp.div_(sum_exp.unsqueeze(-1))  # softmax, kept for the backward
        ctx.save_for_backward(exp, local, outside)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # noqa: ANN205
        softmax, local, outside = ctx.saved_tensors
        hit = (~outside).to(softmax.dtype).unsqueeze(-1)
        g = softmax.scatter_add(-1, local.unsqueeze(-1), -hit)
        return g * grad.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp: TP) -> torch.Tensor:
    """Mean loss over tokens; `logits` (..., V / tp) in fp32, `target` (...) global token ids."""
    return _VocabParallelCrossEntropy.apply(logits, target, tp).mean()


# --- the model ----------------------------------------------------------------------------------------


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with the output features split over tp (the input is already on every rank)."""

    def __init__(self, inp: int, out: int, tp: TP) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out // tp.size, inp))
        self.bias = nn.Parameter(torch.zeros(out // tp.size))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local W_local^T) + b with the input features split over tp; b replicated."""

    def __init__(self, inp: int, out: int, tp: TP, std: float) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out, inp // tp.size))
        self.bias = nn.Parameter(torch.zeros(out))
        nn.init.normal_(self.weight, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(F.linear(x, self.weight), self.tp) + self.bias


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, tp: TP) -> None:
        super().__init__()
        if cfg.heads % tp.size:
            raise SystemExit(f"tp {tp.size} must divide the {cfg.heads} attention heads")
        self.tp, self.head_dim = tp, cfg.hidden // cfg.heads
        self.unfused = cfg.attention in ("unfused", "megatron")
        self.fused_softmax = cfg.attention == "megatron"
        self.attention_dropout = cfg.dropout  # Megatron's default attention dropout (unfused path only)
        out_std = 0.02 / math.sqrt(2 * cfg.layers)  # Megatron's scaled init of output layers
        self.qkv = ColumnParallelLinear(cfg.hidden, 3 * cfg.hidden, tp)
        self.proj = RowParallelLinear(cfg.hidden, cfg.hidden, tp, out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv(copy_to_tp(x, self.tp))  # (b, t, 3 h / tp), per head [q | k | v]
        qkv = qkv.view(b, t, -1, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        if self.unfused:
            o = self.unfused_attention(q, k, v)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, t, -1))

    def unfused_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention as Megatron-LM computed it in 2021 (before flash attention): the s x s scores
        by a batched GEMM with the 1/sqrt(d) scale folded in (baddbmm), causal mask and softmax
        (one fused kernel in Megatron and with `--attention megatron`, two with `unfused`), attention
        dropout, and a second batched GEMM."""
        b, nh, t, hd = q.shape
        q, k, v = (x.reshape(b * nh, t, hd) for x in (q, k, v))
        empty = torch.empty(b * nh, t, t, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(empty, q, k.transpose(1, 2), beta=0.0, alpha=hd**-0.5)
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        if self.fused_softmax:  # one kernel, as Megatron's fused scale-mask-softmax
            probs = torch._masked_softmax(scores, causal.expand_as(scores), -1, 2)
        else:
            probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        probs = F.dropout(probs, self.attention_dropout if self.training else 0.0)
        return torch.bmm(probs, v).view(b, nh, t, hd)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig, tp: TP) -> None:
        super().__init__()
        self.tp = tp
        self.fc1 = ColumnParallelLinear(cfg.hidden, cfg.ffn, tp)
        self.fc2 = RowParallelLinear(cfg.ffn, cfg.hidden, tp, 0.02 / math.sqrt(2 * cfg.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(copy_to_tp(x, self.tp)), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN block; `checkpointed` recomputes its activations in the backward (non-reentrant)."""

    def __init__(self, cfg: GPTConfig, tp: TP) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = Attention(cfg, tp)
        self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = MLP(cfg, tp)
        self.dropout = cfg.dropout
        self.checkpointed = False

    def body(self, x: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        h = x + F.dropout(self.attn(self.ln1(x)), p)
        return h + F.dropout(self.mlp(self.ln2(h)), p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


class GPT(nn.Module):
    """Returns the mean loss; the word embedding is vocab-parallel and doubles as the output head."""

    def __init__(self, cfg: GPTConfig, tp: TP | None = None) -> None:
        super().__init__()
        tp = tp or TP()
        if cfg.vocab % tp.size:
            raise SystemExit(f"tp {tp.size} must divide the vocabulary ({cfg.vocab})")
        self.cfg, self.tp = cfg, tp
        self.wte = nn.Parameter(torch.empty(cfg.vocab // tp.size, cfg.hidden))
        self.wpe = nn.Parameter(torch.empty(cfg.seq, cfg.hidden))
        nn.init.normal_(self.wte, std=0.02)
        nn.init.normal_(self.wpe, std=0.02)
        self.blocks = nn.ModuleList(Block(cfg, tp) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        tp = self.tp
        if tp.size == 1:
            return F.embedding(tokens, self.wte)
        part = self.wte.shape[0]
        start = tp.rank * part
        outside = (tokens < start) | (tokens >= start + part)
        e = F.embedding((tokens - start).masked_fill(outside, 0), self.wte)
        return reduce_from_tp(e.masked_fill(outside.unsqueeze(-1), 0.0), tp)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.embed(tokens) + self.wpe[:t]
        h = F.dropout(h, self.cfg.dropout if self.training else 0.0)
        for block in self.blocks:
            h = block(h)
        h = copy_to_tp(self.ln_f(h), self.tp)
        logits = F.linear(h, self.wte)  # (b, t, V / tp), the tied head
        return vocab_parallel_cross_entropy(logits.float(), targets, self.tp)


def set_recompute(model: GPT, mode: str) -> None:
    for block in model.blocks:
        block.checkpointed = mode == "full"


# --- mixed-precision optimizer (Megatron's fp32 master weights) -----------------------------------


class MasterWeightsAdamW:
    """AdamW on fp32 copies of the bf16 parameters, as Megatron's Float16OptimizerWithFloat16Params:
    cast the gradients to fp32, clip by the global norm (squared norms summed over tp; replicated
    parameters would be counted tp times, a negligible error kept for simplicity), step, copy back."""

    def __init__(self, params: list[nn.Parameter], tp: TP, lr: float, clip: float) -> None:
        self.params = params
        self.masters = [p.detach().float() if p.dtype != torch.float32 else p.detach().clone() for p in params]
        for m in self.masters:
            m.requires_grad_(True)
        self.opt = torch.optim.AdamW(self.masters, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.tp, self.clip = tp, clip

    def step(self) -> None:
        grads = [p.grad.float() for p in self.params]
        if self.clip > 0:
            sq = torch.stack(torch._foreach_norm(grads)).pow(2).sum()
            if self.tp.size > 1:
                dist.all_reduce(sq, group=self.tp.group)
            coef = (self.clip / (sq.sqrt() + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, coef)
        for m, g in zip(self.masters, grads, strict=True):
            m.grad = g
        self.opt.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.masters)


# --- data parallelism ------------------------------------------------------------------------------


class MegatronDP:
    """Megatron-LM's local DDP with a contiguous gradient buffer: gradients accumulate in place in
    views of one flat buffer; `sync()` divides it by dp and all-reduces it once, after the backward."""

    def __init__(self, model: nn.Module, group: dist.ProcessGroup, size: int) -> None:
        self.module, self.group, self.size = model, group, size
        params = [p for p in model.parameters() if p.requires_grad]
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        offset = 0
        for p in params:
            p.grad = self.buffer[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        return self.module(*args)

    def no_sync(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def zero_grad(self) -> None:
        self.buffer.zero_()

    def sync(self) -> None:
        if self.size > 1:
            self.buffer.div_(self.size)
            dist.all_reduce(self.buffer, group=self.group)


class TorchDP:
    """torch's DistributedDataParallel: the all-reduce happens inside the last micro-batch's backward."""

    def __init__(self, model: nn.Module, group: dist.ProcessGroup, bucket_mb: float) -> None:
        self.ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_mb)
        self.module = model

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        return self.ddp(*args)

    def no_sync(self):  # noqa: ANN201
        return self.ddp.no_sync()

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None

    def sync(self) -> None:
        pass


# --- training -----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help=", ".join(CONFIGS))
    p.add_argument("--layers", type=int, default=None, help="override the number of blocks")
    p.add_argument("--seq", type=int, default=None, help="override the sequence length")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (a divisor of the heads)")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per iteration, whole job")
    p.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-batch per dp rank")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--recompute", choices=["none", "full"], default="full")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--dropout", type=float, default=None, help="hidden dropout (default: the config's, 0.1)")
    p.add_argument(
        "--attention",
        choices=["sdpa", "unfused", "megatron"],
        default="sdpa",
        help="sdpa: F.scaled_dot_product_attention (flash); unfused: explicit scores, mask and softmax "
        "(2021's algorithm in eager PyTorch); megatron: the same with the mask and softmax in one fused "
        "kernel (torch._masked_softmax), as Megatron-LM ran it in 2021",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="auto: cuda when available (under phantora: the simulated GPU), else cpu (gloo)",
    )
    p.add_argument("--dp-impl", choices=["megatron", "torch"], default="megatron", help="data parallelism")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="torch DDP bucket size (MB)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    cfg = get_config(args.model, args.layers, args.seq)
    if args.dropout is not None:
        cfg = dataclasses.replace(cfg, dropout=args.dropout)
    cfg = dataclasses.replace(cfg, attention=args.attention)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the world size {world}")
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    dp, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    tp = TP(mesh.get_group("tp"), args.tp, mesh["tp"].get_local_rank())
    if args.global_batch % (dp * args.micro_batch):
        raise SystemExit(
            f"global batch {args.global_batch} is not a multiple of dp {dp} x micro-batch {args.micro_batch}"
        )
    micro_batches = args.global_batch // (dp * args.micro_batch)

    torch.manual_seed(args.seed)  # replicated parameters (position embedding) equal over tp
    with device:  # parameters created on the GPU, as Megatron-LM does (no host copy of the model)
        model = GPT(cfg, tp)
    set_recompute(model, args.recompute)
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    if args.dp_impl == "megatron":
        ddp: MegatronDP | TorchDP = MegatronDP(model, mesh.get_group("dp"), dp)
    else:
        ddp = TorchDP(model, mesh.get_group("dp"), args.bucket_mb)
    opt = MasterWeightsAdamW(list(model.parameters()), tp, args.lr, args.clip)

    flops = megatron_flops(cfg, args.global_batch)
    pr.report_workload(tokens_per_step=args.global_batch * cfg.seq, flops_per_step=flops, dtype=args.dtype)
    if rank == 0:
        print(
            f"model {args.model}: {cfg.layers} layers, hidden {cfg.hidden}, heads {cfg.heads}, "
            f"{param_count(cfg):,} params; tp {args.tp} dp {dp}; global batch {args.global_batch} = "
            f"{micro_batches} micro-batches x {args.micro_batch} x dp {dp} ({args.dp_impl}); "
            f"recompute {args.recompute}, {args.dtype}, attention {args.attention}; "
            f"{flops:.4g} FLOP/iteration (Megatron); phantom {phantom()}",
            flush=True,
        )
    for step in range(args.steps):
        t0 = time.perf_counter()
        ddp.zero_grad()
        total = 0.0
        for mb in range(micro_batches):
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + dp_rank * 101 + mb)
            data = torch.randint(0, cfg.vocab, (args.micro_batch, cfg.seq + 1), generator=g, device="cpu").to(device)
            x, y = data[:, :-1], data[:, 1:]
            last = mb == micro_batches - 1
            if last:
                loss = ddp(x, y) / micro_batches
                loss.backward()
            else:
                with ddp.no_sync():
                    loss = ddp(x, y) / micro_batches
                    loss.backward()
            if not phantom():
                total += loss.item()
        ddp.sync()
        opt.step()
        pr.step()
        if rank == 0:
            value = float("nan") if phantom() else total
            ms = (time.perf_counter() - t0) * 1e3
            print(f"step {step:3d}  loss {value:.4f}  time {ms:.3f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
