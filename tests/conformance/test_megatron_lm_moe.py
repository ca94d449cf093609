"""Megatron-LM's own `pretrain_gpt.py` with mixture-of-experts layers, at tag core_v0.17.0, unchanged, under
`phantora run --topology testbed16 --nproc 4`.

At core_v0.16.1 (test_megatron_lm.py) MoE cannot run without Transformer Engine, on a GPU as here: the router's
`RouterGatingLinearFunction` tests `te_general_gemm is not None` before its dtype, and `moe_utils.py` defines that
name only when TE imports (a NameError for every `--moe-router-dtype`; no flag avoids it). Megatron-LM fixed it in
9ed8b0c ("Fix incorrect HAVE_TE detection in multiple modules", #3763, 2026-03-19), first released in core_v0.17.0:
without TE the fused names are None and the router runs `torch.mm`. So this case runs that tag, vendored as the
0.16.1 case is (programs/megatron-lm-core_v0.17.0, the files it imports, listed with their git blob ids in
megatron-lm-core_v0.17.0.blobs), with the same small GPT, mock data and no-apex/no-TE flags, plus `--swiglu
--disable-bias-linear`, as Megatron's Mixtral example runs MoE (with GELU and a bias, the experts' fused bias
activation refuses the router's per-token scale: "Only support fusion of swiglu and quick_gelu with per_token_scale",
on a GPU too).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conformance import PROGRAMS, assert_documented, assert_manifest_tree, run_program
from test_megatron_lm import DATA, ENV, MODEL, NO_APEX_NO_TE, RUN, trains

pytest.importorskip("megatron.core")
pytest.importorskip("pybind11")
UPSTREAM = "megatron-lm-core_v0.17.0"
MOE = ["--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-router-topk", "2"]
MIXTRAL = ["--swiglu", "--disable-bias-linear"]


def test_vendored_files_are_megatron_lms_at_core_v0_17_0() -> None:
    """Every vendored file is the file at core_v0.17.0 that the manifest names, and nothing else is there."""
    assert_manifest_tree(UPSTREAM)


@pytest.mark.slow
def test_mixture_of_experts_with_expert_parallelism(tmp_path: Path) -> None:
    """2 layers of 4 experts, top-2 routing, EP 2 (x DP 2): Megatron's default token dispatcher (all-gather) gathers
    the tokens over the EP group and reduce-scatters the experts' outputs back, so both are in the trace; the
    run trains as the dense cases do (Megatron's timer is phantora's step, the first loss about ln(1280))."""
    workdir = tmp_path / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, workdir)
    args = [*MODEL, "--num-layers", "2", *RUN, *DATA, *NO_APEX_NO_TE, *MOE, *MIXTRAL]
    run = run_program(workdir, "pretrain_gpt.py", args, tmp_path / "out", 4, env=ENV)
    trains(run)
    logged = {m[1]: m[2] for m in re.finditer(r"^  (\w+) \.+ (\S+)$", run.log(0), flags=re.M)}
    assert (logged["num_experts"], logged["expert_model_parallel_size"]) == ("4", "2")
    assert logged["moe_token_dispatcher_type"] == "allgather"
    events = json.loads((tmp_path / "out" / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    kinds = {str(e.get("name", "")).split("#")[0] for e in events if e.get("pid") == 0 and e.get("cat") != "compute"}
    assert "reduce_scatter" in kinds  # the dispatcher's combine (DP alone would all-reduce: no distributed optimizer)
    assert_documented(run.step_ms(), "pretrain_gpt.py", "core_v0.17.0, 2 layers, `--num-experts 4")


@pytest.mark.slow
def test_mixture_of_experts_stops_in_one_line_in_phantom_mode(tmp_path: Path) -> None:
    """The same run with `--phantom`: the all-gather dispatcher counts the tokens its experts got from the router's
    routing map, which it computes on the device from phantom scores, and reads their sum (`.item()`) to size the
    permutation: the run stops there in one line naming it, as phantom mode does for any value it does not have."""
    workdir = tmp_path / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, workdir)
    args = [*MODEL, "--num-layers", "2", *RUN, *DATA, *NO_APEX_NO_TE, *MOE, *MIXTRAL]
    run = run_program(workdir, "pretrain_gpt.py", args, tmp_path / "out", 4, ("--phantom",), env=ENV)
    assert run.returncode != 0
    stop = [line for line in run.output.splitlines() if line.startswith("phantora: rank 0 failed")]
    assert len(stop) == 1, run.output[-3000:]
    assert "token_dispatcher.py:301 in dispatch_postprocess): PhantomValueError" in stop[0]
    assert "tokens_per_expert.sum().item()" in stop[0]
