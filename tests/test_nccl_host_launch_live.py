"""A live rank's NCCL calls pay the host's launch on its CPU clock (issue 33, runtime/nccl_launch.py: on by default,
PHANTORA_NCCL_HOST_LAUNCH=off opts out): 8 ranks of an 8-H100 host all-reduce 8 bytes back to back, timed with CUDA
events, and then on a group of one rank each (no GPU time: a host-bound loop).

Closed forms, with h the host launch (collectives/nccl/host_launch.py at its fallback work batches) and g one call's
GPU time (the same loop without the host launch, over N): N calls from an idle GPU end at max(N h + g, h + N g); a
group of one takes N h. The loop with the launch matches `phantora nccl-tests all_reduce_perf` without -G (which
charges h at the call's own channel count) within (h - its h) / N; the recording replays to the live times. CUDA
graphs are refused by the runtime (simcuda/api.py), so no captured call replays.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us, host_ns_per_call
from phantora.runtime import nccl_launch

CALLS = 20
LOOP = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    me = dist.get_rank()
    torch.cuda.set_device(me)
    ones = [dist.new_group([r]) for r in range(dist.get_world_size())]  # new_group is collective: every rank makes all
    x = torch.ones(2, device="cuda")

    def timed(group):
        for _ in range(5):
            dist.all_reduce(x, group=group)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(NCALLS):
            dist.all_reduce(x, group=group)
        end.record()
        torch.cuda.synchronize()
        return round(start.elapsed_time(end) * 1e6)

    world = timed(None)
    alone = timed(ones[me])
    print("RESULT", me, world, alone, flush=True)
    dist.destroy_process_group()
"""


def _live(tmp_path, on: bool):
    """The 8 ranks' (loop ns, lone-group loop ns), the run's report and its recording."""
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig
    from phantora.topology.generators import dgx_host

    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(LOOP).replace("NCALLS", str(CALLS)))
    topo = dgx_host(8, gpu="h100")
    cfg = RunConfig(str(script), topology=topo, nproc=8, tensors="phantom", dedup="off", trace="none", timeout_s=900,
                    out_dir=tmp_path / "run", env={nccl_launch.ENV: "on" if on else "off"})  # fmt: skip
    rep, graph = record_run(cfg, tmp_path / "graph")
    rows = [ln.split() for r in range(8) for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("RESULT")]
    assert len(rows) == 8
    return [(int(r[2]), int(r[3])) for r in rows], rep, graph, topo


@pytest.mark.slow
def test_live_all_reduces_pay_the_host_launch(tmp_path, capsys):
    from phantora.cli import main
    from phantora.egraph import replay_graph
    from phantora.netsim.flow import FlowSimulator

    off, rep_off, _, _ = _live(tmp_path / "off", False)
    on, rep, graph, topo = _live(tmp_path / "on", True)
    h = round(host_launch_us(DEFAULT_BATCHES) * 1000)
    g = off[0][0] / CALLS  # back to back on the GPU: N g
    assert all(o == off[0] for o in off) and all(o == on[0] for o in on)
    assert off[0][1] < 100  # a group of one, no launch charged: (nearly) no time
    # (1) the closed form: from an idle GPU, N calls end at max(N h + g, h + N g); a group of one is host-bound
    assert on[0][0] == pytest.approx(max(CALLS * h + g, h + CALLS * g), abs=CALLS)
    assert on[0][1] == pytest.approx(CALLS * h + off[0][1], abs=CALLS)
    # (2) nccl-tests' default (no -G) charges h' (the call's own channels) the same way: within (h - h') / N a call
    argv = ["nccl-tests", "all_reduce_perf", "-b", "8", "-e", "8", "--np", "8", "-n", str(CALLS), "-w", "5"]
    assert main([*argv, "--out", str(tmp_path / "nt")]) == 0
    capsys.readouterr()
    row = json.loads((tmp_path / "nt" / "results.json").read_text())["sizes"][0]
    h_nt = host_ns_per_call("all_reduce", row["choice"], 8, 1)
    assert h_nt < h  # 8 bytes run on one channel; the rank, not knowing, charges DEFAULT_BATCHES
    assert on[0][0] / CALLS - row["time_us"] * 1000 == pytest.approx((h - h_nt) / CALLS, abs=10)
    # (4) the recording carries the host's time: it replays to each rank's live end, later than without the launch
    ends = [r["end_ns"] for r in rep.summary["ranks"]]
    assert ends[0] > rep_off.summary["ranks"][0]["end_ns"]
    assert replay_graph(graph, topo, FlowSimulator(topo)).rank_end_ns == ends


def test_the_setting_is_on_by_default_off_opts_out_and_a_bad_value_is_one_line(monkeypatch):
    from phantora.errors import InputError

    monkeypatch.delenv(nccl_launch.ENV, raising=False)
    nccl_launch.enabled.cache_clear()
    assert nccl_launch.enabled() is True
    for value, on in (("", True), ("on", True), ("1", True), ("off", False), (" OFF ", False), ("0", False)):
        monkeypatch.setenv(nccl_launch.ENV, value)
        nccl_launch.enabled.cache_clear()
        assert nccl_launch.enabled() is on
        assert nccl_launch.launch_ns() == (round(host_launch_us(DEFAULT_BATCHES) * 1000) if on else 0)
    monkeypatch.setenv(nccl_launch.ENV, "yes please")
    nccl_launch.enabled.cache_clear()
    with pytest.raises(InputError, match=nccl_launch.ENV):
        nccl_launch.enabled()
    monkeypatch.delenv(nccl_launch.ENV)
    nccl_launch.enabled.cache_clear()


def test_a_group_launch_is_charged_once_and_a_busy_gpu_hides_the_launch(monkeypatch):
    """In one process (test_runtime_session's double: a call takes COMM_NS from its issue): a coalescing block of
    three calls around a matmul is one launch, issued at max(the matmul's end, h) (the host started at 0); the lone
    call after its wait is issued at the wait's end (the host, at 2 h, is long done: hidden); after a device
    synchronise the host starts there, so the next call is issued h later."""
    import datetime

    import torch
    import torch.distributed as dist

    from phantora.perfmodel.gpus import get_gpu
    from phantora.runtime.backend import PhantoraProcessGroup
    from phantora.runtime.compute import Roofline
    from phantora.runtime.dispatch import ChargeMode
    from phantora.runtime.session import RankSession
    from tests.test_runtime_session import COMM_NS, LAUNCH_NS, MM_NS, FixedLatencyClient, N

    monkeypatch.setenv(nccl_launch.ENV, "on")
    nccl_launch.enabled.cache_clear()
    h = round(host_launch_us(DEFAULT_BATCHES) * 1000)
    client = FixedLatencyClient()
    s = RankSession(0, 1, client, Roofline(get_gpu("h100"), LAUNCH_NS), trace_level="ops")
    pg = PhantoraProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30), [0], s)
    a = torch.randn(N, N)
    try:
        with ChargeMode(s):
            x, y, z = torch.ones(8), torch.ones(4), torch.ones(2)
            pg._start_coalescing()
            pg.broadcast([x])
            pg.reduce([z])
            a @ a
            pg.broadcast([y])
            pg._end_coalescing().wait()
            first = max(MM_NS, h)
            k = len(client.calls)  # the block's coalesced calls (one, or one per kind), all in its launch
            assert k and all(c[2] == first for c in client.calls)  # one launch: its calls issued together
            pg.broadcast([x]).wait()
            assert client.calls[k][2] == first + COMM_NS  # the host (2 h) ran ahead of the GPU: hidden
            s.sync()
            t = s.now()
            pg.broadcast([x]).wait()
            assert client.calls[k + 1][2] == t + h  # the host waited at the synchronise, then launched
            assert s.nccl_launch_total_ns == 3 * h
    finally:
        monkeypatch.delenv(nccl_launch.ENV)
        nccl_launch.enabled.cache_clear()
