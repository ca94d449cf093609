"""FlexAttention's FLASH backend on the simulated GPU: refused where torch 2.13's Inductor refuses it on a GPU without
the `flash_attn.cute` package (runtime/flex_attention.py `refuse_flash`), run where torch ignores the option."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_flex_flash.py"

# torch 2.13's text (torch/_inductor/kernel/flex/flex_flash_attention.py, `_use_flex_flash_attention`)
REFUSED = "BACKEND='FLASH' but flash attention cannot be used: CUTE flash attention library is not available."


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is installed")
def test_flash_backend_is_refused_only_under_inductor(tmp_path: Path) -> None:
    """Compiled with Inductor the FLASH call stops with torch's message; eagerly (torch's eager backend), under
    aot_eager, and with the TRITON backend the same call runs: a (1, 2, 128, 16) output on cuda:0."""
    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, timeout_s=120))
    seen = json.loads(out.read_text())
    assert seen["inductor"]["error"].startswith(REFUSED)
    assert "pip install --pre flash-attn-4" in seen["inductor"]["error"]
    for name in ("eager", "aot_eager", "inductor_triton"):
        assert seen[name] == {"error": None, "shape": [1, 2, 128, 16], "device": "cuda:0"}, name
