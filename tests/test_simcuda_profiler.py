"""torch.profiler asked for CUDA activity on the simulated GPU (`simcuda/profiler_cuda.py`): the CPU ops are
profiled, the rank says once where the GPU timeline is, and torch's C++ traceback at every op ("Failed to record
CUDA event. CUDA used in profiler but not enabled.") is gone."""

from __future__ import annotations

import json
from pathlib import Path

from torch.profiler import ProfilerActivity as A

from phantora.launcher import RunConfig, launch
from phantora.runtime.simcuda.profiler_cuda import without_cuda

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_profiler.py"


def test_cuda_is_dropped_from_the_activities() -> None:
    assert without_cuda([A.CPU, A.CUDA]) == [A.CPU]
    assert without_cuda([A.CUDA]) == [A.CPU]
    assert without_cuda([{A.CUDA: ["x"], A.CPU: ["y"]}]) == [{A.CPU: ["y"]}]
    assert without_cuda(None) is None


def test_a_program_profiles_its_cpu_ops(tmp_path: Path) -> None:
    trace = tmp_path / "prof.json"
    report = launch(RunConfig(str(SCRIPT), [str(trace)], "testbed16", nproc=1, tensors="real", trace="none",
                              out_dir=tmp_path / "run"))  # fmt: skip
    log = report.logs["rank 0"]
    assert "Failed to record CUDA event" not in log
    assert log.count("torch.profiler records the CPU ops only") == 1
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "cpu_op"}
    assert "aten::mm" in names
