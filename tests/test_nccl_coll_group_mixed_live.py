"""A `_coalescing_manager(device=...)` block of collectives of several kinds, reductions or roots, run live,
recorded and replayed as NCCL runs it: one NCCL group, one plan (enqueue.cc v2.22.3-1 .. v2.30.7-1; the model in
tests/test_nccl_coll_group_mixed.py). The block is one coalesced call carrying each call's kind, reduction and root
(runtime/coalesce_block.py `merged`), the recording's type 14 entries `[bytes, dtype, kind, redop, root]` and
Chakra's `phantora_group_*` attributes. Expected times are the closed forms from each call's NCCL choice alone
(`Choice.lat_us`, `Choice.algbw`), not phantora's earlier output.
"""

from __future__ import annotations

import textwrap

import msgpack
import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.options import resolve
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import H100, RANKS, MiB, opts

V227 = {"PHANTORA_NCCL_VERSION": "2.27.3"}


def _block_program(tensors: str, calls: str, check: str) -> str:
    """A live program timing a `_coalescing_manager(device=)` block: `tensors` made on the rank's GPU, the block's
    `calls` (lines inside the manager), `check` a pair of floats read after a first block; prints
    `RESULT rank us check0 check1`, the block's mean time over 4 after that first."""
    return (
        """
    import torch, torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
"""
        + f"    {tensors}\n"
        + """
    def block():
        with _coalescing_manager(device=dev, async_ops=True) as cm:
"""
        + "".join(f"            {line}\n" for line in calls.splitlines())
        + f"""        cm.wait()

    block()
    check = {check}
"""
        + """    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(4):
        block()
    end.record()
    torch.cuda.synchronize()
    print("RESULT", rank, start.elapsed_time(end) * 1000 / 4, check[0], check[1], flush=True)
    dist.destroy_process_group()
"""
    )


MIXED = _block_program(
    "a, b = (torch.full((262144,), float(rank + 1), device=dev) for _ in range(2))  # 1 MiB of fp32 each",
    "dist.all_reduce(a, async_op=True)\ndist.broadcast(b, src=0, async_op=True)",
    "(float(a[0]), float(b[0]))",
)
ROOTS = _block_program(
    "xs = [torch.full((131072,), float(rank + 1), device=dev) for _ in range(4)]  # 512 KiB of fp32 each",
    "for i, x in enumerate(xs):\n    dist.broadcast(x, src=i % 2, async_op=True)",
    "(float(xs[0][0]), float(xs[1][0]))",
)


def _one_plan_us(calls: list[tuple[str, int | None, int]]) -> float:
    """NCCL's one plan of `calls` ((kind, root, bytes) on the 8 H100s, 2.27): the largest latency once, plus each
    call's bytes over its own choice's algbw (each call alone: its kind and bytes)."""
    alone = [resolve(Collective(k, RANKS, s, "fp32", root=r), H100, opts(**V227))[1] for k, r, s in calls]
    assert all(c is not None for c in alone)
    bandwidth_ns = sum(s / c.algbw for c, (_, _, s) in zip(alone, calls, strict=True))  # type: ignore[union-attr]
    return max(c.lat_us for c in alone) + bandwidth_ns / 1000  # type: ignore[union-attr]


def _roots_us() -> float:
    """4 x 512 KiB broadcasts from roots 0, 1, 0, 1: one aggregate rated on its 2 MiB (Ring Simple), each root's
    1 MiB on it: the aggregate's latency plus 2 MiB over its algbw."""
    total = resolve(Collective("broadcast", RANKS, 2 * MiB, "fp32", root=0), H100, opts(**V227))[1]
    assert total is not None and total.protocol == "Simple"
    return total.lat_us + 2 * MiB / total.algbw / 1000


def _live(tmp_path, body: str, engine=None):
    """Run `body` on the 8 H100s, recorded: each rank's (time a block in us, its two checked values), the graph."""
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig
    from phantora.topology.generators import dgx_host

    script = tmp_path / "block.py"
    script.write_text(textwrap.dedent(body))
    more = {} if engine is None else {"engine": engine}
    cfg = RunConfig(
        str(script), topology=dgx_host(8, gpu="h100"), nproc=8, trace="none", timeout_s=900,
        out_dir=tmp_path / "run", **more,
    )  # fmt: skip
    rep, graph = record_run(cfg, tmp_path / "graph")
    lines = [ln.split() for r in range(8) for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 8
    return [(float(ln[2]), float(ln[3]), float(ln[4])) for ln in lines], graph


def _replayed_us(graph, kind: str) -> float:
    from phantora.egraph import replay_graph

    res = replay_graph(graph, H100, FlowSimulator(H100))
    busy = res.comm[kind]
    return busy["busy_ns"] / busy["count"] / 1000


@pytest.mark.slow
def test_a_live_block_of_an_all_reduce_and_a_broadcast_is_one_plan(tmp_path, monkeypatch):
    """1 MiB all-reduce + 1 MiB broadcast from rank 0 in one device block (2.27, 8 H100s): one plan, 15.0 +
    1 MiB / 80.571 GB/s + 1 MiB / 141.0 GB/s = 35.451 us a block (before: two coalesced calls started together,
    28.015). The values arrive (sum 36, rank 0's 1.0); the recording keeps each call's kind and root (torch issues
    the broadcast first, the all-reduce at the block's end) and replays to the same time."""
    from phantora.egraph.format import Coll

    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.27.3")
    expected = _one_plan_us([("all_reduce", None, MiB), ("broadcast", 0, MiB)])
    assert expected == pytest.approx(35.451, abs=0.001)
    got, graph = _live(tmp_path, MIXED)
    assert all((a, b) == (36.0, 1.0) for _, a, b in got)
    assert all(t == pytest.approx(expected, rel=0.005) for t, _, _ in got)
    colls = [n for p in graph.programs for n in p.nodes if isinstance(n, Coll)]
    assert colls and all(
        (n.kind, n.root, n.group_sizes, n.group_kinds, n.group_roots)
        == ("broadcast", 0, (MiB, MiB), ("broadcast", "all_reduce"), (0, None))
        for n in colls
    )
    assert _replayed_us(graph, "broadcast") == pytest.approx(expected, rel=0.005)


@pytest.mark.slow
def test_a_live_block_of_broadcasts_from_two_roots_is_one_aggregate(tmp_path, monkeypatch):
    """4 x 512 KiB broadcasts from roots 0, 1, 0, 1 in one device block: NCCL bins them by (function, reduction,
    type), not root, and rates their 2 MiB (Ring Simple): 11.8 + 2 MiB / 360 GB/s = 17.626 us a block (before: a
    coalesced call per root, each Ring LL, 16.521). Recorded with its roots and replayed to the same time."""
    from phantora.egraph.format import Coll

    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.27.3")
    expected = _roots_us()
    assert expected == pytest.approx(17.626, abs=0.001)
    got, graph = _live(tmp_path, ROOTS)
    assert all((a, b) == (1.0, 2.0) for _, a, b in got)
    assert all(t == pytest.approx(expected, rel=0.005) for t, _, _ in got)
    colls = [n for p in graph.programs for n in p.nodes if isinstance(n, Coll)]
    assert colls and all(n.group_roots == (0, 1, 0, 1) and not n.group_kinds for n in colls)
    assert _replayed_us(graph, "broadcast") == pytest.approx(expected, rel=0.005)


@pytest.mark.ns3
@pytest.mark.slow
def test_the_mixed_live_block_takes_the_same_time_through_ns3(tmp_path, monkeypatch, ns3_lib):
    """The all-reduce + broadcast block run live through ns-3 (packet mode): within 1 % of the closed form."""
    from phantora.netsim.engine_spec import EngineSpec

    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.27.3")
    expected = _one_plan_us([("all_reduce", None, MiB), ("broadcast", 0, MiB)])
    got, _ = _live(tmp_path, MIXED, EngineSpec(network="ns3"))
    assert all(t == pytest.approx(expected, rel=0.01) for t, _, _ in got)


def _mixed_program(rank: int):
    from phantora.egraph.builder import ProgramBuilder

    b = ProgramBuilder(rank)
    b.wait(
        [
            b.collective(
                "broadcast",
                RANKS,
                2 * MiB,
                dtype="fp32",
                root=3,
                group_sizes=(MiB, MiB),
                group_kinds=("broadcast", "all_reduce"),
                group_roots=(3, None),
            )  # fmt: skip
        ]
    )
    return b.build()


def test_a_mixed_group_round_trips_through_the_format_and_chakra_and_replays_as_one_plan(tmp_path):
    """Type 14's five-field entries and Chakra's attributes keep each call's kind and root: read back, the graph
    replays to the group's closed form (one plan, rooted at 3), not the broadcast of 2 MiB its head would be."""
    from phantora.egraph import replay_graph
    from phantora.egraph.chakra import export_chakra, read_chakra
    from phantora.egraph.format import Coll, Program, assemble

    parts = []
    for r in RANKS:
        prog, groups = _mixed_program(r)
        row = msgpack.unpackb(prog.encode())["nodes"][0]
        assert row[0] == 14 and row[-1] == [[MiB, 2, 3, 0, 3], [MiB, 2, 0, 0, -1]]
        parts.append((Program.decode(prog.encode()), groups))
    graph = assemble(parts)
    export_chakra(graph, tmp_path / "chakra")
    expected = _one_plan_us([("all_reduce", None, MiB), ("broadcast", 3, MiB)])
    o = opts(**V227)
    for g in (graph, read_chakra(tmp_path / "chakra")):
        colls = [n for p in g.programs for n in p.nodes if isinstance(n, Coll)]
        assert colls and all((n.group_kinds, n.group_roots) == (("broadcast", "all_reduce"), (3, None)) for n in colls)
        res = replay_graph(g, H100, FlowSimulator(H100), o)
        assert max(c.end_ns for c in res.completions) / 1000 == pytest.approx(expected, abs=0.005)


def test_old_type_14_files_still_read():
    """Files written before the five-field entries: plain byte counts and [bytes, dtype code] pairs."""
    from phantora.egraph.format import Coll, Program

    for sizes, types in (([MiB, 2 * MiB], ()), ([[MiB, 2], [2 * MiB, 0]], ("fp32", "bf16"))):
        raw = msgpack.packb({"v": 1, "names": [], "nodes": [[14, 0, 0, 0, 3 * MiB, 2, -1, 0, [], 0, 0, sizes]]})
        (n,) = Program.decode(raw).nodes
        assert isinstance(n, Coll) and n.group_sizes == (MiB, 2 * MiB) and n.group_dtypes == types
        assert not n.mixed()


def test_bad_group_calls_are_refused_in_one_line():
    from phantora.egraph.builder import ProgramBuilder
    from phantora.egraph.format import Program

    b = ProgramBuilder(0)
    with pytest.raises(InputError, match="group"):
        b.collective(
            "broadcast", RANKS, 2 * MiB, root=0, group_sizes=(MiB, MiB), group_kinds=("broadcast", "all_to_all")
        )
    with pytest.raises(InputError, match="group roots"):
        b.collective("broadcast", RANKS, 2 * MiB, root=0, group_sizes=(MiB, MiB), group_roots=(0, 8))
    bad = msgpack.packb(
        {"v": 1, "names": [], "nodes": [[14, 0, 0, 3, 2 * MiB, 2, 0, 0, [], 0, 0, [[MiB, 2, 3], [MiB, 2, 3]]]]}
    )
    with pytest.raises(InputError, match="group sizes must be"):
        Program.decode(bad)


def test_outside_nccls_model_each_kind_and_root_runs_alone_together():
    """model=ideal has no NCCL plan: the group's (kind, reduction, root) bins run as their own collectives, started
    together, so it ends when the slower of them alone ends."""
    o = AlgoOptions(model="ideal")
    group = Collective(
        "all_reduce", RANKS, 2 * MiB, "fp32", group_sizes=(MiB, MiB), group_kinds=("all_reduce", "broadcast"),
        group_roots=(None, 0),
    )  # fmt: skip

    def end_ns(coll: Collective) -> int:
        sim = FlowSimulator(H100)
        sim.submit(decompose(coll, H100, o).flows, at=0)
        return max(c.end_ns for c in sim.drain())

    bins = [Collective("all_reduce", RANKS, MiB, "fp32"), Collective("broadcast", RANKS, MiB, "fp32", root=0)]
    alone = [end_ns(c) for c in bins]
    assert sorted(f.size for f in decompose(group, H100, o).flows) == sorted(
        f.size for c in bins for f in decompose(c, H100, o).flows
    )
    assert max(alone) <= end_ns(group) <= sum(alone)


def test_a_mixed_group_on_symmetric_kernels_runs_its_bins_apart():
    """2.28.3 on symmetric windows (REGISTER=2): the 1 MiB all-reduce runs a symmetric kernel, whose place in one
    plan with a broadcast is not modelled; the group runs as before this was carried, each (kind, root)'s calls
    their own collective, started together: the same flows as each alone, and its end between the slower alone and
    their sum."""
    o = opts(PHANTORA_NCCL_REGISTER="2", PHANTORA_NCCL_VERSION="2.28.3")
    group = Collective(
        "all_reduce", RANKS, 2 * MiB, "fp32", group_sizes=(MiB, MiB), group_kinds=("all_reduce", "broadcast"),
        group_roots=(None, 0),
    )  # fmt: skip
    bins = [Collective("all_reduce", RANKS, MiB, "fp32"), Collective("broadcast", RANKS, MiB, "fp32", root=0)]
    assert decompose(bins[0], H100, o).choice["algorithm"] == "sym"  # type: ignore[index]

    def end_ns(coll: Collective) -> int:
        sim = FlowSimulator(H100)
        sim.submit(decompose(coll, H100, o).flows, at=0)
        return max(c.end_ns for c in sim.drain())

    assert sorted(f.size for f in decompose(group, H100, o).flows) == sorted(
        f.size for c in bins for f in decompose(c, H100, o).flows
    )
    alone = [end_ns(c) for c in bins]
    assert max(alone) <= end_ns(group) <= sum(alone)
