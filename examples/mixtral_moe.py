"""Mixtral-style mixture-of-experts decoder layers with expert parallelism (all-to-all).

    phantora run --topology testbed16 --nproc 4 examples/mixtral_moe.py --model tiny --routing topk
    phantora run --phantom --topology testbed16 --nproc 8 examples/mixtral_moe.py --model mixtral-8x7b --layers 2
    phantora run --phantom --topology rail256 --dedup 32 examples/mixtral_moe.py --model mixtral-8x7b \
        --ep 8 --ep-layout strided
    torchrun --nproc_per_node 4 examples/mixtral_moe.py --model tiny --routing topk   # the same on gloo

Each layer: RMSNorm -> grouped-query attention (as in llama_model) -> residual; RMSNorm -> MoE ->
residual. The MoE has a linear router over E experts, top-k routing (k = 2) and SwiGLU experts.
Expert parallelism: the E experts are spread over the ranks of an EP group of --ep ranks (default:
the world; --ep must divide the world and E must be a multiple of it). The world holds world / ep
replicas of the experts; the ranks holding the same experts (one per EP group) form an expert
data-parallel group that sums their gradients with one flat all-reduce per step. --ep-layout block
puts consecutive ranks in an EP group (within a host when ep <= GPUs per host: the all-to-all stays
on NVLink); strided takes one rank every world / ep (one GPU of the same local index per host on a
rail-optimised fabric: the all-to-all crosses the network, as when TP fills a host and EP spans
hosts; rank deduplication then needs world / ep live ranks, --dedup 32 on rail256). Every rank also
holds a replica of the attention, norms and router (data parallel over all ranks; their gradients are
averaged by one flat all-reduce per step).

Per layer and step, the forward sends each token to the ranks of its experts with
`dist.all_to_all_single` (uneven splits) and brings the expert outputs back with a second one; the
backward does the same in reverse, so a step issues 4 all-to-alls per layer (5 with --routing
topk, whose forward first exchanges the per-expert token counts).

--routing uniform: assignment a = t * k + j of token t goes to expert a mod E, so tokens are spread
evenly over experts and every split is known without looking at a tensor value. The router still
runs and weights the two outputs. This is the only mode that works in phantom mode, where tensors
have no values. --routing topk: the real router's top-k choice (real mode only).

Experts are seeded by their global index, so the model does not depend on how many ranks hold it.
The input and the target are random hidden states (seeded by (seed, step, rank)), the loss the
mean squared error: the point is the layer's compute and communication, not a language model.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from llama_model import Attention, FeedForward, LlamaConfig, RMSNorm, rope_tables
from torch import nn

import phantora.runtime as pr

phantom = pr.phantom


@dataclass(frozen=True)
class MoEConfig:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int  # hidden size of one SwiGLU expert
    experts: int
    top_k: int = 2
    rope_theta: float = 1e6
    norm_eps: float = 1e-5

    def attention_config(self) -> LlamaConfig:
        return LlamaConfig(
            self.dim, self.layers, self.heads, self.kv_heads, self.ffn, 0, self.rope_theta, self.norm_eps
        )


CONFIGS: dict[str, MoEConfig] = {
    "mixtral-8x7b": MoEConfig(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, experts=8),
    "mixtral-8x22b": MoEConfig(dim=6144, layers=56, heads=48, kv_heads=8, ffn=16384, experts=8),
    "tiny": MoEConfig(dim=64, layers=2, heads=4, kv_heads=2, ffn=128, experts=4, rope_theta=10000.0),
}


def get_config(name: str, layers: int | None = None) -> MoEConfig:
    if name not in CONFIGS:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(CONFIGS)}")
    cfg = CONFIGS[name]
    return cfg if layers is None else dataclasses.replace(cfg, layers=layers)


def active_params_per_token(cfg: MoEConfig) -> int:
    """Parameters one token goes through: attention, norms, router and k of the E experts per layer,
    and the final norm."""
    d, hd = cfg.dim, cfg.dim // cfg.heads
    attn = 2 * d * cfg.heads * hd + 2 * d * cfg.kv_heads * hd
    return cfg.layers * (attn + 2 * d + d * cfg.experts + cfg.top_k * 3 * d * cfg.ffn) + d


def flops_per_token(cfg: MoEConfig, seq: int) -> float:
    """6 N_active + 12 L d T (the PaLM convention of llama_model.flops_per_token, active params only)."""
    return 6.0 * active_params_per_token(cfg) + 12.0 * cfg.layers * cfg.dim * seq


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class MoE(nn.Module):
    """Router + the local experts of this rank; tokens travel to their experts' ranks and back."""

    def __init__(
        self, cfg: MoEConfig, layer: int, routing: str, ep_rank: int, ep_size: int, seed: int, group: Any = None
    ) -> None:
        super().__init__()
        if cfg.experts % ep_size:
            raise SystemExit(f"{cfg.experts} experts do not divide over {ep_size} EP ranks: pick an --ep dividing both")
        self.cfg, self.routing, self.group = cfg, routing, group
        self.ep_rank, self.ep_size, self.local = ep_rank, ep_size, cfg.experts // ep_size
        self.gate = nn.Linear(cfg.dim, cfg.experts, bias=False)
        experts = []
        with torch.random.fork_rng(devices=[]):  # leaves the shared modules' RNG stream alone
            for e in range(ep_rank * self.local, (ep_rank + 1) * self.local):
                torch.manual_seed(seed * 1_000_003 + layer * 1009 + e)
                experts.append(FeedForward(cfg.dim, cfg.ffn))
        self.experts = nn.ModuleList(experts)
        for p in self.experts.parameters():
            p.expert = True  # not averaged over ranks: each rank owns its experts

    def _route(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[int] | None]:
        """(expert index per token and slot (T, k), per-expert counts if known statically)."""
        n, k, e = logits.shape[0], self.cfg.top_k, self.cfg.experts
        if self.routing == "uniform":
            idx = (torch.arange(n * k) % e).view(n, k)
            base, extra = divmod(n * k, e)
            return idx, [base + (1 if x < extra else 0) for x in range(e)]
        return logits.topk(k, dim=-1).indices, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, k, ep, local = x.shape, self.cfg.top_k, self.ep_size, self.local
        h = x.reshape(-1, shape[-1])
        logits = self.gate(h)
        idx, counts = self._route(logits)
        weights = logits.float().softmax(-1).gather(-1, idx)
        weights = (weights / weights.sum(-1, keepdim=True)).type_as(h)
        flat = idx.flatten()
        order = flat.argsort(stable=True)  # assignments grouped by expert, hence by rank
        send = h[order // k]
        if counts is None:  # real routing: counts from the router's choice, then ask the peers for theirs
            mine = torch.bincount(flat, minlength=self.cfg.experts)
            theirs = torch.empty_like(mine)
            if ep > 1:
                dist.all_to_all_single(theirs, mine, group=self.group)
            else:
                theirs = mine
            counts, recv_counts = mine.tolist(), theirs.tolist()
        else:  # uniform routing: every rank routes the same number of tokens the same way
            recv_counts = [counts[self.ep_rank * local + j] for _ in range(ep) for j in range(local)]
        send_splits = [sum(counts[r * local : (r + 1) * local]) for r in range(ep)]
        recv_splits = [sum(recv_counts[r * local : (r + 1) * local]) for r in range(ep)]
        recv = AllToAll.apply(send, recv_splits, send_splits, self.group) if ep > 1 else send
        # recv is grouped by source rank, then by local expert: regroup by expert to run each once
        chunks = recv.split(recv_counts)
        outs: list[torch.Tensor | None] = [None] * len(chunks)
        for j, expert in enumerate(self.experts):
            sizes = [recv_counts[r * local + j] for r in range(ep)]
            y = expert(torch.cat([chunks[r * local + j] for r in range(ep)]))
            for r, part in enumerate(y.split(sizes)):
                outs[r * local + j] = part
        back = torch.cat(outs)
        back = AllToAll.apply(back, send_splits, recv_splits, self.group) if ep > 1 else back
        y = back[order.argsort()]  # back to (token, slot) order
        return (y.view(-1, k, shape[-1]) * weights.unsqueeze(-1)).sum(1).view(shape)


class MoELayer(nn.Module):
    def __init__(
        self, cfg: MoEConfig, layer: int, routing: str, ep_rank: int, ep_size: int, seed: int, group: Any = None
    ) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg.attention_config())
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.moe = MoE(cfg, layer, routing, ep_rank, ep_size, seed, group)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.moe(self.ffn_norm(h))


class MoEModel(nn.Module):
    def __init__(
        self,
        cfg: MoEConfig,
        seq: int,
        routing: str,
        ep_rank: int = 0,
        ep_size: int = 1,
        seed: int = 0,
        group: Any = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MoELayer(cfg, i, routing, ep_rank, ep_size, seed, group) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        cos, sin = rope_tables(cfg.attention_config(), seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        for layer in self.layers:
            x = layer(x, self.rope_cos[:t], self.rope_sin[:t])
        return self.norm(x)


def batch(
    cfg: MoEConfig, size: int, seq: int, seed: int, step: int, rank: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input hidden states, regression target), both (size, seq, dim), for (seed, step, rank)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x, target = torch.randn(2, size, seq, cfg.dim, generator=g).to(dtype)
    return x, target


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out.float() - target.float()).pow(2).mean()


@dataclass(frozen=True)
class ExpertGroups:
    """This rank's place in expert parallelism: its EP group (the ranks that split the experts), its
    index there, and its expert data-parallel group (the ranks holding the same experts)."""

    ep_ranks: list[int]
    ep_rank: int
    edp_ranks: list[int]


def expert_groups(rank: int, world: int, ep: int, layout: str) -> ExpertGroups:
    """The EP and expert data-parallel groups of `rank` (layout "block": consecutive ranks per EP group;
    "strided": one rank every world // ep)."""
    if ep < 1 or world % ep:
        raise SystemExit(f"--ep {ep} does not divide the world of {world} ranks")
    replicas = world // ep
    if layout == "block":
        g, i = divmod(rank, ep)
        return ExpertGroups([g * ep + j for j in range(ep)], i, [h * ep + i for h in range(replicas)])
    if layout == "strided":
        i, g = divmod(rank, replicas)
        return ExpertGroups([j * replicas + g for j in range(ep)], i, [i * replicas + h for h in range(replicas)])
    raise SystemExit(f"unknown --ep-layout {layout!r}; choose block or strided")


def new_groups(world: int, ep: int, layout: str, rank: int) -> tuple[Any, Any]:
    """(EP group, expert data-parallel group) of `rank` as process groups; every rank creates every
    group in the same order, as torch.distributed requires. None for a group of the whole world / one rank."""
    if ep == world:
        return None, None
    ep_group = edp_group = None
    for kind in ("ep", "edp"):
        seen: set[tuple[int, ...]] = set()
        for r in range(world):
            g = expert_groups(r, world, ep, layout)
            ranks = tuple(g.ep_ranks if kind == "ep" else g.edp_ranks)
            if ranks in seen or len(ranks) == 1:
                continue
            seen.add(ranks)
            pg = dist.new_group(list(ranks))
            if rank in ranks:
                ep_group, edp_group = (pg, edp_group) if kind == "ep" else (ep_group, pg)
    return ep_group, edp_group


def sync_grads(model: nn.Module, world: int, edp_group: Any = None) -> None:
    """Average the replicated parameters' gradients (one flat all-reduce); sum the experts' over their
    expert data-parallel group (one flat all-reduce, if there are replicas) and scale them so the update
    is that of the mean loss over ranks (each sums over its EP group's tokens)."""
    shared = [p.grad for p in model.parameters() if p.grad is not None and not getattr(p, "expert", False)]
    flat_all_reduce(shared, dist.ReduceOp.AVG, None)
    experts = [p.grad for p in model.parameters() if p.grad is not None and getattr(p, "expert", False)]
    if edp_group is not None:
        flat_all_reduce(experts, dist.ReduceOp.SUM, edp_group)
    for g in experts:
        g.div_(world)


def flat_all_reduce(grads: list[torch.Tensor], op: Any, group: Any) -> None:
    """All-reduce `grads` as one flat tensor over `group` and write the result back."""
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat, op=op, group=group)
    for g, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(piece.view_as(g))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help=", ".join(CONFIGS))
    p.add_argument("--layers", type=int, default=None, help="override the number of layers")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--routing", choices=["uniform", "topk"], default="uniform")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="bf16: the whole model in bf16")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ep", type=int, default=None, help="expert-parallel degree (default: the world)")
    p.add_argument("--ep-layout", choices=["block", "strided"], default="block", help="ranks of an EP group")
    args = p.parse_args()
    if args.routing == "topk" and phantom():
        raise SystemExit("--routing topk needs tensor values; phantom mode has none: use --routing uniform")
    cfg = get_config(args.model, args.layers)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    ep = world if args.ep is None else args.ep
    place = expert_groups(rank, world, ep, args.ep_layout)
    ep_group, edp_group = new_groups(world, ep, args.ep_layout, rank)
    torch.manual_seed(args.seed)
    model = MoEModel(cfg, args.seq, args.routing, place.ep_rank, ep, args.seed, ep_group).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    tokens = args.batch * args.seq * world
    flops = flops_per_token(cfg, args.seq) * tokens
    pr.report_workload(tokens_per_step=tokens, flops_per_step=flops, dtype=None if args.dtype == "fp32" else "bf16")
    if rank == 0:
        print(
            f"model {args.model}: {cfg.layers} layers, {cfg.experts} experts top-{cfg.top_k}, {ep} EP ranks "
            f"({cfg.experts // ep} experts each, {world // ep} replicas, {args.ep_layout}), routing {args.routing}, "
            f"{args.dtype}, phantom {phantom()}",
            flush=True,
        )
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, target = batch(cfg, args.batch, args.seq, args.seed, step, rank, dtype)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), target)
        loss.backward()
        sync_grads(model, world, edp_group)
        opt.step()
        pr.step()
        if rank == 0:
            value = float("nan") if phantom() else loss.item()
            print(f"step {step:3d}  loss {value:.6f}  time {(time.perf_counter() - t0) * 1e3:.3f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
