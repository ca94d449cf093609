"""A Python list (or numpy array) index on a cuda tensor (`x[[1, 5]]`, `x[:, [0, 2]] = 0`) indexes on the simulated
GPU as on a CUDA tensor, with the host's values (simcuda/list_index.py). Before, torch's C++ made the index tensor
past the simulated GPU and the run stopped ("reached aten::empty_strided on torch's own CUDA backend")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "cuda_list_index.py"
SHAPES = {
    "rows": [2, 8],
    "columns": [6, 3],
    "pairs": [2],
    "mask list": [3, 8],
    "nested": [2, 2, 8],
    "numpy": [2, 8],
    "empty": [0, 8],
}


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_list_indices_read_and_write_cuda_tensors(tmp_path: Path, tensors: str) -> None:
    seen_file = tmp_path / "seen.json"
    launch(
        RunConfig(
            str(SCRIPT), [str(seen_file), tensors], "testbed16", nproc=1, tensors=tensors, out_dir=tmp_path / "run"
        )
    )
    seen = json.loads(seen_file.read_text())
    for name, shape in SHAPES.items():
        assert seen[name]["device"] == "cuda:0" and seen[name]["shape"] == shape, name
        if tensors == "real":
            assert seen[name]["equal"], name  # the host's indexing of the same values
    assert seen["as tuple"]["shape"] == [6, 2] and seen["as tuple"]["warned"]
    assert seen["written"]["device"] == "cuda:0"
    if tensors == "real":
        assert seen["as tuple"]["equal"] and seen["written"]["equal"]
        assert seen["grad rows"] == [0.0, 8.0, 0.0, 0.0, 0.0, 16.0]  # 8 columns of ones; row 5 picked twice
