"""A small GPT-style decoder and a byte-level corpus, shared by the phantora examples.

The corpus is real text: the source of Python's standard `os` module, read as bytes (vocabulary
256). Each rank draws its own sequences; the draw depends only on (seed, step, rank), so runs are
reproducible.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256


@dataclass
class GPTConfig:
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    seq: int = 64
    vocab: int = VOCAB


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention then a 4x MLP."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def flops_per_token(model: GPT) -> float:
    """Model FLOPs per trained token: 6 N + 12 L d T (weights, plus attention scores)."""
    n = sum(p.numel() for p in model.parameters())
    c = model.cfg
    return 6.0 * n + 12.0 * c.layers * c.d_model * c.seq


def corpus() -> torch.Tensor:
    with open(os.__file__, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()


def batch(
    data: torch.Tensor, seq: int, size: int, *, seed: int, step: int, rank: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` (input, target) sequences for (seed, step, rank), read on the host and moved to `device`
    (the model's; "meta" under phantom mode) as a training loop moves its batches to the GPU."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    starts = torch.randint(0, data.numel() - seq - 1, (size,), generator=g, device="cpu")
    x = torch.stack([data[s : s + seq] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + seq + 1] for s in starts.tolist()])
    return x.to(device), y.to(device)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def common_args(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, help="save each rank's parameters and gradients to SAVE.rank<R>.npz")
    return p


def config(args: argparse.Namespace) -> GPTConfig:
    if args.d_model % args.heads:
        raise SystemExit(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    return GPTConfig(args.layers, args.d_model, args.heads, args.seq)


def save_state(prefix: str, rank: int, named: dict[str, torch.Tensor]) -> None:
    """Arrays in a .npz (no pickle), for comparing runs."""
    import numpy as np

    arrays = {k: v.detach().to(torch.float32).numpy() for k, v in named.items()}
    np.savez(f"{prefix}.rank{rank}.npz", **arrays)


def log_step(rank: int, step: int, loss: float, seconds: float) -> None:
    if rank == 0:
        print(f"step {step:3d}  loss {loss:.4f}  time {seconds * 1e3:.3f} ms", flush=True)
