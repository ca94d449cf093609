"""phantom DCP on sub-groups (phantora/runtime/phantom_dcp.py): a rank's own metadata is named by its rank in the
group that saved, not its global rank. tests/scripts/dcp_subgroups.py runs real torch.distributed.checkpoint on gloo
with 4 processes in 2 groups ({0, 2} and {1, 3}) and phantom mode's patches."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "dcp_subgroups.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_each_rank_of_a_sub_group_loads_its_own_part(tmp_path: Path) -> None:
    """Each group saved without a global `.metadata` (DCP's `use_collectives=False`: `__0.metadata` and
    `__1.metadata`, by rank in the group); every rank loads back the tensor it saved (its global rank in each
    element). About 15 s of CPU (4 processes import torch; a minute of wall at load 10). Reading by global rank,
    rank 1 (rank 0 of {1, 3}) took `__1.metadata` (rank 3's), and ranks 2 and 3 found no `__2` / `__3.metadata`
    and left torch to plan alone, so the load hung in the plan exchange of ranks 0 and 1 (gloo's timeout)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), str(_free_port())], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for group in (0, 1):
        names = sorted(p.name for p in (tmp_path / f"group{group}").iterdir())
        assert names == ["__0.metadata", "__0_0.distcp", "__1.metadata", "__1_0.distcp"]
    for rank in range(4):
        loaded = json.loads((tmp_path / f"loaded{rank}.json").read_text())
        assert loaded == {"rank_in_group": rank // 2, "x": [float(rank)] * 4}, rank
