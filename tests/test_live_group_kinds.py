"""Live programs make several groups over the same ranks the way frameworks do (issue 33's audit): a DeviceMesh
(1, 2) (its "tp" dimension is the world's group, its "dp" dimension a group of one), `new_group` twice over the same
ranks, `new_subgroups`, and a gloo group beside them. Async all-reduces on all of them in crossed orders (rank 1
issues in the reverse order), a send on one group against an all-reduce on another in crossed orders, then a
value check: each group's carried int64 values are its own sums, (1 + 2) x 10^k. The recording replays each call
of two ranks to its live end, saved and through Chakra; a group of one takes no time live and moves nothing.

A second program: FSDP2 over a DeviceMesh (2, 1) ("tp" of size one), a metrics group and a `split_group` over the
same two ranks, each all-reducing async across the step (two steps); the metric's sums are (1 + 2) then 3 + 3.

Before: in phantom mode `new_group(backend="gloo")` waited for its peer forever (each phantom rank has a
process-local store), so the run stopped at its timeout; and `phantora replay` of the recording stopped with an
IndexError at the group of one.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from phantora.egraph import replay_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.egraph.format import Coll, load, save
from phantora.egraph.live import record_run
from phantora.launcher import RunConfig
from phantora.netsim.flow import FlowSimulator
from phantora.topology.loader import load_topology

pytestmark = pytest.mark.slow

SCRIPT = """
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("nccl")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    mesh = init_device_mesh("cuda", (1, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    g1, g2 = dist.new_group([0, 1]), dist.new_group([0, 1])
    sub, _ = dist.new_subgroups(group_size=2)
    cpu = dist.new_group([0, 1], backend="gloo")
    groups = {"tp": tp, "g1": g1, "g2": g2, "sub": sub}
    x = {k: torch.ones(n, device="cuda") for k, n in (("tp", 4096), ("g1", 65536), ("g2", 262144), ("sub", 1 << 20))}
    order = list(groups) if me == 0 else list(reversed(groups))
    works = [dist.all_reduce(x[k], group=groups[k], async_op=True) for k in order]
    dist.all_reduce(torch.ones(8, device="cuda"), group=dp)
    for w in works:
        w.wait()
    y = torch.ones(1 << 18, device="cuda")
    if me == 0:
        ws = [dist.isend(y, 1, group=g1), dist.all_reduce(x["g2"], group=g2, async_op=True)]
    else:
        ws = [dist.all_reduce(x["g2"], group=g2, async_op=True), dist.irecv(y, 0, group=g1)]
    for w in ws:
        w.wait()
    dist.all_reduce(torch.ones(4), group=cpu)
    v = {k: torch.full((2,), (1 + me) * 10**i, dtype=torch.int64).cuda() for i, k in enumerate(groups)}
    works = [dist.all_reduce(v[k], group=groups[k], async_op=True) for k in order]
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    print("VALUES", me, dist.get_backend(cpu), [v[k].tolist()[0] for k in groups], flush=True)
    dist.destroy_process_group()
"""


FSDP = """
    import os, torch, torch.distributed as dist, torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    me = int(os.environ["RANK"])
    torch.cuda.set_device(me)
    dist.init_process_group("nccl", device_id=torch.device("cuda", me))  # split_group needs the device
    mesh = init_device_mesh("cuda", (2, 1), mesh_dim_names=("dp", "tp"))
    metrics = dist.new_group([0, 1])
    split = dist.split_group(split_ranks=[[0, 1]])
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).cuda()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cnt = torch.tensor([1 + me], dtype=torch.int64).cuda()
    for step in range(2):
        loss = model(torch.randn(8, 256, device="cuda")).sum()
        w = dist.all_reduce(cnt, group=metrics, async_op=True)
        loss.backward()
        p = dist.all_reduce(torch.ones(1024, device="cuda"), group=split, async_op=True)
        opt.step()
        opt.zero_grad()
        w.wait()
        p.wait()
        print("METRIC", me, step, cnt.tolist()[0], flush=True)
    dist.destroy_process_group()
"""


def _record(d: Path, script: str) -> tuple[Path, Path]:
    path = d / "prog.py"
    path.write_text(textwrap.dedent(script))
    cfg = RunConfig(str(path), topology="testbed16", nproc=2, tensors="phantom", trace="none", timeout_s=120,
                    out_dir=str(d / "o"))  # fmt: skip
    record_run(cfg, d / "g")
    return d / "o", d / "g"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _record(tmp_path_factory.mktemp("kinds"), SCRIPT)


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _record(tmp_path_factory.mktemp("fsdp"), FSDP)


def _logs(out: Path, prefix: str) -> list[str]:
    text = "".join(f.read_text() for f in sorted((out / "logs").iterdir()) if f.name.startswith("rank"))
    return sorted(ln for ln in text.splitlines() if ln.startswith(prefix))


def _live(out: Path) -> dict[str, list[int]]:
    """Each call's (start, end), keyed as the replay tags it: name@ranks (a transfer name@src>dst)."""
    got: dict[str, list[int]] = {}
    for r in json.loads((out / "cosim.json").read_text())["collectives"]:
        sep = ">" if r["kind"] == "send_recv" else "."
        got[r["name"] + "@" + sep.join(str(x) for x in r["group"])] = [r["t_start"], r["end_ns"]]
    return got


def test_every_groups_values_are_its_own(run) -> None:
    assert _logs(run[0], "VALUES") == [f"VALUES {r} gloo [3, 30, 300, 3000]" for r in (0, 1)]


def _replayed(g, topo) -> dict[str, int]:
    ends: dict[str, int] = {}
    for c in replay_graph(g, topo, FlowSimulator(topo)).completions:
        if c.size:
            name = c.tag.split("/")[0]
            ends[name] = max(ends.get(name, 0), c.end_ns)
    return ends


def test_the_recording_replays_every_call_to_its_live_end(run, tmp_path) -> None:
    out, rec = run
    live = _live(out)
    alone = {k: v for k, v in live.items() if "@" in k and "." not in k.split("@")[1] and ">" not in k}
    assert sorted(alone) == ["all_reduce#0@0", "all_reduce#0@1"] and all(a == b for a, b in alone.values())
    graph = load(rec)
    save(graph, tmp_path / "again")
    assert sorted({n.pg for p in graph.programs for n in p.nodes if isinstance(n, Coll)}) == [0, 1, 2, 3, 4]
    topo = load_topology("testbed16")
    export_chakra(graph, tmp_path / "chakra")
    for g in (load(tmp_path / "again"), read_chakra(tmp_path / "chakra")):
        assert _replayed(g, topo) == {k: v[1] for k, v in live.items() if k not in alone}


def test_fsdp2_with_a_metrics_group_and_a_split_group_replays_as_live(fsdp, tmp_path) -> None:
    out, rec = fsdp
    assert _logs(out, "METRIC") == ["METRIC 0 0 3", "METRIC 0 1 6", "METRIC 1 0 3", "METRIC 1 1 6"]
    graph = load(rec)
    assert sorted({n.pg for p in graph.programs for n in p.nodes if isinstance(n, Coll)}) == [0, 1, 2]
    live = _live(out)
    assert len(live) > 8  # FSDP's all-gathers and reduce-scatters, the metric's and the split group's calls
    export_chakra(graph, tmp_path / "chakra")
    topo = load_topology("testbed16")
    for g in (graph, read_chakra(tmp_path / "chakra")):
        assert _replayed(g, topo) == {k: v[1] for k, v in live.items()}
