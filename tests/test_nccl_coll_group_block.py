"""Collectives torch issues one by one in a `_coalescing_manager(group, device=...)` block (broadcasts, reductions,
list all-gathers and reduce-scatters), which ProcessGroupNCCL enqueues inside its NCCL group: one NCCL group, one
launch at ncclGroupEnd, aggregated per (function, reduction, type) as enqueue.cc does (runtime/coalesce_block.py).

The expected times are nccl-tests' own for the same group (`broadcast_perf -m 4`: NCCL's group of 4 calls, its
closed form in test_nccl_coll_group.py), not phantora's earlier output.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import KiB

BLOCK = """
    import torch, torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    xs = [torch.full((COUNT,), float(rank + 1), device=dev) for _ in range(4)]

    def block():
        with _coalescing_manager(device=dev, async_ops=True) as cm:
            for x in xs:
                dist.broadcast(x, src=0, async_op=True)
        cm.wait()

    for _ in range(2):
        block()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        block()
    end.record()
    torch.cuda.synchronize()
    print("RESULT", rank, start.elapsed_time(end) * 1000 / 10, float(xs[3][0]), flush=True)
    dist.destroy_process_group()
"""


def _nccl_tests_group_us(tmp_path, capsys, size: str, m: str = "4") -> tuple[float, dict]:
    """`broadcast_perf -b size -m m -G 1 --np 4` on 4 of 8 H100s: the group's time (m x a call's) and choice."""
    from phantora.cli import main

    argv = ["nccl-tests", "broadcast_perf", "-b", size, "-e", size, "-m", m, "-G", "1", "--np", "4", "-n", "5"]
    assert main([*argv, "--out", str(tmp_path / "nt")]) == 0
    capsys.readouterr()
    row = json.loads((tmp_path / "nt" / "results.json").read_text())["sizes"][0]
    return int(m) * row["time_us"], row["choice"]


def _live_block_us(tmp_path, size: int, topo, engine=None) -> tuple[list[float], object]:
    """The 4 ranks' time a block of BLOCK (4 broadcasts of `size` bytes) on `topo`, and the run's recording;
    asserts that rank 0's values reached every rank."""
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig

    script = tmp_path / "block.py"
    script.write_text(textwrap.dedent(BLOCK).replace("COUNT", str(size // 4)))
    more = {} if engine is None else {"engine": engine}
    cfg = RunConfig(str(script), topology=topo, nproc=4, trace="none", timeout_s=600, out_dir=tmp_path / "run", **more)
    rep, graph = record_run(cfg, tmp_path / "graph")
    lines = [ln.split() for r in range(4) for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 4 and all(float(ln[3]) == 1.0 for ln in lines)
    return [float(ln[2]) for ln in lines], graph


@pytest.mark.slow
def test_a_device_blocks_broadcasts_run_as_one_nccl_group(tmp_path, capsys):
    """4 ranks of an 8-H100 host, a `_coalescing_manager(device=...)` block of 4 broadcasts of 512 KiB from rank 0:
    NCCL aggregates them (one function, reduction and type), its tuner rates their 2 MiB (Ring Simple, where one
    512 KiB call runs Ring LL) and one launch charges one latency: a block takes what `broadcast_perf -m 4` prints
    for its 4 calls (before, 4 calls started together, each Ring LL, took 16.52 us against the group's 17.63).
    Its recording keeps the calls (type 14) and replays to the same time."""
    from phantora.egraph import replay_graph
    from phantora.egraph.format import Coll
    from phantora.topology.generators import dgx_host

    size = 512 * KiB
    group_us, choice = _nccl_tests_group_us(tmp_path, capsys, "512K")
    assert choice["group_calls"] == 4 and choice["protocol"] == "Simple"
    _, one = _nccl_tests_group_us(tmp_path / "one", capsys, "512K", m="1")
    assert one["protocol"] == "LL"  # one call alone: the group's pick is the aggregate's
    topo = dgx_host(8, gpu="h100")
    times, graph = _live_block_us(tmp_path, size, topo)
    assert all(t == pytest.approx(group_us, rel=0.005) for t in times)
    colls = [n for p in graph.programs for n in p.nodes if isinstance(n, Coll) and n.kind == "broadcast"]
    assert colls and all(n.group_sizes == (size,) * 4 and n.nbytes == 4 * size for n in colls)
    res = replay_graph(graph, topo, FlowSimulator(topo))
    busy = res.comm["broadcast"]
    assert busy["busy_ns"] / busy["count"] / 1000 == pytest.approx(group_us, rel=0.005)


@pytest.mark.ns3
@pytest.mark.slow
def test_a_device_blocks_broadcasts_take_the_same_time_through_ns3(tmp_path, capsys, ns3_lib):
    """The block of 4 x 512 KiB broadcasts run live through ns-3 (packet mode) takes within 3 % of the flow
    engine's time, `broadcast_perf -m 4`'s group."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.topology.generators import dgx_host

    group_us, _ = _nccl_tests_group_us(tmp_path, capsys, "512K")
    times, _ = _live_block_us(tmp_path, 512 * KiB, dgx_host(8, gpu="h100"), EngineSpec(network="ns3"))
    assert all(t == pytest.approx(group_us, rel=0.03) for t in times)


def test_a_recorded_broadcast_group_keeps_its_calls_and_root_through_chakra(tmp_path):
    """A device block's broadcasts as the recording holds them (type 14: broadcasts of 1 MiB and 8 MiB from global
    rank 1, two aggregates as NCCL keeps calls over 4 x apart) replay as that group, from the graph and from its
    Chakra export read back, to the same end: the group decomposed alone (one launch, each aggregate its choice),
    not one broadcast of their total (Ring LL and Ring Simple, 42.54 against 38.02 us)."""
    from phantora.collectives import Collective, decompose
    from phantora.egraph import replay_graph
    from phantora.egraph.builder import ProgramBuilder
    from phantora.egraph.chakra import export_chakra, read_chakra
    from phantora.egraph.format import Coll, Program, assemble
    from phantora.topology.generators import dgx_host

    topo = dgx_host(8, gpu="h100")
    ranks, sizes = (0, 1, 2, 3), (1024 * KiB, 8192 * KiB)
    parts = []
    for r in ranks:
        b = ProgramBuilder(r)
        b.wait([b.collective("broadcast", ranks, sum(sizes), dtype="fp32", root=1, group_sizes=sizes)])
        prog, groups = b.build()
        parts.append((Program.decode(prog.encode()), groups))
    graph = assemble(parts)
    export_chakra(graph, tmp_path / "chakra")

    def end_us(coll: Collective) -> float:
        sim = FlowSimulator(topo)
        sim.submit(decompose(coll, topo).flows, at=0)
        return max(c.end_ns for c in sim.drain()) / 1000

    group_us = end_us(Collective("broadcast", ranks, sum(sizes), "fp32", root=1, group_sizes=sizes))
    whole_us = end_us(Collective("broadcast", ranks, sum(sizes), "fp32", root=1))
    assert abs(group_us - whole_us) > 0.01 * whole_us
    for g in (graph, read_chakra(tmp_path / "chakra")):
        colls = [n for p in g.programs for n in p.nodes if isinstance(n, Coll)]
        assert colls and all(n.group_sizes == sizes and n.root == 1 for n in colls)
        res = replay_graph(g, topo, FlowSimulator(topo))
        assert max(c.end_ns for c in res.completions) / 1000 == pytest.approx(group_us, abs=1e-3)
