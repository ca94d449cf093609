"""The rest of torchrun's worker environment: the node's rank, the role's, and torchelastic's run variables.

torchrun's agent gives each worker, besides RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT: GROUP_RANK (its node's rank among the job's nodes), GROUP_WORLD_SIZE (the nodes), ROLE_RANK,
ROLE_WORLD_SIZE and ROLE_NAME (one role, "default": the global rank and world), TORCHELASTIC_RESTART_COUNT and
TORCHELASTIC_MAX_RESTARTS (0, 0), TORCHELASTIC_RUN_ID (the rendezvous id, "none" by default) and
TORCHELASTIC_USE_AGENT_STORE (torch 2.13, `local_elastic_agent.py`). Programs read them: PyTorch Lightning
takes a process's node from GROUP_RANK and knows torchrun by TORCHELASTIC_RUN_ID
(`dist.is_torchelastic_launched()`); without them every rank of the second host called itself node 0, so rank 8
of a 2 x 8 run took rank 0's place and its store's port. The agent's store stays off ("False"): the ranks meet
at MASTER_ADDR / MASTER_PORT as before.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def node_ranks(hosts: Sequence[Hashable]) -> list[tuple[int, int]]:
    """(GROUP_RANK, GROUP_WORLD_SIZE) of each rank, its host given: nodes numbered in the order their first
    rank appears, as torchrun's nodes hold consecutive ranks (a rank with no host known: node 0 of 1)."""
    if any(h is None for h in hosts):
        return [(0, 1)] * len(hosts)
    order: dict[Hashable, int] = {}
    for h in hosts:
        order.setdefault(h, len(order))
    return [(order[h], len(order)) for h in hosts]


def worker_env(rank: int, world: int, node: tuple[int, int]) -> dict[str, str]:
    """The variables torchrun adds for worker `rank` of `world` on node `node` (GROUP_RANK, GROUP_WORLD_SIZE)."""
    return {
        "GROUP_RANK": str(node[0]),
        "GROUP_WORLD_SIZE": str(node[1]),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
