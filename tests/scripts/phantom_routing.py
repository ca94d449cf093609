"""Rank script for tests/test_phantom_routing.py: an MoE router's index work on phantom scores (one phantom rank).

T tokens, E experts, top-k. It runs the op sequences of torchtitan's router and all-to-all dispatcher
(topk, a bool one-hot by scatter_, the counts by sum, argsort, cumsum, repeat_interleave) and of Megatron-Core's
(topk, `zeros_like(logits).int().scatter(...).bool()`, the local map's counts, `masked_select` of the phantom
probabilities), plus the factories, and writes what it read (argv[1], JSON). Then phantom data mixed in place into a
tensor with values: its reading must fail (no stale value).
"""

import json
import sys

import torch

from phantora.runtime.phantom_mode import PhantomValueError

T, E, K = 48, 8, 2


def run() -> dict:
    hidden = torch.randn(T, 16, device="cuda")
    gate = torch.randn(16, E, device="cuda")
    scores = torch.sigmoid(hidden @ gate)  # phantom: the model's activations
    seen: dict = {"scores_phantom": scores.elem.is_meta}
    # torchtitan (models/common/moe.py, token_dispatcher.py)
    _, ids = torch.topk(scores, k=K, dim=-1, sorted=False)
    top_scores = scores.gather(dim=-1, index=ids)
    routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, ids, True)
    counts = routing_map.sum(dim=0)
    order = torch.argsort(ids.view(-1), stable=True)
    starts = counts.cumsum(0) - counts
    seg = torch.arange(E, device="cuda").repeat_interleave(counts, output_size=T * K)
    seen["titan"] = {
        "ids": ids.tolist(),
        "counts": counts.tolist(),
        "top_scores_phantom": top_scores.elem.is_meta,
        "order_first": order[:4].tolist(),
        "starts": starts.tolist(),
        "seg_len": seg.shape[0],
        "split_cpu": counts.view(2, -1).sum(dim=1).to(torch.device("cpu")).tolist(),
    }
    # Megatron-Core (moe_utils.topk_routing_with_score_function, token_dispatcher.py)
    logits = hidden @ gate
    top_logits, top_indices = torch.topk(logits, k=K, dim=1)
    probs = torch.softmax(top_logits, dim=-1)
    routing_probs = torch.zeros_like(logits).scatter(1, top_indices, probs)
    mega_map = torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()
    local_map = mega_map[:, 0:2].contiguous()
    tokens_per_expert = local_map.sum(dim=0).long().cpu()
    local_probs = routing_probs[:, 0:2].contiguous().T.contiguous().masked_select(local_map.T.contiguous())
    seen["megatron"] = {
        "tokens_per_expert": tokens_per_expert.tolist(),
        "num_out_tokens": tokens_per_expert.sum().item(),
        "local_probs_shape": list(local_probs.shape),
        "local_probs_phantom": local_probs.elem.is_meta,
    }
    filled = torch.zeros_like(logits)
    filled.add_(logits)  # written to: no longer a known fill
    seen["written_fill_cast_phantom"] = filled.int().elem.is_meta
    seen["factories"] = {
        "zeros": torch.zeros(3, dtype=torch.int64, device="cuda").tolist(),
        "full": torch.full((2,), 7, device="cuda").tolist(),
        "arange": torch.arange(2, 9, 3, device="cuda").tolist(),
        "ones_like": torch.ones_like(scores, dtype=torch.int32)[0].tolist(),
        "new_full": scores.new_full((2,), 5, dtype=torch.int64).tolist(),
        "float_zeros_phantom": torch.zeros(3, device="cuda").elem.is_meta,
    }
    stale = torch.zeros(E, dtype=torch.int64, device="cuda")
    stale.add_((scores > 0.5).sum(dim=0))  # phantom counts (a comparison of phantom scores) into values
    try:
        seen["stale"] = stale.tolist()
    except PhantomValueError:
        seen["stale"] = "PhantomValueError"
    return seen


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(run(), f)
