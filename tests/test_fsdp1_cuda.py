"""FSDP1 (`FullyShardedDataParallel`) on the simulated GPU, and in-place ops that reshape a tensor.

FSDP1 shards its flat parameter with `flat_param.set_(shard)`. On the simulated GPU an in-place op ran on the data
and left the wrapper's shape as it was, so the flat parameter kept its unsharded size and FSDP stopped at its first
forward ("Expects 544 numel but got 1088", HF Accelerate's `test_merge_weights.py`); every in-place op that changes
a tensor's shape, strides, offset or storage had the same fault (tests/scripts/cuda_inplace_shapes.py against the
host). Its sharded state dict asks `_get_pg_default_device`, which had no answer for a phantora group ("Default
device not found"): a CUDA build's NCCL group answers cuda. `sync_module_states` (HF Accelerate's FSDP1) took a
simulated-GPU tensor's inner host data for a CPU parameter and refused the module; and a full state dict offloaded
to the host moves the flat parameter there in place (`flat_param.data = flat_param.to("cpu")`) and back, which was
refused (HF Trainer's `save_model` under FSDP1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_in_place_reshapes_give_the_wrapper_its_datas_shape(tmp_path: Path, tensors: str) -> None:
    out = tmp_path / "shapes.json"
    script = SCRIPTS / "cuda_inplace_shapes.py"
    launch(RunConfig(str(script), [str(out), tensors], "testbed16", nproc=1, tensors=tensors, timeout_s=300))
    seen = json.loads(out.read_text())
    assert {name: v["same"] for name, v in seen.items()} == dict.fromkeys(seen, True)
    assert (
        seen["set_storage"]["shape"] == [2, 3] and seen["t_"]["shape"] == [4, 3] and seen["set_empty"]["shape"] == [0]
    )


def test_fsdp1_trains_as_one_replica_on_every_batch_and_saves_a_sharded_state_dict(tmp_path: Path) -> None:
    out = tmp_path / "fsdp1.json"
    launch(RunConfig(str(SCRIPTS / "cuda_fsdp1.py"), [str(out)], "testbed16", nproc=2, timeout_s=300))
    seen = json.loads(out.read_text())
    assert seen["max_diff"] < 1e-5
    assert seen["shard_numel"] == (16 * 16 + 16) * 2 // 2  # both layers in one flat parameter, half a rank
    assert seen["keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert seen["shard_devices"] == ["cuda"] and seen["default_device"] == "cuda"
    assert seen["full_devices"] == ["cpu"] and seen["full_diff"] < 1e-5 and seen["flat_param_after"] == "cuda"
    assert seen["moved"] == {"host": ["Parameter", "cpu"], "back": ["SimCudaTensor", "cuda"], "same_object": True}
