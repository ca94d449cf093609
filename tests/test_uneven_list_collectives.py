"""A list all-gather or reduce-scatter whose parts differ in shape runs as ProcessGroupNCCL runs it (its `allgather` and
`reduce_scatter` when `check_same_size` fails): one NCCL group of out-of-place broadcasts (root i sends its input into
every member's part i) or reductions (every member's part i into root i's output).

Megatron-Core's alltoall token dispatcher with tensor parallelism gathers each TP rank's tokens, whose counts differ,
with `dist.all_gather(list_of_unequal_parts, ...)` (`_gather_along_first_dim` with `output_split_sizes`), and its
backward reduce-scatters them (`_reduce_scatter_along_first_dim`). Before, real mode handed the list to gloo, which
refuses unequal parts ("ProcessGroupGloo::allgather: invalid tensor size at index 0"), so the run stopped there
(docs/runtime.md, user trials). Values are checked against what the call means; the time against the closed form of
one NCCL aggregate of the group's broadcasts (NCCL bins a group's calls by function, reduction and type, not root:
tests/test_nccl_coll_group_mixed_live.py).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.collectives import Collective
from phantora.collectives.options import resolve
from tests.test_nccl_symmetric import H100, opts

ROWS, COLS = (1, 3), 65536  # rank r's part: ROWS[r] rows of 256 KiB of fp32

SCRIPT = f"""
    import json, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    rows, cols = {ROWS}, {COLS}
    mine = torch.full((rows[me], cols), float(me + 1), device="cuda")
    parts = [torch.empty(r, cols, device="cuda") for r in rows]
    dist.all_gather(parts, mine)  # the first call connects; the timed one follows
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dist.all_gather(parts, mine)
    end.record()
    torch.cuda.synchronize()
    gathered = [p.sum().item() / p.numel() for p in parts]
    ins = [torch.full((r, cols), float(10 * (me + 1) + i), device="cuda") for i, r in enumerate(rows)]
    out = torch.empty(rows[me], cols, device="cuda")
    dist.reduce_scatter(out, ins)
    avg = torch.empty(rows[me], cols, device="cuda")
    dist.reduce_scatter(avg, ins, op=dist.ReduceOp.AVG)
    kept = [x.sum().item() / x.numel() for x in ins]
    found = [start.elapsed_time(end) * 1000, gathered, out.mean().item(), avg.mean().item(), kept]
    print("RESULT", me, json.dumps(found), flush=True)
    dist.destroy_process_group()
"""


def test_unequal_parts_gather_and_reduce_scatter_as_nccl_groups(tmp_path) -> None:
    from phantora.egraph.format import Coll
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig

    script = tmp_path / "uneven.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cfg = RunConfig(str(script), topology=H100, nproc=2, trace="none", timeout_s=300, out_dir=tmp_path / "run")
    rep, graph = record_run(cfg, tmp_path / "graph")
    lines = [ln for r in range(2) for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 2, rep.logs
    sizes = tuple(r * COLS * 4 for r in ROWS)
    total = resolve(Collective("broadcast", (0, 1), sum(sizes), "fp32", root=0), H100, opts())[1]
    assert total is not None
    expected_us = total.lat_us + sum(sizes) / total.algbw / 1000  # one aggregate of both roots' parts
    for line in lines:
        _, rank, found = line.split(maxsplit=2)
        us, gathered, summed, averaged, kept = json.loads(found)
        me = int(rank)
        assert gathered == [1.0, 2.0]  # each member's input, in its part
        assert summed == 10 * 1 + me + 10 * 2 + me  # part `me` of both members, summed on member `me`
        assert averaged == pytest.approx(summed / 2)
        assert kept == [10.0 * (me + 1), 10.0 * (me + 1) + 1]  # an out-of-place reduction leaves its inputs
        assert float(us) == pytest.approx(expected_us, rel=0.005)
    colls = [n for n in graph.programs[0].nodes if isinstance(n, Coll)]
    gathers = [n for n in colls if n.kind == "broadcast"]
    assert len(gathers) == 2 and all(n.group_sizes == sizes and n.group_roots == (0, 1) for n in gathers)
    reductions = [n for n in colls if n.kind == "reduce"]
    assert len(reductions) == 2 and all(n.group_sizes == sizes and n.group_roots == (0, 1) for n in reductions)
