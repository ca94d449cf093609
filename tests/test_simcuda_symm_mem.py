"""torch's symmetric memory on the simulated GPU (simcuda/symm_mem.py): `get_backend` of a cuda device answers "CUDA"
as a CUDA build does (None for the CPU, as before), and a symmetric buffer on the GPU (`empty`, `rendezvous`) stops
the run with phantora's one line naming the call. Before, `get_backend` answered None (torchtitan's MinimalAsyncEP
then stopped with "requires the symmetric-memory CUDA backend, got None") and `empty` with torch's "SymmetricMemory
MemPool did not find backend for device type cuda"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.errors import PhantoraError
from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_symm_mem.py"


@pytest.mark.parametrize("call", ["empty", "rendezvous"])
def test_symmetric_memory_on_the_gpu_is_said_not_simulated(tmp_path: Path, call: str) -> None:
    with pytest.raises(PhantoraError) as err:
        launch(RunConfig(str(SCRIPT), [str(tmp_path), call], "testbed16", nproc=1, trace="none",
                         out_dir=tmp_path / "run", timeout_s=120))  # fmt: skip
    assert f"torch.distributed._symmetric_memory.{call}" in str(err.value)
    assert "is not simulated by phantora" in str(err.value)
    assert json.loads((tmp_path / "seen.json").read_text()) == {"backend": "CUDA", "cpu": None}
