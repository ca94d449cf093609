"""Tied parameters stay one Parameter when a module moves to the simulated GPU (phantora.runtime.simcuda.tied_params).

In phantom mode torch replaced each module's parameter on `module.to("cuda")` (a meta host tensor cannot take a
simulated-GPU tensor as its data), so GPT-2's tied embedding and output layer became two parameters: nanoGPT and
build-nanogpt trained 163M parameters instead of 124M (a second vocabulary-sized AdamW update and all-reduce).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_a_tied_weight_stays_one_parameter_on_the_simulated_gpu(tmp_path: Path, tensors: str) -> None:
    out = tmp_path / "tied.json"
    launch(RunConfig(str(SCRIPTS / "cuda_tied_weights.py"), [str(out)], "testbed16", nproc=1, tensors=tensors))
    seen = json.loads(out.read_text())
    # 96 x 16 shared weight + the layer norm's 16 + 16, as torch counts it on the host
    for stage in ("host", "cuda", "bf16"):
        assert seen[stage]["tied"] is True, stage
        assert seen[stage]["names"] == ["transformer.wte.weight", "transformer.ln.weight", "transformer.ln.bias"]
        assert seen[stage]["numel"] == 96 * 16 + 16 + 16
    assert seen["cuda"]["device"] == "cuda"
    assert seen["optimizer_tensors"] == 3


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_a_tie_torch_breaks_breaks_on_the_simulated_gpu_too(tmp_path: Path, tensors: str) -> None:
    """`to_empty` of a module built on the meta device gives each module a Parameter of its own in torch (no move in
    place), so a tie breaks and the program must tie again. The simulated GPU does what torch does on the host in
    the same program: two parameters, 2 x 96 x 16 elements."""
    out = tmp_path / "tied.json"
    script = SCRIPTS / "tied_weights_torch_semantics.py"
    launch(RunConfig(str(script), [str(out)], "testbed16", nproc=1, tensors=tensors))
    seen = json.loads(out.read_text())
    assert seen["cpu"] == {"tied": False, "numel": 2 * 96 * 16}  # torch's own behaviour
    assert seen["cuda"] == seen["cpu"]
