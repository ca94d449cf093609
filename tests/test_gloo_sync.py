"""A plain gloo group in real mode is a synchronisation the simulator knows about (backend.py, `gloo_sync`).

Before: `new_group(backend="gloo")` stayed a real, unsimulated gloo group in real mode. A rank blocked in its
all-reduce while its peer waited on a simulated receive: the coordinator could not move the network past the
blocked rank's clock, and the run hung until its timeout (both ranks at 2,418 ns). Now each gloo call is issued as
a collective of zero network bytes: every member leaves at the latest member's entry (no host-side cost is added:
none is measured or published for the simulated cluster's hosts), and gloo still moves the data.

One 3-rank program on testbed16 checks, per phase, the values and that every member's clock after the call equals
the latest entry (each rank's `time.perf_counter_ns()` is its simulated clock): an all-reduce on a world gloo group
right after an NCCL send (rank 1 enters at its receive's end), a barrier, a broadcast on a gloo group of ranks 0 and
2 (rank 1 outside it, its clock unmoved), and a gloo send/recv (planned outside the NCCL model: an NCCL send of 0
bytes is a kernel NCCL launches, 6.6 us here, which the gloo one took before, at any load). The recording (saved,
and through Chakra) replays the NCCL all-reduce that follows to its live end, which only the gloo calls'
synchronisations make it (rank 0 computes after them). A second program's default group is gloo
(`init_process_group("gloo")`), beside an NCCL group.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from phantora.egraph import replay_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.egraph.format import load
from phantora.egraph.live import record_run
from phantora.launcher import RunConfig, launch
from phantora.netsim.flow import FlowSimulator
from phantora.topology.loader import load_topology

pytestmark = pytest.mark.slow

SCRIPT = """
    import time, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    g = dist.new_group([0, 1, 2], backend="gloo")
    sub = dist.new_group([0, 2], backend="gloo")
    a = torch.randn(2048, 2048, device="cuda")

    def phase(name, call):
        t0 = time.perf_counter_ns()
        out = call()
        print("PHASE", name, me, t0, time.perf_counter_ns(), out, flush=True)

    y = torch.ones(1 << 18, device="cuda")
    if me < 2:
        w = dist.isend(y, 1) if me == 0 else dist.irecv(y, 0)
        w.wait()
    x = torch.ones(4)
    phase("all_reduce", lambda: (dist.all_reduce(x, group=g), x.tolist())[1])
    if me == 2:
        (a @ a).sum().item()
    phase("barrier", lambda: dist.barrier(group=g))
    if me == 0:
        (a @ a).sum().item()
    if me != 1:
        b = torch.full((3,), float(me))
        phase("broadcast", lambda: (dist.broadcast(b, src=2, group=sub), b.tolist())[1])
    else:
        phase("broadcast", lambda: None)
    if me == 1:  # twice: rank 0 computed once after the barrier too
        (a @ a @ a).sum().item()
    p = torch.full((2,), float(me))
    if me == 1:
        phase("p2p", lambda: dist.send(p, 0, group=g))
    elif me == 0:
        phase("p2p", lambda: (dist.recv(p, 1, group=g), p.tolist())[1])
    if me == 0:
        (a @ a).sum().item()
    z = torch.ones(1 << 16, device="cuda")
    dist.all_reduce(z)
    torch.cuda.synchronize()
    print("BACKEND", me, dist.get_backend(g), flush=True)
    dist.destroy_process_group()
"""


WORLD_GLOO = """
    import threading, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    nccl = dist.new_group([0, 1], backend="nccl")
    plain = dist.new_group([0, 1])  # the default's backend: gloo
    y = torch.ones(1 << 18, device="cuda")
    w = dist.isend(y, 1, group=nccl) if me == 0 else dist.irecv(y, 0, group=nccl)
    w.wait()
    for name, g in (("world", None), ("plain", plain)):
        x = torch.full((2,), float(me + 1))
        t0 = time.perf_counter_ns()
        dist.all_reduce(x, group=g)
        print("PHASE", name, me, t0, time.perf_counter_ns(), x.tolist(), dist.get_backend(g), flush=True)
    bg = dist.new_group([0, 1], backend="gloo")
    v = torch.full((2,), float(me + 1))
    if me == 1:  # rank 1's clock ahead: a simulated call would move rank 0's to it
        a = torch.randn(2048, 2048, device="cuda")
        (a @ a).sum().item()
    t0 = time.perf_counter_ns()
    th = threading.Thread(target=lambda: dist.all_reduce(v, op=dist.ReduceOp.AVG, group=bg))  # as DCP's async_save
    th.start()
    th.join()
    print("PHASE thread", me, t0, time.perf_counter_ns(), v.tolist(), flush=True)
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("gloo_sync")
    (d / "prog.py").write_text(textwrap.dedent(SCRIPT))
    cfg = RunConfig(str(d / "prog.py"), topology="testbed16", nproc=3, tensors="real", trace="none", timeout_s=120,
                    out_dir=str(d / "o"))  # fmt: skip
    record_run(cfg, d / "g")
    return d / "o", d / "g"


def _phases(out: Path) -> dict[str, dict[int, tuple[int, int, str]]]:
    """name -> rank -> (entry ns, exit ns, printed result)."""
    got: dict[str, dict[int, tuple[int, int, str]]] = {}
    for f in sorted((out / "logs").glob("rank*.log")):
        for line in f.read_text().splitlines():
            if line.startswith("PHASE "):
                _, name, rank, t0, t1, res = line.split(" ", 5)
                got.setdefault(name, {})[int(rank)] = (int(t0), int(t1), res)
    return got


def _records(out: Path) -> list[dict]:
    return json.loads((out / "cosim.json").read_text())["collectives"]


def _synced(ph: dict[int, tuple[int, int, str]], members: tuple[int, ...]) -> int:
    """Every member's exit is the latest entry; return it."""
    latest = max(ph[r][0] for r in members)
    assert {ph[r][1] for r in members} == {latest}, ph
    return latest


def test_a_gloo_all_reduce_after_an_nccl_send_ends_at_the_later_entry(run) -> None:
    ph = _phases(run[0])["all_reduce"]
    assert {r: ph[r][2] for r in ph} == dict.fromkeys((0, 1, 2), "[3.0, 3.0, 3.0, 3.0]")
    recv = next(r for r in _records(run[0]) if r["kind"] == "send_recv" and r["nbytes"])
    # rank 1 enters at its receive's end (its wait joined it), the latest of the three
    assert ph[1][0] == recv["end_ns"] > max(ph[0][0], ph[2][0])
    assert _synced(ph, (0, 1, 2)) == recv["end_ns"]


def test_a_gloo_barrier_and_a_subgroup_broadcast_end_at_the_latest_entry(run) -> None:
    phases = _phases(run[0])
    bar = phases["barrier"]
    assert bar[2][0] > max(bar[0][0], bar[1][0])  # rank 2 computed before it
    _synced(bar, (0, 1, 2))
    bc = phases["broadcast"]
    assert bc[0][2] == bc[2][2] == "[2.0, 2.0, 2.0]"
    assert bc[0][0] > bc[2][0]  # rank 0 computed before it
    _synced(bc, (0, 2))
    assert bc[1][0] == bc[1][1] == bar[1][1]  # rank 1 is outside the group: its clock stays


def test_a_gloo_send_and_recv_end_at_the_later_entry(run) -> None:
    ph = _phases(run[0])["p2p"]
    assert ph[0][2] == "[1.0, 1.0]"
    assert ph[1][0] > ph[0][0]  # rank 1 computed before its send
    latest = _synced(ph, (0, 1))
    # no NCCL kernel: not the 6.6 us launch of NCCL's empty send, which it took before (tests/test_gloo_p2p_plan.py)
    rec = next(r for r in _records(run[0]) if r["kind"] == "send_recv" and not r["nbytes"])
    assert rec["t_start"] == rec["end_ns"] == latest and "nccl" not in rec


def test_the_backend_is_named_gloo_and_the_recording_replays_as_live(run, tmp_path) -> None:
    out, rec = run
    text = "".join(f.read_text() for f in sorted((out / "logs").glob("rank*.log")))
    assert sorted(ln for ln in text.splitlines() if ln.startswith("BACKEND")) == [f"BACKEND {r} gloo" for r in range(3)]
    live = {r["name"]: r["end_ns"] for r in _records(out) if r["kind"] == "all_reduce" and r["nbytes"]}
    assert list(live) == ["all_reduce#0"]
    gloo = [r for r in _records(out) if r["name"].startswith("gloo_")]
    assert sorted(r["name"].split("#")[0] for r in gloo) == ["gloo_all_reduce", "gloo_barrier", "gloo_broadcast"]
    assert all(r["nbytes"] == 0 and r["end_ns"] == r["t_start"] for r in gloo)
    assert [r["nbytes"] for r in _records(out) if r["kind"] == "send_recv"] == [1 << 20, 0]  # the gloo send: 0
    topo = load_topology("testbed16")
    export_chakra(load(rec), tmp_path / "chakra")
    for graph in (load(rec), read_chakra(tmp_path / "chakra")):
        ends: dict[str, int] = {}
        for c in replay_graph(graph, topo, FlowSimulator(topo)).completions:
            if c.size:
                name = c.tag.split("/")[0].split("@")[0]
                ends[name] = max(ends.get(name, 0), c.end_ns)
        assert ends["all_reduce#0"] == live["all_reduce#0"]


def test_a_gloo_default_group_and_its_plain_new_group_synchronise_too(tmp_path) -> None:
    """init_process_group("gloo") with an NCCL group beside it: the world's all-reduce after the NCCL receive ends
    at the receiver's entry, and so does one on a new_group made without a backend (the default's, gloo)."""
    (tmp_path / "prog.py").write_text(textwrap.dedent(WORLD_GLOO))
    cfg = RunConfig(str(tmp_path / "prog.py"), topology="testbed16", nproc=2, tensors="real", trace="none",
                    timeout_s=120, out_dir=str(tmp_path / "o"))  # fmt: skip
    launch(cfg)
    phases = _phases(tmp_path / "o")
    recv = next(r for r in _records(tmp_path / "o") if r["kind"] == "send_recv" and r["nbytes"])
    world = phases["world"]
    assert world[1][0] == recv["end_ns"] > world[0][0]
    assert _synced(world, (0, 1)) == recv["end_ns"]
    assert {world[r][2] for r in (0, 1)} == {"[3.0, 3.0] gloo"}
    assert phases["plain"][0][2] == phases["plain"][1][2] == "[3.0, 3.0] gloo"
    _synced(phases["plain"], (0, 1))
    # a gloo call off the rank's thread runs on gloo alone (gloo_thread.py): the values, and no simulated time
    assert {phases["thread"][r][2] for r in (0, 1)} == {"[1.5, 1.5]"}
    assert all(phases["thread"][r][0] == phases["thread"][r][1] for r in (0, 1))
