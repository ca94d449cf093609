"""examples/llama_train.py's --vocab: the model keeps its shapes but for the embedding and output head."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from phantora.launcher import RunConfig, launch
from phantora.topology.generators import leaf_spine

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_vocab_sets_the_embedding_and_head_size() -> None:
    """tiny (dim 64, 2 blocks, 4 heads of 16, 2 kv heads, ffn 128) with a vocabulary of 1024, worked by hand:
    a block is wq 64x64 + wk, wv 64x32 each + wo 64x64 = 12,288, the MLP 3 x 64 x 128 = 24,576, two norms
    128: 36,992; the embedding and the head 2 x 1024 x 64 = 131,072, the final norm 64: 205,120."""
    topo = leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us", name="star2")
    args = ["--model", "tiny", "--vocab", "1024", "--seq", "32", "--batch", "2", "--steps", "1", "--dtype", "fp32"]
    rep = launch(RunConfig(str(EXAMPLES / "llama_train.py"), args, topo, nproc=2, trace="none", timeout_s=300))
    assert "model tiny: 2 layers, dim 64, 205,120 params" in rep.logs["rank 0"]


def test_vocab_must_be_positive(tmp_path: Path) -> None:
    cmd = [sys.executable, str(EXAMPLES / "llama_train.py"), "--model", "tiny", "--vocab", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode != 0 and "--vocab must be >= 1, got 0" in out.stderr
