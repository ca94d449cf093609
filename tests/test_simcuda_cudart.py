"""`torch.cuda.cudart()` on the simulated GPU: the runtime calls torch's Python makes succeed (simcuda/cudart.py).

It returned None on this CUDA-less torch build, so DCP's pinned-memory stager (torchtitan's
`--checkpoint.async_mode async_with_pinned_mem`) stopped in `torch.cuda._pin_memory_utils.pin_memory` with
"'NoneType' object has no attribute 'cudaHostRegister'" (docs/runtime.md, user trials). A one-rank program stages a
cuda state dict as that stager does (pinned host copies) and checks the copies' values, and calls torch's CUDA
profiler start and stop and `cudaMemGetInfo` through `cudart()`. The staged copies are host tensors: before, a
simulated-GPU tensor's `new_empty(..., device="cpu")` (the stager's) and `empty_like(x, device="cpu")` stayed on the
simulated GPU.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = """
    import torch
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    torch.cuda.set_device(0)
    state = {"w": torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4), "step": 7}
    options = StagingOptions(use_pinned_memory=True, use_shared_memory=False, use_async_staging=False)
    staged = DefaultStager(options).stage(state)
    w = staged["w"]
    print("STAGED", w.device, w.flatten().tolist() == list(range(12)), staged["step"], flush=True)
    torch.cuda.profiler.start()
    torch.cuda.profiler.stop()
    free, total = torch.cuda.cudart().cudaMemGetInfo(0)
    props = torch.cuda.get_device_properties(0)
    print("CUDART", (free, total) == torch.cuda.mem_get_info(0), total == props.total_memory, flush=True)
"""


def test_pinned_staging_and_the_cuda_profiler_calls_run(tmp_path: Path) -> None:
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent(SCRIPT))
    rep = launch(RunConfig(str(script), [], "testbed16", nproc=1, trace="none", timeout_s=120))
    log = rep.logs["rank 0"]
    assert "STAGED cpu True 7" in log
    assert "CUDART True True" in log  # the device's memory, as mem_get_info and its properties give it
