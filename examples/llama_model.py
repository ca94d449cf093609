"""A Llama-3-style decoder for the phantora examples, with named configurations.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention through
`F.scaled_dot_product_attention(is_causal=True)`, a SwiGLU MLP and an untied output head.
Module names follow Meta's reference code (`attention.wq`, `feed_forward.w1`, ...), so tensor-
parallel plans written for it apply unchanged.

Every tensor is created on the default device (no `device=` argument anywhere), so the same code
builds real CPU tensors in real mode and meta tensors in phantora's phantom mode, where the rank
runs with `torch.set_default_device("meta")`.

    from llama_model import CONFIGS, Transformer, param_count, flops_per_token
    cfg = get_config("llama3-8b", layers=2)   # 8B shapes, 2 blocks
    param_count(cfg)                          # exact, from the config alone
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int  # hidden size of the SwiGLU MLP
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


CONFIGS: dict[str, LlamaConfig] = {
    # Llama 3 / 3.1 shapes (Meta's params.json); ffn is the rounded SwiGLU hidden size.
    "llama3-8b": LlamaConfig(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256),
    "llama3-70b": LlamaConfig(dim=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=128256),
    "llama3-405b": LlamaConfig(dim=16384, layers=126, heads=128, kv_heads=8, ffn=53248, vocab=128256),
    # test sizes: real mode on a CPU in seconds
    "tiny": LlamaConfig(dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512, rope_theta=10000.0),
    "small": LlamaConfig(dim=256, layers=4, heads=8, kv_heads=4, ffn=688, vocab=4096, rope_theta=10000.0),
}


def get_config(name: str, layers: int | None = None) -> LlamaConfig:
    """A named configuration, optionally with another number of blocks (same shapes otherwise)."""
    if name not in CONFIGS:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(CONFIGS)}")
    cfg = CONFIGS[name]
    if layers is not None:
        if layers < 1:
            raise SystemExit(f"--layers must be >= 1, got {layers}")
        cfg = dataclasses.replace(cfg, layers=layers)
    if cfg.dim % cfg.heads or cfg.heads % cfg.kv_heads:
        raise SystemExit(f"dim {cfg.dim}, heads {cfg.heads}, kv_heads {cfg.kv_heads} do not divide")
    return cfg


def param_count(cfg: LlamaConfig) -> int:
    """Exact number of parameters of `Transformer(cfg)`, computed from the config alone."""
    d, hd = cfg.dim, cfg.head_dim
    attn = d * cfg.heads * hd + 2 * d * cfg.kv_heads * hd + cfg.heads * hd * d  # wq, wk, wv, wo
    mlp = 3 * d * cfg.ffn  # w1, w2, w3
    block = attn + mlp + 2 * d  # + attention_norm, ffn_norm
    return 2 * cfg.vocab * d + d + cfg.layers * block  # embeddings, output head, final norm


def flops_per_token(cfg: LlamaConfig, seq: int) -> float:
    """Model FLOPs to train on one token (forward + backward), the numerator of MFU.

    Convention (PaLM, Chowdhery et al. 2022, appendix B): 6 N + 12 L d T, where N counts every
    parameter except the token-embedding table (a lookup, not a matmul; the output head is a
    matmul and counts), L is the number of blocks, d = heads * head_dim and T the sequence
    length. The attention term is for the full T x T score matrix: no discount for causality.
    """
    n = param_count(cfg) - cfg.vocab * cfg.dim
    return 6.0 * n + 12.0 * cfg.layers * cfg.heads * cfg.head_dim * seq


def rope_tables(cfg: LlamaConfig, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, (seq, head_dim), for the rotate-half form of RoPE."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, seq, head_dim)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


class Attention(nn.Module):
    """Grouped-query attention. The head counts come from the projections' output widths, so the
    module also works when tensor parallelism has split wq/wk/wv column-wise (heads over ranks)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q = self.wq(x).view(b, t, -1, hd).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, hd).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = q.shape[1] // k.shape[1]
        if rep > 1:  # each KV head serves `rep` consecutive query heads
            kv_heads = k.shape[1]
            k = k[:, :, None].expand(b, kv_heads, rep, t, hd).reshape(b, kv_heads * rep, t, hd)
            v = v[:, :, None].expand(b, kv_heads, rep, t, hd).reshape(b, kv_heads * rep, t, hd)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block. With `checkpointed = True` its activations are recomputed in the backward
    pass (torch.utils.checkpoint, non-reentrant). The checkpoint wraps the body, not the module
    call, so the hooks FSDP2 puts on the module run once per forward and are not replayed."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn)
        self.checkpointed = False

    def body(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpointed == "op" and torch.is_grad_enabled():
            return checkpoint(self.body, x, cos, sin, use_reentrant=False, context_fn=op_level_contexts)
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self.body, x, cos, sin, use_reentrant=False)
        return self.body(x, cos, sin)


# Op-level selective checkpointing (torchtitan's `selective_ac_option = "op"`): inside every block,
# keep the outputs of the expensive ops (matmuls, attention, max, tensor-parallel reduce-scatters)
# except every second matmul, and recompute the rest (norms, activations, elementwise) in backward.
def _expensive(op: object) -> bool:
    name = str(op)
    return name in ("aten.mm.default", "aten.max.default", "_c10d_functional.reduce_scatter_tensor.default") or (
        name.startswith("aten._scaled_dot_product_") and "backward" not in name
    )


def op_level_contexts() -> tuple[object, object]:
    """Fresh contexts for one checkpointed call: matmuls are counted separately in the forward and the recompute."""
    matmuls = {False: 0, True: 0}

    def policy(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        recompute = bool(getattr(ctx, "is_recompute", False))
        if str(op) == "aten.mm.default":
            matmuls[recompute] += 1
            if matmuls[recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if _expensive(op) else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Transformer(nn.Module):
    def __init__(self, cfg: LlamaConfig, seq: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg, seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def set_activation_checkpointing(model: Transformer, mode: str) -> list[int]:
    """none; full: every block; selective: every other block (0, 2, 4, ...); op: every block, op-level
    selective (`op_level_contexts`). Returns the indices of the checkpointed blocks."""
    if mode not in ("none", "full", "selective", "op"):
        raise SystemExit(f"unknown activation checkpointing mode {mode!r}")
    chosen = []
    for i, layer in enumerate(model.layers):
        layer.checkpointed = "op" if mode == "op" else mode == "full" or (mode == "selective" and i % 2 == 0)
        if layer.checkpointed:
            chosen.append(i)
    return chosen


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
