"""torch's context-parallel key/value all-gather (`cplib::flex_cp_allgather`, torchtitan's CP with FlexAttention) is
charged once: its parts (the functional all-gathers and, since they gather along the sequence, not dim 0, the
`torch.cat` that puts each rank's chunk in place; the reduce-scatters of its backward and their `cat`), not also as
a kernel of all its bytes (simcuda/composite.py `BODIES`). Before, the op ran whole on the data: its collectives were
simulated and the op was charged again by the roofline (results.json's `untimed_kernels`). The body's own
`k.contiguous()` of the non-contiguous key is charged as the copy it is (composite.py `COPIES`; before 2026-12-05
its alias schema made it a free view): a second `aten.clone` beside the script's own, each a read and a write of the
shard under the roofline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "cuda_cp_allgather.py"
SHARD = 2 * 4 * 8 * 16 * 4  # bytes of one rank's key (or value) shard, fp32


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_the_cp_all_gather_is_charged_as_its_parts_once(tmp_path: Path, tensors: str) -> None:
    seen_file, out = tmp_path / "seen.json", tmp_path / "run"
    launch(RunConfig(str(SCRIPT), [str(seen_file), tensors], "testbed16", nproc=2, gpu="h100", tensors=tensors,
                     compute_model="roofline", out_dir=out))  # fmt: skip
    seen = json.loads(seen_file.read_text())
    assert seen["shape"] == [2, 4, 16, 16]
    if tensors == "real":
        assert seen["gathered"] and seen["grads"] == [4.0, 6.0]  # both ranks' outputs use each shard: 2 x 2, 2 x 3
    results = json.loads((out / "results.json").read_text())
    assert not any(k.startswith("cplib::") for k in results.get("untimed_kernels") or {})
    comm = results["ranks"][0]["comm"]
    # two all-gathers (key, value) of 2 shards each, and the backward's two reduce-scatters of the same size
    assert comm["all_gather"]["count"] == 2 and comm["all_gather"]["bytes"] == 2 * 2 * SHARD
    assert comm["reduce_scatter"]["count"] == 2 and comm["reduce_scatter"]["bytes"] == 2 * 2 * SHARD
    trace = json.loads((out / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = [e["name"] for e in events if e.get("ph") == "X" and str(e.get("pid")) == "0"]
    assert not [n for n in names if n.startswith("cplib")]
    assert names.count("aten.cat") == 4  # funcol's chunks put in place along dim 2: two forward, two backward
    # the script's own copy of the key and the body's `k.contiguous()`, each reading and writing one shard
    copy_us = (math.ceil(2 * SHARD / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS) / 1e3
    clones = [e["dur"] for e in events if e.get("ph") == "X" and str(e.get("pid")) == "0" and e["name"] == "aten.clone"]
    assert clones == [pytest.approx(copy_us, abs=1e-3)] * 2
