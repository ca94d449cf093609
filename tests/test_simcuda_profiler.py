"""torch.profiler asked for CUDA activity on the simulated GPU (`simcuda/profiler_cuda.py`): the profiled window's
simulated kernels, copies and collectives are in what it exports, at the simulated times phantora's own trace.json
gives them, and the CPU ops are on the same simulated timeline; torch's C++ traceback at every op ("Failed to record
CUDA event. CUDA used in profiler but not enabled.") is gone."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity as A

from phantora.launcher import RunConfig, launch
from phantora.runtime.compute import build_model
from phantora.runtime.gpu_window import NOT_KERNELS, GpuSpan
from phantora.runtime.session import HOST_WORK, NCCL_LAUNCH
from phantora.runtime.simcuda.profiler_cuda import without_cuda
from phantora.runtime.simcuda.profiler_export import NCCL_STREAM_BASE, nccl_streams

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_profiler.py"
STEPS, ACTIVE = 5, (2, 3)  # the script's steps, and those its schedule (1 wait, 1 warmup, 2 active) profiles


def test_cuda_is_dropped_from_the_activities() -> None:
    assert without_cuda([A.CPU, A.CUDA]) == [A.CPU]
    assert without_cuda([A.CUDA]) == [A.CPU]
    assert without_cuda([{A.CUDA: ["x"], A.CPU: ["y"]}]) == [{A.CPU: ["y"]}]
    assert without_cuda(None) is None


def test_overlapping_collectives_take_more_nccl_streams() -> None:
    spans = [GpuSpan("a#0", 0, 10, None, 0, True), GpuSpan("k", 0, 5, 0, 0, True), GpuSpan("b#1", 5, 20, None, 0, True),
             GpuSpan("c#2", 10, 30, None, 0, True)]  # fmt: skip
    assert nccl_streams(spans) == {0: NCCL_STREAM_BASE, 2: NCCL_STREAM_BASE + 1, 3: NCCL_STREAM_BASE}
    side = GpuSpan("k", 0, 5, 150, 0, True)  # side stream 150's track is 157: the NCCL streams start at 200
    assert nccl_streams([*spans, side]) == {0: 200, 2: 201, 3: 200}


def test_the_lanes_idle_waits_are_not_kernels() -> None:
    """The window leaves out the compute lane's waits for the host by the names the session gives them."""
    assert NOT_KERNELS == (NCCL_LAUNCH, HOST_WORK)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("profiled")
    prof = tmp / "prof"
    prof.mkdir()
    report = launch(RunConfig(str(SCRIPT), [str(prof)], "testbed16", nproc=2, tensors="real", trace="ops",
                              trace_steps=0, out_dir=tmp / "run"))  # fmt: skip
    return tmp, report


def _profile(tmp: Path, rank: int) -> dict[str, Any]:
    p = tmp / "prof" / ("rank0.json" if rank == 0 else "rank1.json.gz")
    raw = gzip.decompress(p.read_bytes()) if rank else p.read_bytes()
    return json.loads(raw)


def _phantora_spans(tmp: Path, rank: int) -> list[tuple[str, float, float]]:
    """trace.json's compute and comm spans of `rank` as (name, ts, dur), in time order."""
    events = json.loads((tmp / "run" / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("pid") == rank and e.get("cat") in ("compute", "comm")]
    return [(e["name"], e["ts"], e["dur"]) for e in sorted(spans, key=lambda e: e["ts"])]


def test_the_rank_says_once_where_the_gpu_is(run: tuple[Path, Any]) -> None:
    log = run[1].logs["rank 0"]
    assert "Failed to record CUDA event" not in log
    assert log.count("torch.profiler's CUDA activity is the simulated GPU's") == 1


@pytest.mark.parametrize("rank", [0, 1])
def test_the_rank_names_each_trace_it_exported_and_its_window(run: tuple[Path, Any], rank: int) -> None:
    """One line a trace, naming the path the program gave (rank 1's `.gz`, not torch's temporary file), its GPU
    events and its window in simulated ms: the active steps' matmul, all-reduce and copy, 3 a step."""
    tmp, report = run
    doc = _profile(tmp, rank)
    start, end = doc["phantora"]["window_ns"]
    path = tmp / "prof" / ("rank0.json" if rank == 0 else "rank1.json.gz")
    said = [ln for ln in report.logs[f"rank {rank}"].splitlines() if ln.startswith("phantora: torch.profiler's trace")]
    assert said == [
        f"phantora: torch.profiler's trace {path}: the simulated GPU's {3 * len(ACTIVE)} kernels, copies and "
        f"collectives of {start / 1e6:.3f}-{end / 1e6:.3f} ms simulated (trace.json's timeline)"
    ]
    assert len([e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")]) == 3 * len(ACTIVE)


@pytest.mark.parametrize("rank", [0, 1])
def test_the_trace_holds_the_active_steps_kernels_at_their_simulated_times(run: tuple[Path, Any], rank: int) -> None:
    tmp = run[0]
    doc = _profile(tmp, rank)
    gpu = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")]
    assert {(e["pid"], e["args"]["device"]) for e in gpu} == {(rank, rank)}  # each rank's own GPU
    got = sorted(((e["args"].get("collective", e["name"]), e["ts"], e["dur"]) for e in gpu), key=lambda x: (x[1], x[0]))
    # phantora's trace: the two set-up kernels, then a matmul, an all-reduce and a copy each step
    mine = _phantora_spans(tmp, rank)
    assert [n for n, _, _ in mine] == ["aten.randn", "aten.ones"] + [
        n for i in range(STEPS) for n in ("aten.mm", f"all_reduce#{i}", "aten._to_copy")
    ]
    want = [s for i in ACTIVE for s in mine[2 + 3 * i : 5 + 3 * i]]
    assert got == sorted(want, key=lambda x: (x[1], x[0]))
    streams = {e["name"]: e["tid"] for e in gpu}
    assert streams == {"aten.mm": 7, "aten._to_copy": 7, "nccl:all_reduce": NCCL_STREAM_BASE}
    assert doc["baseTimeNanoseconds"] == 0 and "simulated" in doc["phantora"]["note"]


def test_a_matmul_lasts_the_compute_models_charge(run: tuple[Path, Any]) -> None:
    a = torch.empty(512, 512, device="meta")
    charge = build_model("calibrated", "h100").cost(torch.ops.aten.mm.default, (a, a), {}, a @ a).ns
    mm = [e for e in _profile(run[0], 0)["traceEvents"] if e.get("cat") == "kernel" and e["name"] == "aten.mm"]
    assert [e["dur"] for e in mm] == [charge / 1000.0] * len(ACTIVE)


def test_the_cpu_ops_are_on_the_simulated_timeline(run: tuple[Path, Any]) -> None:
    events = _profile(run[0], 0)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and e["name"] == "aten.mm"), key=lambda e: e["ts"])
    steps = sorted((e for e in events if str(e.get("name")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == [f"ProfilerStep#{i}" for i in ACTIVE]
    assert [e["ts"] for e in steps] == [e["ts"] for e in kernels]  # each step begins with its matmul
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    launched = [ops[k["args"]["External id"]] for k in kernels]  # the op each kernel names as its launcher
    assert [(e["name"], e["ts"], e["dur"]) for e in launched] == [("aten::mm", k["ts"], k["dur"]) for k in kernels]
    flows = {(e["ph"], e["id"]): e for e in events if e.get("cat") == "ac2g"}  # an arrow from each op to its kernel
    for op, k in zip(launched, kernels, strict=True):
        start, end = flows["s", k["args"]["correlation"]], flows["f", k["args"]["correlation"]]
        assert (start["pid"], start["tid"], start["ts"]) == (op["pid"], op["tid"], op["ts"])
        assert (end["pid"], end["tid"], end["ts"]) == (k["pid"], k["tid"], k["ts"])


def test_key_averages_has_the_kernels_in_its_cuda_columns(run: tuple[Path, Any]) -> None:
    tmp = run[0]
    rows = {r["name"]: r for r in json.loads((tmp / "prof" / "avg0.json").read_text())}
    mm = _profile(tmp, 0)["traceEvents"]
    mm_us = next(e["dur"] for e in mm if e.get("cat") == "kernel" and e["name"] == "aten.mm")
    assert rows["aten.mm"]["count"] == len(ACTIVE)
    assert rows["aten.mm"]["self_cuda_us"] == pytest.approx(len(ACTIVE) * mm_us)
    assert rows["aten::mm"]["cuda_us"] == pytest.approx(len(ACTIVE) * mm_us)  # the op that launched it
    assert rows["nccl:all_reduce"]["count"] == len(ACTIVE)
    table = (tmp / "prof" / "table0.txt").read_text()
    assert "Self CUDA" in table and table.index("nccl:all_reduce") < table.index("aten.mm")  # sorted by it


def test_without_a_trace_the_kernels_are_there_and_a_cpu_profile_is_torchs(tmp_path: Path) -> None:
    """`--trace none` records nothing for trace.json; the profile still gets its kernels, and so does the autograd
    profiler's with `use_device="cuda"`. A CPU-only profile stays in host wall time, without the simulated GPU."""
    script = SCRIPT.with_name("cuda_profiler_alone.py")
    report = launch(RunConfig(str(script), [str(tmp_path)], "testbed16", nproc=1, tensors="real", trace="none"))
    assert "Failed to record CUDA event" not in report.logs["rank 0"]
    a = torch.empty(512, 512, device="meta")
    charge = build_model("calibrated", "h100").cost(torch.ops.aten.mm.default, (a, a), {}, a @ a).ns / 1000.0
    doc = json.loads((tmp_path / "cuda.json").read_text())
    mm = sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    assert [e["name"] for e in mm] == ["aten.mm"] * 3 and [e["dur"] for e in mm] == [charge] * 3
    assert [e["ts"] - mm[0]["ts"] for e in mm] == pytest.approx([0.0, charge, 2 * charge])  # back to back
    cpu = json.loads((tmp_path / "cpu.json").read_text())
    assert "phantora" not in cpu and cpu["baseTimeNanoseconds"] > 0
    assert not [e for e in cpu["traceEvents"] if e.get("cat") == "kernel"]
    assert "aten::mm" in {e.get("name") for e in cpu["traceEvents"] if e.get("cat") == "cpu_op"}
    legacy = json.loads((tmp_path / "legacy.json").read_text())["traceEvents"]
    assert [(e["name"], e["dur"]) for e in legacy if e.get("cat") == "kernel"] == [("aten.mm", charge)]
