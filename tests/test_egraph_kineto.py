"""Import of PyTorch profiler (Kineto) Chrome traces written here, modelled on torch.profiler's JSON output.

Each rank: a forward GEMM on the compute stream (7); a cudaEventRecord + Stream Wait Event makes the NCCL
stream (20) wait for it; the all-reduce (16 MiB fp32 over ranks 0-1) overlaps a backward GEMM; a second
event makes the optimizer kernel on stream 7 wait for the all-reduce. Times in the file are microseconds.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import main
from phantora.collectives.spec import AlgoOptions
from phantora.egraph import replay_graph
from phantora.egraph.format import Coll, Compute, Step, Wait
from phantora.egraph.kineto import import_kineto
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

B = 100e9
NELEMS = 4 * 2**20  # fp32 -> 16 MiB
IDEAL = AlgoOptions(model="ideal")  # the closed forms below are line-rate ring times
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def kernel(name: str, stream: int, corr: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    full = {"device": 0, "stream": stream, "correlation": corr, "External id": corr + 1000, **args}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": full}


def runtime(name: str, corr: int, ts: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2.0,
            "args": {"correlation": corr}}  # fmt: skip


def wait_event(stream: int, on: int, record_corr: int, corr: int, ts: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": stream, "ts": ts, "dur": 0,
            "args": {"cuda_sync_kind": "Stream Wait Event", "stream": stream, "correlation": corr,
                     "wait_on_stream": on, "wait_on_cuda_event_record_corr_id": record_corr}}  # fmt: skip


def rank_trace(rank: int, fwd_us: float, late_us: float = 0.0, sync: bool = True) -> dict[str, Any]:
    t0 = 1000.0 + 7777 * rank  # each host has its own clock
    ar_end = t0 + fwd_us + 1400  # recorded NCCL kernel end (its duration is re-simulated anyway)
    nccl_args = {"Collective name": "allreduce", "In msg nelems": NELEMS, "Out msg nelems": NELEMS, "Group size": 2,
                 "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}  # fmt: skip
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": t0 - 50, "dur": 3e3},
        runtime("cudaLaunchKernel", 10, t0 - 40),
        kernel("ampere_sgemm_128x64_nn", 7, 10, t0, fwd_us),
        runtime("cudaEventRecord", 11, t0 - 30),
        runtime("cudaStreamWaitEvent", 12, t0 - 29),
        runtime("cudaLaunchKernel", 13, t0 - 28),
        kernel(NCCL, 20, 13, t0 + fwd_us, 1400, **nccl_args),
        runtime("cudaLaunchKernel", 14, t0 - 20),
        kernel("ampere_sgemm_64x64_tn", 7, 14, t0 + fwd_us, 150),
        runtime("cudaEventRecord", 15, t0 - 10),
        runtime("cudaStreamWaitEvent", 16, t0 - 9),
        runtime("cudaLaunchKernel", 17, t0 - 8),
        kernel("multi_tensor_apply_kernel", 7, 17, ar_end + late_us, 50),
    ]
    if sync:
        ev += [wait_event(20, 7, 11, 12, t0 + fwd_us), wait_event(7, 20, 15, 16, ar_end)]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}], "traceEvents": ev}  # fmt: skip


def write(tmp_path: Path, traces: list[dict[str, Any]]) -> list[Path]:
    paths = []
    for t in traces:
        p = tmp_path / f"trace_rank{t['distributedInfo']['rank']}.json"
        p.write_text(json.dumps(t))
        paths.append(p)
    return paths


def t_ar_us() -> float:
    """Ring all-reduce of 16 MiB on 2 ranks: 2(n-1)/n * S / B plus two link latencies (1 us each)."""
    return 2 * 1 / 2 * NELEMS * 4 * 8 / B * 1e6 + 2


def topo2():
    return leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us", name="pair")


def test_import_gives_the_expected_nodes_and_deps(tmp_path: Path) -> None:
    graph, rep = import_kineto(write(tmp_path, [rank_trace(0, 200), rank_trace(1, 300)]), gaps="drop")
    assert (rep.kernels, rep.collectives, rep.sync_deps, rep.nccl_issue_deps) == (6, 2, 4, 0)
    nodes = graph.program_of(0).nodes
    # The all-reduce's wait comes where first needed: before the optimizer that waits for it, after the backward
    # GEMM that overlaps it (so async calls on several streams all issue before any wait blocks the rank).
    assert [type(n).__name__ for n in nodes] == ["Compute", "Coll", "Compute", "Wait", "Compute", "Step"]
    fwd, ar, bwd, wait, opt, step = nodes
    assert fwd == Compute(0, "ampere_sgemm_128x64_nn", 200_000)
    assert isinstance(ar, Coll) and (ar.kind, ar.nbytes, ar.dtype, ar.stream) == ("all_reduce", NELEMS * 4, "fp32", 1)
    assert ar.deps == (0,)  # the NCCL stream waits for the forward GEMM (Stream Wait Event)
    assert isinstance(wait, Wait) and wait.refs == (1,) and wait.stream == 1
    assert bwd.stream == 0 and bwd.deps == ()
    assert opt.deps == (3,)  # the optimizer waits for the all-reduce's completion
    assert isinstance(step, Step) and set(step.deps) == {3, 4}
    assert graph.group_of(0, ar.slot) == (0, 1)


def test_replay_follows_the_critical_path(tmp_path: Path) -> None:
    """Rank 1 issues last (300 us): the step ends at 300 + all-reduce + 50 us of optimizer; bwd is hidden."""
    paths = write(tmp_path, [rank_trace(0, 200, late_us=20), rank_trace(1, 300)])
    want = 300 + t_ar_us() + 50
    graph, _ = import_kineto(paths, gaps="drop")
    res = replay_graph(graph, topo2(), FlowSimulator(topo2()), IDEAL)
    assert res.step_times_ns[0] / 1e3 == pytest.approx(want, abs=0.01)
    # Kept gaps: rank 0's optimizer was launched 20 us after the all-reduce ended in the recording.
    graph, rep = import_kineto(paths, gaps="keep")
    assert rep.idle_ns == 20_000
    res = replay_graph(graph, topo2(), FlowSimulator(topo2()), IDEAL)
    assert res.step_times_ns[0] / 1e3 == pytest.approx(want + 20, abs=0.01)


def test_without_sync_events_the_collective_still_waits_for_its_producer(tmp_path: Path) -> None:
    paths = write(tmp_path, [rank_trace(0, 200, sync=False), rank_trace(1, 300, sync=False)])
    graph, rep = import_kineto(paths, gaps="drop")
    assert rep.sync_deps == 0 and rep.nccl_issue_deps == 2
    res = replay_graph(graph, topo2(), FlowSimulator(topo2()), IDEAL)
    # The optimizer no longer waits (that wait cannot be inferred); the step still ends with the all-reduce.
    assert res.step_times_ns[0] / 1e3 == pytest.approx(300 + t_ar_us(), abs=0.01)


def test_cli_replays_a_gzipped_trace_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "traces"
    d.mkdir()
    for t in (rank_trace(0, 200), rank_trace(1, 300)):
        (d / f"r{t['distributedInfo']['rank']}.json.gz").write_bytes(gzip.compress(json.dumps(t).encode()))
    rc = main(["replay", str(d), "--topology", "testbed16", "--gaps", "drop", "--save-graph", str(tmp_path / "g")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "imported 2 rank trace(s): 6 kernels, 2 collectives" in out and "all_reduce" in out
    assert (tmp_path / "g" / "graph.json").is_file()


# ----- bad traces --------------------------------------------------------------------------------------------------
def test_truncated_trace_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(rank_trace(0, 200))[:300])
    with pytest.raises(InputError, match=rf"{p}: corrupt or truncated trace"):
        import_kineto([p])


def test_kernel_without_stream_names_the_event(tmp_path: Path) -> None:
    t = rank_trace(0, 200)
    del t["traceEvents"][2]["args"]["stream"]
    t["distributedInfo"]["world_size"] = 1
    (p,) = write(tmp_path, [t])
    with pytest.raises(InputError, match=r"field 'traceEvents\[2\]\.args\.stream'"):
        import_kineto([p])


def test_nccl_kernel_without_sizes_says_so(tmp_path: Path) -> None:
    traces = [rank_trace(0, 200), rank_trace(1, 300)]
    for t in traces:
        for ev in t["traceEvents"]:
            if ev["name"] == NCCL:
                ev["args"] = {k: v for k, v in ev["args"].items() if "nelems" not in k}
    with pytest.raises(InputError, match=r"traceEvents\[6\].*In msg nelems.*cannot be inferred"):
        import_kineto(write(tmp_path, traces))


def test_not_a_chrome_trace(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"op": []}')
    with pytest.raises(InputError, match="field 'traceEvents'"):
        import_kineto([p])
    with pytest.raises(InputError, match="need one trace per rank"):
        import_kineto(write(tmp_path, [rank_trace(0, 200)]))


# ----- one rank's trace standing for all (SPMD replication) --------------------------------------------------------
HTA = Path(__file__).resolve().parent / "data" / "hta" / "nccl_rank0_step4.json.gz"  # see data/hta/README.md


def test_a_single_rank_trace_is_refused_with_the_replication_hint() -> None:
    with pytest.raises(
        InputError, match=r"need one trace per rank of the world \(2\); got ranks \[0\].*--replicate-rank 0"
    ):
        import_kineto([HTA])


def test_the_replicated_rank_stands_for_every_rank_and_replays_in_closed_form(tmp_path: Path) -> None:
    """Rank 0's trace alone, replicated to both ranks: 200 us forward, the all-reduce, 50 us of optimizer."""
    (p,) = write(tmp_path, [rank_trace(0, 200)])
    graph, rep = import_kineto([p], gaps="drop", replicate_rank=0)
    assert graph.world == 2 and len(graph.programs) == 1  # both ranks run the same program
    assert (rep.replicated_from, rep.kernels, rep.collectives) == (0, 3, 1)  # counts of the traced rank
    assert "SPMD assumption" in rep.notes[0]
    res = replay_graph(graph, topo2(), FlowSimulator(topo2()), IDEAL)
    assert res.step_times_ns[0] / 1e3 == pytest.approx(200 + t_ar_us() + 50, abs=0.01)
    with pytest.raises(InputError, match="no trace of rank 1 to replicate"):
        import_kineto([p], replicate_rank=1)


def test_replicated_subgroup_collectives_run_in_each_ranks_own_group(tmp_path: Path) -> None:
    """Rank 3 of 8 all-reduces over its tensor-parallel pair [2, 3]: rank r gets the pair that holds it."""
    t = rank_trace(3, 200)
    t["distributedInfo"]["world_size"] = 8
    for ev in t["traceEvents"]:
        if ev["name"] == NCCL:
            ev["args"]["Process Group Ranks"] = "[2, 3]"
    (p,) = write(tmp_path, [t])
    graph, _ = import_kineto([p], replicate_rank=3)
    for r in range(8):
        coll = next(n for n in graph.program_of(r).nodes if isinstance(n, Coll))
        assert graph.group_of(r, coll.slot) == (r - r % 2, r - r % 2 + 1)
    for ev in t["traceEvents"]:
        if ev["name"] == NCCL:
            ev["args"]["Process Group Ranks"] = "[0, 3]"  # spaced 3 apart: no tiling of 8 ranks
    p.write_text(json.dumps(t))
    with pytest.raises(InputError, match=r"cannot replicate a collective on ranks \[0, 3\]"):
        import_kineto([p], replicate_rank=3)


def test_a_real_single_rank_trace_replays_replicated(capsys: pytest.CaptureFixture[str]) -> None:
    """HTA's rank 0 of a 2-rank NCCL job: both ranks run its 7 collectives; the step lies between the busiest
    stream's kernels alone and every kernel and collective one after the other."""
    events = json.loads(gzip.decompress(HTA.read_bytes()))["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    nccl = [e for e in gpu if e["name"].startswith("ncclKernel")]
    graph, rep = import_kineto([HTA], gaps="drop", replicate_rank=0)
    assert graph.world == 2 and rep.collectives == len(nccl) == 7 and rep.kernels == len(gpu) - len(nccl)
    by_stream: dict[int, float] = {}
    for e in gpu:
        if e not in nccl:
            by_stream[e["args"]["stream"]] = by_stream.get(e["args"]["stream"], 0.0) + e["dur"]
    comm_us = 0.0
    for e in nccl:  # on 2 ranks a ring all-reduce (2(n-1)/n S) and a broadcast both send S; + 2 link latencies
        nbytes = e["args"]["In msg nelems"] * {"Float": 4, "Long": 8}[e["args"]["dtype"]]
        comm_us += nbytes * 8 / B * 1e6 + 2
    res = replay_graph(graph, topo2(), FlowSimulator(topo2()))
    step_us = res.step_times_ns[0] / 1e3
    assert max(by_stream.values()) <= step_us <= sum(by_stream.values()) + comm_us
    rc = main(["replay", str(HTA), "--topology", "testbed16", "--replicate-rank", "0", "--gaps", "drop"])
    out = capsys.readouterr().out
    assert rc == 0 and "replicated to 2 ranks" in out and "SPMD assumption: the trace of rank 0" in out
