"""torch.save / torch.load on the simulated GPU: a GPU's checkpoint format, loaded back where a GPU loads it.

The probe (tests/scripts/cuda_checkpoint.py) trains a small model with a tied weight one AdamW step on
cuda:RANK, saves model, optimizer, a float8 tensor and a view, loads them back in several ways, and resumes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from phantora.launcher import RunConfig, launch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "cuda_checkpoint.py"
SHAPES = {"emb.weight": [64, 32], "mid.weight": [32, 32], "mid.bias": [32], "out.weight": [64, 32], "scale": [32]}


@pytest.fixture(scope="module", params=["real", "phantom"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict]:
    tensors = request.param
    out = tmp_path_factory.mktemp(f"ckpt-{tensors}")
    launch(RunConfig(str(SCRIPT), [str(out), tensors], "testbed16", nproc=2, tensors=tensors, timeout_s=300))
    return tensors, out, json.loads((out / "seen1.json").read_text())


def test_a_checkpoint_loads_back_onto_the_device_map_location_names(run: tuple[str, Path, dict]) -> None:
    tensors, _, seen = run
    assert seen["model"]["steps"] == ["cuda:1", "torch.int64", []]  # integers keep their values in both modes
    for name, shape in SHAPES.items():
        device, dtype, got = seen["model"][name]
        assert got == shape and dtype == ("torch.bfloat16" if name == "scale" else "torch.float32")
        assert device == ("cuda:1" if tensors == "real" else "meta"), name  # phantom: saved without data
    assert seen["resumed_devices"] == ["cuda:1"]
    assert seen["bad_device"].startswith("Attempting to deserialize object on CUDA device 7")
    assert "torch.cuda.device_count() is 2" in seen["bad_device"]
    if tensors == "real":
        assert seen["f8"] == ["cuda:1", "torch.float8_e4m3fn"]  # saved as torch saves its newer dtypes (v3)
        assert seen["exp_avg"] == ["cuda:1"] * 3
        assert seen["default"] == "cuda:1" and seen["to_cpu"] == "cpu" and seen["remapped"] == "cuda:0"
        assert seen["tied"] and seen["row_is_view"]  # shared storage stays shared
        assert seen["equal"] and seen["f8_equal"] and seen["row_equal"]
        # the resumed model takes the original's next step exactly
        assert seen["resumed_equal"]


def test_loading_allocates_the_checkpoints_storages_on_the_device(run: tuple[str, Path, dict]) -> None:
    """Each storage once (the tied weight and the view share theirs), in the caching allocator's 512-byte blocks.
    Real mode: steps, scale, emb, mid.weight, mid.bias; AdamW's two moments of emb, mid.weight, mid.bias and
    its three step counts (map_location moves them too); the float8 tensor. Phantom mode: only what keeps a
    value (the int64 buffer and the three step counts); the rest was saved without data."""
    tensors, _, seen = run

    def block(n: int) -> int:
        return -(-n // 512) * 512

    params = [64 * 32 * 4, 32 * 32 * 4, 32 * 4]
    real = block(8) + block(32 * 2) + sum(block(n) for n in params) + 2 * sum(block(n) for n in params)
    real += 3 * block(4) + block(8)
    assert seen["allocated_by_load"] == (real if tensors == "real" else block(8) + 3 * block(4))


def test_the_file_is_a_gpu_checkpoint_anywhere(run: tuple[str, Path, dict]) -> None:
    """Outside phantora: real mode wrote CUDA storages (location cuda:1) holding the values; phantom mode wrote
    torch's data-less meta records (shapes and dtypes, no bytes) for its phantom tensors."""
    tensors, out, seen = run
    locations: list[str] = []

    def where(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage:
        locations.append(location)
        return storage

    loaded = torch.load(out / "ckpt1.pt", map_location=where)
    model = loaded["model"]
    assert {k: list(v.shape) for k, v in model.items() if k in SHAPES} == SHAPES
    if tensors == "real":
        host = torch.load(out / "host1.pt")
        assert all(torch.equal(model[k], host["model"][k]) for k in SHAPES)
        assert torch.equal(loaded["f8"].float(), host["f8"].float())
        assert set(locations) == {"cuda:1", "cpu"}  # AdamW's step counts live on the host
        assert locations.count("cpu") == 3
    else:
        assert all(model[k].is_meta for k in SHAPES)
        assert locations == ["cuda:1", "cpu", "cpu", "cpu"]  # data only where it has values: the int64 buffer
        assert model["steps"].device.type == "cpu" and model["steps"].item() == 1
        assert seen["saved_bytes"] < 8 * 1024  # the parameters alone are 49 KB


DCP = ROOT / "tests" / "scripts" / "cuda_dcp.py"


def test_dcp_saves_and_loads_fsdp2_shards_on_the_device(tmp_path: Path) -> None:
    """torch.distributed.checkpoint of an FSDP2 model and Adam over 2 ranks (real mode): loading gives back the
    saved values, and the resumed step equals the step taken from the original state. Outside phantora, torch's
    own converter reads the checkpoint into the full tensors the ranks held."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = tmp_path / "ckpt"
    launch(RunConfig(str(DCP), [str(ckpt), str(tmp_path)], "testbed16", nproc=2, timeout_s=300))
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["loaded_equal"] and seen["moved_on"] and seen["resumed_equal"]
    assert seen["shards"] == {
        "0.weight": ["cuda:0", [8, 8]],
        "0.bias": ["cuda:0", [8]],
        "2.weight": ["cuda:0", [2, 16]],
        "2.bias": ["cuda:0", [2]],
    }
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    dcp_to_torch_save(ckpt, tmp_path / "converted.pt")
    converted = torch.load(tmp_path / "converted.pt")["model"]
    full = torch.load(tmp_path / "full.pt")
    assert converted.keys() == full.keys() and all(torch.equal(converted[k], full[k]) for k in full)
