"""A workload's all_to_all with `splits`, co-simulated through the bridge (one replay_rank process a rank), runs as
one NCCL group on the coordinator too: its transfers name the group's communicator and one launch a rank
(`client.p2p_group`), so the coordinator's P2pBatches hands each the others in flight and each pair ends when the
in-process replay's does (which rates them with the closed forms of tests/test_p2p_group.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bridge.run import CosimRun
from phantora.netsim.flow import FlowSimulator
from phantora.replay import replay_inprocess
from phantora.topology import dgx_host
from phantora.workload import load_workload

KiB, MiB = 1 << 10, 1 << 20


def test_a_skewed_split_all_to_all_runs_as_in_process(tmp_path: Path) -> None:
    topo = dgx_host(8, gpu="h100")
    splits = [[0 if i == j else 16 * MiB if (i, j) == (0, 1) else 64 * KiB * (1 + (i + j) % 3) for j in range(8)]
              for i in range(8)]  # fmt: skip
    path = tmp_path / "wl.json"
    path.write_text(json.dumps({"op": [{"name": "d", "kind": "all_to_all", "ranks": "all", "splits": splits}]}))
    wl = load_workload(path, world=8)
    ref = {op.name: (op.start_ns, op.end_ns) for op in replay_inprocess(wl, topo, FlowSimulator(topo)).ops}
    cmd = [sys.executable, "-m", "phantora.egraph.replay_rank", str(path)]
    res = CosimRun(topo, rank_cmd=cmd, timeout_s=120).run()
    got = {r["name"]: (r["t_start"], r["end_ns"]) for r in res.collectives}
    assert len(got) == 56 and got == ref
    assert {tuple(r["comm"]) for r in res.collectives} == {tuple(range(8))}
