"""transformers 5 loads a checkpoint on worker threads (`core_model_loading.py`), so `from_pretrained(...,
device_map="cuda")`, the usual way to put a Hugging Face model on a GPU, copied each weight to the GPU on a thread
phantora does not simulate, and the rank stopped in one line. A rank now sets transformers' own switch,
`HF_DEACTIVATE_ASYNC_LOAD=1` (runtime/library_env.py), unless the environment sets it: the weights load on the
program's thread, each equal to the checkpoint's on the CPU, in the same order run after run. Set to 0, the loader's
threads copy the weights to the simulated GPU themselves (gpu_threads.py; until 2026-12-05 the rank stopped on the
line, naming the switch), each again equal to the checkpoint's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from phantora.launcher import RunConfig, launch
from phantora.runtime import library_env

PROGRAM = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map="cuda")
assert all(p.device.type == "cuda" for p in model.parameters())
torch.save({name: t.cpu() for name, t in model.state_dict().items()}, sys.argv[2])
"""


def test_a_variable_the_environment_sets_is_kept() -> None:
    env = {"HF_DEACTIVATE_ASYNC_LOAD": "0"}
    library_env.set_defaults(env)
    assert env == {"HF_DEACTIVATE_ASYNC_LOAD": "0"}
    empty: dict[str, str] = {}
    library_env.set_defaults(empty)
    assert empty == {"HF_DEACTIVATE_ASYNC_LOAD": "1"}


def _checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A 2-layer Llama saved with save_pretrained on the CPU (plain torch, outside phantora), and its weights."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt", {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("switch", [None, "0"])
def test_from_pretrained_onto_the_gpu_loads_the_checkpoints_weights(tmp_path: Path, switch: str | None) -> None:
    ckpt, expected = _checkpoint(tmp_path)
    script, seen = tmp_path / "load.py", tmp_path / "seen.pt"
    script.write_text(PROGRAM)
    config = RunConfig(str(script), [str(ckpt), str(seen)], "testbed16", nproc=1, out_dir=tmp_path / "out")
    if switch is not None:  # the loader's threads
        config.env = {"HF_DEACTIVATE_ASYNC_LOAD": switch}
    launch(config)
    loaded = torch.load(seen)
    assert sorted(loaded) == sorted(expected)
    for name, weight in expected.items():
        assert torch.equal(loaded[name], weight), name
