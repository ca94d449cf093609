"""Phantom mode's group-limited (node-limited) MoE routing: each token's k experts within its chosen groups.

DeepSeek's node-limited routing (Megatron-Core's `group_limited_topk`, torchtitan's
`_get_node_limited_routing_scores`, `n_group` / `topk_group`) takes two top-k: one over G groups of E / G experts
each (a token's `topk_group` groups), then one over all E experts of scores masked to those groups. The scores are
phantom; the group top-k's indices have values (kept_values.balanced: row r's j-th group is (r kg + j) mod G), and
the final top-k takes them as its mask: its j-th choice for a token lies in the token's group j mod kg, and the
c-th choice made in group g (counted over the tokens in order) is that group's expert c mod (E / G). So each token's
k experts lie in min(k, kg) groups, and each expert gets T k / E of T tokens' choices when G divides T kg and kg
divides k. A group top-k is one at a router site whose function is named for groups (`remember`); the final top-k
is the router top-k right after it, if over the same tokens and a multiple of G experts (`take`).
"""

from __future__ import annotations

import torch

_chosen: tuple[torch.Size, int, torch.Tensor] | None = None  # the last group top-k: its rows, G, its indices


def remember(shape: torch.Size, ids: torch.Tensor) -> None:
    """A group top-k of scores of `shape` (groups along the last dimension) chose groups `ids` (rows x kg)."""
    global _chosen
    _chosen = (torch.Size(shape[:-1]), int(shape[-1]), ids)


def take(shape: torch.Size, k: int) -> torch.Tensor | None:
    """The final top-k's indices for scores of `shape` (experts last) if the router top-k just before it was a group
    top-k over the same rows, else None. Either way the group top-k is forgotten: it limits only the next one."""
    global _chosen
    chosen, _chosen = _chosen, None
    if chosen is None or len(shape) == 0:
        return None
    rows, groups, ids = chosen
    experts = int(shape[-1])
    if torch.Size(shape[:-1]) != rows or experts <= groups or experts % groups != 0:
        return None
    if -(-k // ids.shape[-1]) > experts // groups:  # more choices in a group than it has experts
        return None
    return within_groups(ids, experts // groups, k)


def within_groups(groups: torch.Tensor, per_group: int, k: int) -> torch.Tensor:
    """Each row's k experts within its chosen groups (`groups`: rows x kg), balanced over each group's experts:
    choice j of a row is in its group j mod kg; the c-th choice in group g (row-major order) is expert
    g * per_group + c mod per_group. Distinct within a row while ceil(k / kg) <= per_group."""
    kg = groups.shape[-1]
    flat = groups.reshape(-1, kg).to(torch.int64)
    picked = flat[:, torch.arange(k) % kg].reshape(-1)  # the group of each choice, row-major
    order = torch.argsort(picked, stable=True)
    first = torch.searchsorted(picked[order], picked[order], right=False)  # where each group's run starts
    rank = torch.empty_like(picked)
    rank[order] = torch.arange(picked.numel()) - first
    experts = picked * per_group + rank % per_group
    return experts.reshape(*groups.shape[:-1], k)
