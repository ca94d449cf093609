"""Unit tests of the runtime's pure parts: GPU table, roofline, clock lanes, trace, results, time patch."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
import torch

from phantora.errors import InputError
from phantora.perfmodel.gpus import GPUS, get_gpu
from phantora.results import run_dir
from phantora.results.summary import summarize
from phantora.runtime import timepatch
from phantora.runtime.clock import VirtualClock
from phantora.runtime.compute import Roofline
from phantora.runtime.trace import TraceRecorder

aten = torch.ops.aten
H100 = get_gpu("h100")


# ----- GPU table (REFERENCE.md §2) -----------------------------------------------------------------
def test_gpu_table_matches_reference():
    assert get_gpu("H100").peak("bf16") == 989e12
    assert get_gpu("a100").peak("fp32") == 19.5e12
    assert get_gpu("h200").mem_bw == 4.8e12
    assert get_gpu("b200").mem_bytes == 192 * 10**9
    assert get_gpu("l40s").nvlink_bw == 0
    assert get_gpu("a100").peak("fp8") == get_gpu("a100").peak("bf16")  # no fp8 units: bf16 rate
    assert {"a100", "h100", "h200", "b200", "l40s"} <= set(GPUS)  # and the deployed variants (test_gpu_variants.py)


def test_unknown_gpu_names_the_field():
    with pytest.raises(InputError, match="field 'gpu'.*unknown GPU 'v100'"):
        get_gpu("v100")


# ----- roofline ---------------------------------------------------------------------------------------
def test_matmul_is_compute_bound_at_peak():
    m = Roofline(H100, launch_ns=1000)
    a, b = torch.randn(256, 512), torch.randn(512, 128)
    cost = m.cost(aten.mm.default, (a, b), {}, a @ b)
    flops = 2 * 256 * 512 * 128
    assert cost.flops == flops
    assert cost.nbytes == 4 * (256 * 512 + 512 * 128 + 256 * 128)
    assert cost.ns == math.ceil(flops / 67e12 * 1e9) + 1000


def test_bf16_matmul_uses_tensor_core_peak():
    m = Roofline(H100, launch_ns=0)
    a = torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta")  # shapes are all the model reads
    cost = m.cost(aten.mm.default, (a, a), {}, torch.empty_like(a))
    assert cost.dtype == "bf16"
    assert cost.ns == math.ceil(2 * 1024**3 / 989e12 * 1e9)


def test_elementwise_is_memory_bound():
    m = Roofline(H100, launch_ns=500)
    x, y = torch.randn(1 << 20), torch.randn(1 << 20)
    cost = m.cost(aten.add.Tensor, (x, y), {}, x + y)
    assert cost.flops == 0
    assert cost.ns == math.ceil(3 * 4 * (1 << 20) / 3.35e12 * 1e9) + 500


def test_views_and_allocations_cost_nothing():
    m = Roofline(H100)
    x = torch.randn(8, 8)
    assert m.cost(aten.view.default, (x, [64]), {}, x.view(64)).ns == 0
    assert m.cost(aten.t.default, (x,), {}, x.t()).ns == 0
    assert m.cost(aten.empty.memory_format, ([8, 8],), {}, torch.empty(8, 8)).ns == 0


def test_cpu_attention_counts_attention_flops():
    m = Roofline(H100, launch_ns=0)
    b, h, s, d = 2, 4, 128, 32
    q = torch.randn(b, h, s, d)
    out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q)
    cost = m.cost(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q), {}, out)
    assert cost.flops == 4 * b * h * s * s * d  # QK^T and PV


def test_embedding_reads_rows_not_the_table():
    m = Roofline(H100, launch_ns=0)
    table, idx = torch.randn(50_000, 64), torch.tensor([1, 2, 3])
    out = torch.nn.functional.embedding(idx, table)
    cost = m.cost(aten.embedding.default, (table, idx), {}, out)
    assert cost.nbytes == idx.numel() * 8 + 2 * out.numel() * 4


# ----- clock lanes ------------------------------------------------------------------------------------
def test_clock_join_takes_the_later_lane():
    c = VirtualClock()
    assert c.charge(100) == (0, 100)
    assert c.issue() == 100
    c.charge(50)
    assert c.join(500) == 350  # stalls from 150 to 500
    assert c.now() == 500
    c.charge(10)
    assert c.join(200) == 0  # already past it
    assert (c.now(), c.compute_busy_ns, c.waited_ns) == (510, 160, 350)


def test_clock_sync_joins_comm_lane():
    c = VirtualClock()
    c.complete(1000)
    c.charge(10)
    assert c.sync() == 1000


# ----- trace --------------------------------------------------------------------------------------------
def test_trace_lanes_and_merge(tmp_path):
    r = TraceRecorder(3)
    r.op("aten.mm", 0, 1000)
    r.comm("all_reduce#0", 500, 3000, {"bytes": 8})
    r.comm("all_reduce#1", 1000, 2000, {"bytes": 8})  # overlaps #0: second comm lane
    r.step(0, 0, 3000)
    ev = r.take_events()
    spans = {e["name"]: e for e in ev if e["ph"] == "X"}
    assert spans["aten.mm"]["ts"] == 0 and spans["aten.mm"]["dur"] == 1.0
    assert spans["all_reduce#0"]["tid"] != spans["all_reduce#1"]["tid"]
    assert {e["pid"] for e in ev} == {3}
    # the next step's collective reuses the first lane (free since 3 us); names are not repeated
    r.comm("all_reduce#2", 3000, 4000, {"bytes": 8})
    (later,) = r.take_events()
    assert later["tid"] == spans["all_reduce#0"]["tid"] and r.take_events() == []
    out = tmp_path / "run"
    r.append_to(out / "trace" / "rank3.jsonl", 0)
    r2 = TraceRecorder(4, level="coarse")
    r2.op("x", 0, 10)
    r2.op("y", 10, 30)
    r2.op("z", 50, 60)
    r2.append_to(out / "trace" / "rank4.jsonl", None)
    with open(out / "trace" / "rank4.jsonl", "a") as f:
        f.write('{"rank": 4, "step": 1, "ev')  # a line a kill cut short
    merged = json.loads(run_dir.merge_trace(out, partial=True).read_text())
    blocks = [e for e in merged["traceEvents"] if e.get("pid") == 4 and e["ph"] == "X"]
    assert [(b["name"], b["dur"]) for b in blocks] == [("compute (2 ops)", 0.03), ("compute (1 ops)", 0.01)]
    assert merged["otherData"] == {"partial": True, "steps_traced": {"3": 1, "4": 0}}
    assert not (out / "trace").exists()


def test_the_merged_trace_carries_nccls_choice_on_each_ranks_collective(tmp_path):
    """cosim.json's record of a collective (its group and NCCL's choice) lands in each member rank's span."""
    out = tmp_path / "run"
    for rank in (0, 1):
        r = TraceRecorder(rank)
        r.comm("all_reduce#0", 1000, 2000, {"bytes": 8, "group": [0, 1]})
        r.comm("broadcast#1", 3000, 4000, {"bytes": 8, "group": [0, 1]})
        r.append_to(out / "trace" / f"rank{rank}.jsonl", 0)
    choice = {"algorithm": "Ring", "protocol": "LL", "channels": 2}
    records = [{"name": "all_reduce#0", "group": [0, 1], "nccl": choice}, {"name": "broadcast#1", "group": [0, 1]}]
    merged = json.loads(run_dir.merge_trace(out, comm_args=run_dir.nccl_args(records)).read_text())
    spans = {(e["pid"], e["name"]): e["args"] for e in merged["traceEvents"] if e.get("cat") == "comm"}
    assert spans[0, "all_reduce#0"] == spans[1, "all_reduce#0"] == {"bytes": 8, "group": [0, 1], "nccl": choice}
    assert spans[0, "broadcast#1"] == {"bytes": 8, "group": [0, 1]}  # no choice recorded (ideal model): nothing added


def test_a_collectives_choice_reaches_every_rank_whatever_thread_it_names(tmp_path):
    """Once a rank has started a thread, its collectives are named with the thread that issued them (`all_gather#26
    from the program's thread`), a rank without one names the same call `all_gather#26`, and the coordinator's record
    takes one member's name: every member's span still gets the call's choice (Megatron's TP 2 x PP 2 run, whose
    ranks 0 and 2 start a thread, lost it on spans of all four ranks)."""
    out = tmp_path / "run"
    names = {0: "all_gather#26 from the program's thread", 1: "all_gather#26", 2: 'all_gather#26 from thread "bg"'}
    for rank, name in names.items():
        r = TraceRecorder(rank)
        r.comm(name, 1000, 2000, {"bytes": 32, "group": [0, 1, 2]})
        r.append_to(out / "trace" / f"rank{rank}.jsonl", 0)
    choice = {"algorithm": "Ring", "protocol": "LL", "channels": 1}
    for recorded in names.values():
        records = [{"name": recorded, "group": [0, 1, 2], "nccl": choice}]
        merged = json.loads(run_dir.merge_trace(out, comm_args=run_dir.nccl_args(records)).read_text())
        spans = {e["pid"]: e["args"].get("nccl") for e in merged["traceEvents"] if e.get("cat") == "comm"}
        assert spans == {0: choice, 1: choice, 2: choice}, recorded
        for rank, name in names.items():  # merge_trace removed the chunks: write them again
            r = TraceRecorder(rank)
            r.comm(name, 1000, 2000, {"bytes": 32, "group": [0, 1, 2]})
            r.append_to(out / "trace" / f"rank{rank}.jsonl", 0)


def test_each_span_gets_its_own_calls_choice_where_names_repeat_across_groups(tmp_path):
    """A rank numbers its collectives per group and its sends per peer, so one name is several calls: Megatron's
    TP x PP run has rank 0's `all_reduce#2` on the world (8 B, 1 channel) and on the embedding pair [0, 2]
    (327,680 B, 24 channels), and `reduce_scatter#1` on the TP pair and on its data-parallel group of one (no
    choice: no NCCL call); a pipeline's middle stage sends `send#0` to both neighbours. Each span carries its own
    call's choice (before, the first record of the name went to all of them)."""
    out = tmp_path / "run"
    r = TraceRecorder(0)
    r.comm("all_reduce#2", 1000, 2000, {"bytes": 8, "group": [0, 1, 2, 3]})
    r.comm("all_reduce#2", 3000, 4000, {"bytes": 327680, "group": [0, 2]})
    r.comm("reduce_scatter#1", 5000, 6000, {"bytes": 131072, "group": [0, 1]})
    r.comm("reduce_scatter#1", 7000, 7000, {"bytes": 727040, "group": [0]})
    r.comm("send#0", 8000, 9000, {"bytes": 65536, "group": [1]})
    r.comm("send#0", 8000, 9500, {"bytes": 65536, "group": [2]})
    r.append_to(out / "trace" / "rank0.jsonl", 0)
    world, pair, tp, nvl, net = ({"channels": c} for c in (1, 24, 16, 8, 2))
    records = [
        {"name": "all_reduce#2", "group": [0, 1, 2, 3], "nccl": world},
        {"name": "all_reduce#2", "group": [0, 2], "nccl": pair},
        {"name": "reduce_scatter#1", "group": [0, 1], "nccl": tp},
        {"name": "reduce_scatter#1", "group": [0]},
        {"name": "send#0", "group": [0, 1], "names": [[0, "send#0"], [1, "recv#0"]], "nccl": nvl},
        {"name": "send#0", "group": [0, 2], "names": [[0, "send#0"], [2, "recv#0"]], "nccl": net},
    ]
    merged = json.loads(run_dir.merge_trace(out, comm_args=run_dir.nccl_args(records)).read_text())
    spans = [e["args"] for e in merged["traceEvents"] if e.get("cat") == "comm"]
    assert [a.get("nccl") for a in spans] == [world, pair, tp, None, nvl, net]


def test_an_all_to_all_span_carries_each_pairs_choice(tmp_path):
    """NCCL runs an (uneven) all-to-all as one group of sends and receives; the coordinator records a choice per
    pair (`all_to_all#1@0.1`, Megatron's alltoall token dispatcher on EP 2: 133,120 B one way on 3 channels,
    121,856 B back on 2), and each end's `all_to_all#1` span carries both pairs, with their bytes."""
    out = tmp_path / "run"
    for rank in (0, 1):
        r = TraceRecorder(rank)
        r.comm("all_to_all#1", 1000, 2000, {"bytes": 262144, "group": [0, 1]})
        r.append_to(out / "trace" / f"rank{rank}.jsonl", 0)
    there, back = {"algorithm": "p2p", "protocol": "Simple", "channels": 3}, {"algorithm": "p2p", "channels": 2}
    names = [[0, "all_to_all#1@0.1"], [1, "all_to_all#1@0.1"]]
    records = [
        {"name": "all_to_all#1@0.1", "group": [0, 1], "nbytes": 133120, "names": names, "nccl": there},
        {"name": "all_to_all#1@0.1", "group": [1, 0], "nbytes": 121856, "names": names, "nccl": back},
    ]
    merged = json.loads(run_dir.merge_trace(out, comm_args=run_dir.nccl_args(records)).read_text())
    spans = [e["args"] for e in merged["traceEvents"] if e.get("cat") == "comm"]
    pairs = [{"src": 0, "dst": 1, "bytes": 133120, **there}, {"src": 1, "dst": 0, "bytes": 121856, **back}]
    assert [a["nccl"] for a in spans] == [{"algorithm": "p2p", "pairs": pairs}] * 2


def test_trace_rejects_unknown_level():
    with pytest.raises(InputError, match="trace"):
        TraceRecorder(0, level="all")


# ----- results ------------------------------------------------------------------------------------------
def test_summary_step_times_tokens_and_mfu():
    ranks = {
        0: {"step_ends_ns": [5_000, 15_000, 25_000], "step_busy_ns": [4_000, 12_000, 20_000], "end_ns": 25_000},
        1: {"step_ends_ns": [6_000, 14_000, 26_000], "step_busy_ns": [3_000, 9_000, 15_000], "end_ns": 26_000},
    }
    ranks[0]["workload"] = {"tokens_per_step": 1000, "flops_per_step": 1e12, "dtype": "bf16"}
    s = summarize(ranks, H100)
    assert [st["time_ns"] for st in s["steps"]] == [6_000, 9_000, 11_000]  # slowest rank ends each step
    assert [st["compute_ns"] for st in s["steps"]] == [4_000, 8_000, 8_000]
    assert s["step_time_ns"]["mean"] == 10_000  # the first step is start-up
    assert s["tokens_per_s_per_gpu"] == pytest.approx(1000 / 10e-6 / 2)
    assert s["mfu"] == pytest.approx(1e12 / (10e-6 * 2 * 989e12))


# ----- time patch ---------------------------------------------------------------------------------------
def test_time_patch_reads_simulated_clock_and_restores():
    sim = [0]
    real_pc = time.perf_counter
    timepatch.install(lambda: sim[0])
    try:
        sim[0] = 2_500_000_000
        assert time.perf_counter() == 2.5
        assert time.perf_counter_ns() == 2_500_000_000
        t0 = time.time()
        sim[0] += 1_000_000_000
        assert time.time() - t0 == pytest.approx(1.0)
        with timepatch.real_time():
            assert time.perf_counter is real_pc
        assert time.perf_counter() == 3.5
    finally:
        timepatch.uninstall()
    assert time.perf_counter is real_pc and not timepatch.installed()


# ----- command line -------------------------------------------------------------------------------------
def test_run_command_reports_bad_input(tmp_path, capsys):
    from phantora.cli import main

    assert main(["run", "--topology", "star8", str(tmp_path / "nope.py")]) == 2
    assert "nope.py: training script not found" in capsys.readouterr().err
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert main(["run", "--topology", "star8", "--gpu", "v100", str(script)]) == 2
    assert "field 'gpu'" in capsys.readouterr().err
    assert main(["run", "--topology", "star8", "--cc", "dcqcn", str(script)]) == 2
    assert "--network ns3" in capsys.readouterr().err
    assert main(["run", "--topology", "star8", "--set", "buffer_bytes=1000000", str(script)]) == 2
    assert "field 'buffer_bytes': applies to --network ns3 only" in capsys.readouterr().err
    for bad, field in (("bufer_bytes=1", "bufer_bytes"), ("buffer_bytes=-5", "buffer_bytes"), ("pfc", "pfc")):
        assert main(["run", "--topology", "star8", "--network", "ns3", "--set", bad, str(script)]) == 2
        assert f"field '{field}'" in capsys.readouterr().err


def _run_spec(*argv: str) -> Any:
    """`phantora run`'s RunConfig.engine for a command line: the one object the run carries."""
    from phantora.cli import build_parser
    from phantora.commands.run import engine_spec

    return engine_spec(build_parser().parse_args(["run", "--topology", "star8", *argv, "x.py"]))


def test_ns3_engine_spec_of_a_live_run():
    """The CC, 1 us queue sampling (compare's queue p99) and --set overrides, checked before launch, and the
    spec the network server rebuilds from the wire is the launcher's, field for field."""
    from bridge.runspec import RunSpec
    from phantora.launcher import RunConfig
    from phantora.netsim.cli_config import QUEUE_SAMPLE_NS
    from phantora.topology import load_topology

    flow = _run_spec()
    assert (flow.network, flow.window_ns, flow.packet_used) == ("flow", 0, None)
    default = RunConfig("x.py").engine  # a RunConfig's default engine: the flow network, exact
    assert (default.network, default.window_ns, default.packet_used) == ("flow", 0, None)
    spec = _run_spec("--network", "ns3", "--cc", "hpcc", "--set", "buffer_bytes=2000000", "--set", "pfc=false")
    config = spec.packet
    assert (config.cc, config.buffer_bytes, config.pfc, config.queue_sample_ns) == ("hpcc", 2_000_000, False, 1000)
    assert QUEUE_SAMPLE_NS == 1000
    topo = load_topology("star8")
    wire = RunSpec.from_bytes(RunSpec(topology=topo, world=8, engine=spec).to_bytes())  # what the server reads
    assert wire.engine == spec
    # --queue-sample-ns, the same option on run, replay and netsim
    off = _run_spec("--network", "ns3", "--queue-sample-ns", "0")
    assert off.packet.queue_sample_ns == 0


def test_a_set_field_and_the_window_follow_one_object_from_the_command_line_to_ns3():
    """`--set buffer_bytes=2MB --window 5us` on `phantora run`: the RunConfig holds the EngineSpec the command line
    made, and nothing else of the engine; the wire (RunSpec) and config.json (`phantora rerun`) carry that object
    whole, and ns-3 is handed switch.BufferSize = 2,000,000 from it (packet_config.NS3_ATTRIBUTES)."""
    from bridge.runspec import RunSpec
    from phantora.launcher import RunConfig, config_options
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.results.provenance import plain
    from phantora.topology import load_topology

    engine_fields = {"network", "cc", "packet_set", "queue_sample_ns", "seed", "window_ns", "scenario"}
    assert not engine_fields & set(RunConfig.__dataclass_fields__)  # no flat engine options beside the spec
    argv = ("--network", "ns3", "--set", "buffer_bytes=2MB", "--set", "kmin_map=100Gbps 40000", "--window", "5us")
    spec = _run_spec(*argv)
    cfg = RunConfig("x.py", engine=spec)
    topo = load_topology("star8")
    wire = RunSpec.from_bytes(RunSpec(topology=topo, world=8, engine=cfg.engine).to_bytes()).engine
    recorded = json.loads(json.dumps(plain(config_options(cfg, ())["engine"])))  # config.json's options.engine
    assert wire == spec == EngineSpec.from_dict(recorded)
    assert (wire.window_ns, wire.packet.kmin_map) == (5000, {100_000_000_000: 40_000})
    params = dict(wire.packet.to_params(sorted({link.bandwidth_bps for link in topo.links})))
    assert params["switch.BufferSize"] == "2000000"
