"""Each rank gets torchrun's worker environment: its node's rank (GROUP_RANK), the role's, torchelastic's variables.

PyTorch Lightning's Trainer under `phantora run --nproc 16` on testbed16 (`devices=8, num_nodes=2`) placed every
rank of the second host on node 0 (no GROUP_RANK: rank 8 took rank 0's place and its store's port, EADDRINUSE).
torchrun's agent numbers its nodes and sets GROUP_RANK = RANK // LOCAL_WORLD_SIZE for nodes of equal size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bridge.run import CosimRun, _local_ranks
from bridge.torchrun_env import node_ranks
from phantora.topology.generators import leaf_spine

RANK_SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
from bridge.client import RankClient

keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE"]
c = RankClient.from_env()
env = {k: os.environ.get(k) for k in keys}
env["launched"] = dist.is_torchelastic_launched()
c.finish(0, {"env": json.dumps(env)})
c.close()
"""


def test_node_ranks_number_hosts_in_rank_order() -> None:
    """Two hosts of 8 ranks: nodes 0 and 1 of 2; no host known: one node."""
    assert node_ranks(["h0"] * 8 + ["h1"] * 8) == [(r // 8, 2) for r in range(16)]
    assert node_ranks(["b", "b", "a", "a"]) == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert node_ranks([None, None]) == [(0, 1), (0, 1)]


def test_local_ranks_count_within_each_host() -> None:
    """LOCAL_RANK counts a host's ranks in rank order, LOCAL_WORLD_SIZE is its rank count; hosts may interleave;
    a rank with no host known makes the job one host."""
    assert _local_ranks(["h0"] * 4 + ["h1"] * 4) == [(r % 4, 4) for r in range(8)]
    assert _local_ranks(["a", "b", "a", "a"]) == [(0, 3), (0, 1), (1, 3), (2, 3)]
    assert _local_ranks(["a", None, "b"]) == [(0, 3), (1, 3), (2, 3)]


def test_ranks_on_two_hosts_get_torchruns_variables(tmp_path: Path) -> None:
    """4 ranks on 2 hosts of 2 GPUs: GROUP_RANK = RANK // 2, LOCAL_RANK = RANK % 2, and torch sees torchrun."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    topo = leaf_spine(2, 2, 1, gpus_per_host=2)
    res = CosimRun(topo, rank_cmd=[sys.executable, str(script)], world_size=4, timeout_s=120).run()
    for r in range(4):
        env = json.loads(res.ranks[r]["env"])
        assert env == {
            "RANK": str(r),
            "LOCAL_RANK": str(r % 2),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(r // 2),
            "GROUP_WORLD_SIZE": "2",
            "ROLE_RANK": str(r),
            "ROLE_WORLD_SIZE": "4",
            "ROLE_NAME": "default",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "launched": True,
        }, r
