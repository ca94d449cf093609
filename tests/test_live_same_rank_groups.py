"""Two process groups over the same ranks are two NCCL communicators: their calls are matched apart (issue 33).

Each group numbers its own collectives (`RankSession.comm_of`, the `pg` of a `coll` message; bridge/matching.py),
as NCCL runs each communicator's in its own order. Before, the ranks tuple keyed one sequence shared by every group
over those ranks, so ranks that issue on two such groups in different orders had one group's call matched with
the other's: here rank 0 issues a 64 KiB all-reduce on group A, then a 4 MiB one on group B (async), while rank 1
issues B, waits for it, then A, which failed as "collective mismatch ... size differ" (the world group is a third
group over the same two ranks: its barrier took seq 0 of the shared sequence).

Closed form: each all-reduce runs alone on the network (B ends before rank 1 issues A), so each takes NCCL's
model time for its size on the same two GPUs as `phantora nccl-tests all_reduce_perf -g 2` prints it
(`model_time_us`, latency plus bytes over the algorithm bandwidth, and `fill_us`, the pipeline's fill): 8.265 us
(Ring LL, 8 channels) and 35.511 + 2.828 us (Ring Simple, 24 channels) on testbed16's H100 host (2026-12-02).
The recording keeps each call's group (`Coll.pg`, node type 12) and replays each to its live end. Sends and
receives on A and B in crossed orders meet their own group's, and so do the values phantom mode carries for
small integer tensors (tensor_values: keyed by group and `pg`).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.cli import main
from phantora.egraph import ExecGraph, replay_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.egraph.format import P2P, T_COLL_PG, T_P2P_PG, Coll, load, save
from phantora.egraph.live import record_run
from phantora.launcher import RunConfig
from phantora.netsim.flow import FlowSimulator
from phantora.topology.loader import load_topology

SCRIPT = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    x = torch.ones(16384, device="cuda")  # 64 KiB on A
    y = torch.ones(1048576, device="cuda")  # 4 MiB on B
    dist.barrier()
    torch.cuda.synchronize()
    if me == 0:
        wa = dist.all_reduce(x, group=a, async_op=True)
        wb = dist.all_reduce(y, group=b, async_op=True)
    else:
        wb = dist.all_reduce(y, group=b, async_op=True)
        wb.wait()
        torch.cuda.synchronize()  # B has ended here before A is issued: each runs alone
        wa = dist.all_reduce(x, group=a, async_op=True)
    wa.wait()
    wb.wait()
    torch.cuda.synchronize()
    if me == 0:  # sends and receives too: rank 0 sends on A then B, rank 1 receives on B then A
        works = [dist.isend(x, 1, group=a), dist.isend(y, 1, group=b)]
    else:
        works = [dist.irecv(y, 0, group=b), dist.irecv(x, 0, group=a)]
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    ia = torch.full((2,), 1 + me, dtype=torch.int64).cuda()  # values phantom mode carries: A sums 1 + 2
    ib = torch.full((2,), 10 * (1 + me), dtype=torch.int64).cuda()  # B sums 10 + 20
    if me == 0:
        works = [dist.all_reduce(ia, group=a, async_op=True), dist.all_reduce(ib, group=b, async_op=True)]
    else:
        works = [dist.all_reduce(ib, group=b, async_op=True), dist.all_reduce(ia, group=a, async_op=True)]
    for w in works:
        w.wait()
    print("VALUES", me, ia.tolist(), ib.tolist(), flush=True)
    dist.destroy_process_group()
"""
SIZES = {"all_reduce#0.pg1": 64 * 1024, "all_reduce#0.pg2": 4 * 1024 * 1024}  # A's, B's
SENDS = {"send#0.pg1": 64 * 1024, "send#0.pg2": 4 * 1024 * 1024}  # A's, B's: pg among the groups holding 0 and 1


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict], ExecGraph]:
    """The live run's all-reduce records (cosim.json) by name, and its recording, saved and loaded; the ranks' logs
    under the key "logs"."""
    d = tmp_path_factory.mktemp("pgs")
    script = d / "two_groups.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cfg = RunConfig(str(script), topology="testbed16", nproc=2, tensors="phantom", trace="none", timeout_s=120,
                    out_dir=str(d / "o"))  # fmt: skip
    _, graph = record_run(cfg, d / "g")
    save(graph, d / "again")
    recs = json.loads((d / "o" / "cosim.json").read_text())["collectives"]
    out = {r["name"]: r for r in recs if r["name"] in SIZES or r["name"] in SENDS}
    out["logs"] = {"text": "".join(f.read_text() for f in sorted((d / "o" / "logs").iterdir()) if f.is_file())}
    return out, load(d / "again")


def _nccl_model_us(tmp_path, nbytes: int) -> float:
    """`phantora nccl-tests all_reduce_perf -b N -e N -g 2 --topology testbed16`: NCCL's model time and the pipeline
    fill it prints for `nbytes`, in us (its `time` column adds the harness's launches: not the collective's)."""
    out = tmp_path / f"nt{nbytes}"
    argv = ["nccl-tests", "all_reduce_perf", "-b", str(nbytes), "-e", str(nbytes), "-g", "2", "--topology", "testbed16"]
    assert main([*argv, "--out", str(out)]) == 0
    (row,) = json.loads((out / "results.json").read_text())["sizes"]
    return float(row["choice"]["model_time_us"]) + float(row["choice"].get("fill_us", 0.0))


def test_each_group_s_call_is_matched_with_its_own_and_takes_its_size_s_time(recorded, tmp_path, capsys) -> None:
    recs, _ = recorded
    assert sorted(recs) == sorted([*SIZES, *SENDS, "logs"])  # each call ran once, on its own group
    for name, nbytes in SIZES.items():
        r = recs[name]
        assert (r["kind"], r["nbytes"]) == ("all_reduce", nbytes)
        took_us = (r["end_ns"] - r["t_start"]) / 1e3
        assert took_us == pytest.approx(_nccl_model_us(tmp_path, nbytes), abs=2e-3)  # printed to the ns
    a, b = recs["all_reduce#0.pg1"], recs["all_reduce#0.pg2"]
    assert a["t_start"] >= b["end_ns"]  # A waited for rank 1, which issued it after B ended: they never overlap


def test_a_groups_send_meets_that_groups_receive(recorded) -> None:
    """Rank 1 receives on B first: each receive still meets its own group's send (before, the first send met the
    first receive, 64 KiB against 4 MiB: "transfer mismatch ... sizes differ")."""
    recs, _ = recorded
    for name, nbytes in SENDS.items():
        assert (recs[name]["kind"], recs[name]["nbytes"], recs[name]["group"]) == ("send_recv", nbytes, [0, 1])


def test_each_groups_carried_values_stay_its_own(recorded) -> None:
    """Phantom mode carries small integer tensors' values (tensor_values), keyed by the call's group and `pg` too:
    A sums 1 + 2 = 3 and B 10 + 20 = 30 on both ranks (before, keyed by the ranks alone, the crossed order gave rank 0
    A = 21 and B = 12)."""
    lines = sorted(ln for ln in recorded[0]["logs"]["text"].splitlines() if ln.startswith("VALUES"))
    assert lines == ["VALUES 0 [3, 3] [30, 30]", "VALUES 1 [3, 3] [30, 30]"]


def test_the_recording_keeps_the_groups_and_replays_each_call_as_live(recorded, tmp_path) -> None:
    """Saved and loaded, and through a Chakra export and import (`phantora_pg`), the replay ends each call at its
    live end."""
    recs, graph = recorded
    assert len(graph.programs) == 2  # the ranks issue in different orders
    pgs = sorted(n.pg for p in graph.programs for n in p.nodes if isinstance(n, Coll))
    assert pgs == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]  # the barrier on the world's group, A's on the next, B's the third
    assert sorted(n.pg for p in graph.programs for n in p.nodes if isinstance(n, P2P)) == [1, 1, 2, 2]
    codes = {row[0] for p in graph.programs for row in _rows(p)}
    assert {T_COLL_PG, T_P2P_PG} <= codes
    topo = load_topology("testbed16")
    export_chakra(graph, tmp_path / "chakra")
    for g in (graph, read_chakra(tmp_path / "chakra")):
        res = replay_graph(g, topo, FlowSimulator(topo))
        ends: dict[str, int] = {}
        for c in res.completions:
            for name in [*SIZES, *SENDS]:
                if c.tag.startswith((f"{name}@0.1/", f"{name}@0>1")):
                    ends[name] = max(ends.get(name, 0), c.end_ns)
        assert ends == {name: recs[name]["end_ns"] for name in [*SIZES, *SENDS]}


def _rows(prog) -> list[list]:
    import msgpack

    return msgpack.unpackb(prog.encode(), raw=False)["nodes"]
