"""dist.all_to_all with lists of equal parts runs as all_to_all_single of the same bytes: ProcessGroupNCCL runs both
(alltoall, alltoall_base) as one NCCL group of ncclSend / ncclRecv to every peer, so they take the same time. Before,
the lists went as pairwise transfers, each rated as a lone send/recv (its channels twice an all-to-all's rate, none
shared with its group's other peers): on 8 H100s 1 MiB took 14,982 ns as lists and 18,163 ns as all_to_all_single
(phantora nccl-tests alltoall_perf: 18.163 us). Found by bench/bench_nccl_live_sweep.py. The lists run as one NCCL
group of transfers on the group's communicator (as every all-to-all given its parts: each rank sees only its own,
tests/test_live_mixed_split_all_to_all.py), which an even group rates as the all-to-all (nccl/p2p_group.py)."""

from __future__ import annotations

import json
import textwrap

from phantora.launcher import RunConfig, launch
from phantora.topology import dgx_host

SCRIPT = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n = dist.get_world_size()
    torch.cuda.set_device(dist.get_rank())
    part = 2**18 // 4 // n  # 256 KiB a rank, float32
    dist.all_to_all_single(torch.ones(part * n, device="cuda"), torch.ones(part * n, device="cuda"))
    outs = [torch.zeros(part, device="cuda") for _ in range(n)]
    dist.all_to_all(outs, [torch.full((part,), float(dist.get_rank())) .cuda() for _ in range(n)])
    assert [float(o[0]) for o in outs] == [float(r) for r in range(n)]
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


def test_all_to_all_lists_take_all_to_all_singles_time(tmp_path) -> None:
    script = tmp_path / "a2a.py"
    script.write_text(textwrap.dedent(SCRIPT))
    launch(RunConfig(str(script), topology=dgx_host(4, gpu="h100"), nproc=4, trace="none", timeout_s=90,
                     out_dir=str(tmp_path / "o")))  # fmt: skip
    recs = json.loads((tmp_path / "o" / "cosim.json").read_text())["collectives"]
    spans = {}
    for r in recs:
        lo, hi = spans.get(r["name"], (r["t_start"], r["end_ns"]))
        spans[r["name"]] = (min(lo, r["t_start"]), max(hi, r["end_ns"]))
    (a, b) = [hi - lo for lo, hi in spans.values()]
    assert recs[0]["kind"] == "all_to_all"  # no splits: the collective
    lists = recs[1:]  # one NCCL group of transfers, as any all-to-all given its parts (even ones too)
    assert len(lists) == 12 and {r["kind"] for r in lists} == {"send_recv"}
    assert {tuple(r["comm"]) for r in lists} == {(0, 1, 2, 3)} and len({r["t_start"] for r in lists}) == 1
    assert a == b
