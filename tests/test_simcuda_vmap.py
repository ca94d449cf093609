"""Tensors made on the simulated GPU inside torch.func transforms (tests/scripts/cuda_vmap_factory.py, one rank):
under vmap the dispatch mode is not consulted for a tensor no transform wraps, so `torch.tensor(..., device="cuda")`
reached torch's own CUDA backend (torchtitan's context parallelism, FlexAttention's int index in a mask function).
Expected values are closed forms."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_vmap_factory.py"


def test_cuda_factories_inside_vmap_and_a_block_mask(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, timeout_s=300))
    seen = json.loads(out.read_text())
    assert seen["y"] == [[2 * v + 1 for v in range(r, r + 3)] for r in (0, 3)] and seen["y_device"] == "cuda:0"
    # 256 tokens in 128-token blocks, documents [0, 96) and [96, 256), causal within a document: the (q, k) block
    # pairs with a visible token are (0, 0), (1, 0) (query 128.. sees keys 96..127 of its document) and (1, 1)
    assert seen["blocks_shape"] == [1, 1, 2, 2] and seen["blocks"] == [1, 0, 1, 1]
