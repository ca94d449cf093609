"""torch.distributed's NCCL names on the simulated GPU (`runtime/simcuda/nccl_surface.py`): a program that builds
`ProcessGroupNCCL.Options` and trains DDP with `bf16_compress_hook` (refused by DDP unless NCCL is available) runs,
its gradient is the bf16 hook's closed form, and the options it cannot have modelled are named once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from phantora.launcher import RunConfig, launch
from phantora.runtime.simcuda import nccl_surface

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_nccl_surface.py"
V = [1.0, 1.0 / 3.0, 0.1, 1e-3]  # the script's gradient on rank r is (r + 1) * V
WORLD = 2


def bf16_hook_mean(world: int) -> list[float]:
    """What `bf16_compress_hook` gives: each rank's fp32 gradient cast to bf16 and divided by the world size in
    bf16, the bf16 sum over the ranks (NCCL's sum, in rank order), cast back to fp32."""
    parts = [(torch.tensor(V) * (r + 1)).to(torch.bfloat16).div_(world) for r in range(world)]
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total.float().tolist()


def test_options_and_the_type_are_torchs_fields() -> None:
    opts = nccl_surface.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    assert opts.is_high_priority_stream and opts.backend == "nccl"
    assert opts.config.max_ctas == opts.config.min_ctas == nccl_surface.UNDEF and opts.config.blocking == 1
    with pytest.raises(TypeError, match="init_process_group"):
        nccl_surface.ProcessGroupNCCL()


def test_a_program_with_nccl_options_and_the_bf16_hook_runs(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    report = launch(RunConfig(str(SCRIPT), [str(seen)], "testbed16", nproc=WORLD, tensors="real", trace="none",
                              out_dir=tmp_path / "run"))  # fmt: skip
    ranks = [json.loads((seen / f"rank{r}.json").read_text()) for r in range(WORLD)]
    want = bf16_hook_mean(WORLD)
    fp32_mean = [v * sum(r + 1 for r in range(WORLD)) / WORLD for v in V]
    assert any(abs(w - f) > 1e-6 for w, f in zip(want, fp32_mean, strict=True))  # bf16 is visible in the values
    for s in ranks:
        assert s["nccl_available"] and s["options_type"]
        assert s["subgroup_sum"] == [float(WORLD)] * 4
        assert s["grad"] == pytest.approx(want, rel=0, abs=0)
    grads = [c for c in report.cosim.collectives if c["kind"] == "all_reduce" and c["dtype"] == "bf16"]
    assert grads and all(c["nbytes"] == 2 * len(V) for c in grads)  # the hook all-reduces bf16: 2 B an element
    log = report.logs["rank 0"]
    assert log.count("ProcessGroupNCCL.Options.config (max_ctas=4) is not modelled") == 1
