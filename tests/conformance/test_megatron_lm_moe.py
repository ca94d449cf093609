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
from test_megatron_lm import DATA, ENV, MODEL, NO_APEX_NO_TE, RUN, iterations, timer_is_the_step, trains

from tests.installed import needs

pytestmark = needs("megatron.core", "pybind11")
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
def test_mixture_of_experts_in_phantom_mode(tmp_path: Path) -> None:
    """The same run with `--phantom`. The router's top-k over phantom scores takes the balanced routing
    (runtime/simcuda/kept_values.py), named once on screen and in results.json, so the all-gather dispatcher's
    routing map and each expert's count have values (T k / E: 256 of the 2 ranks' 2 x 128 x 2 tokens' 2 choices
    for each of 4 experts) and it sizes its permutation with them. One flag is added: Megatron's NaN check of each
    loss (`validate_result`, `if torch.isnan(loss)`) reads a phantom value, so it is turned off, as Megatron turns it
    off itself for its own data-less `--fake-process-group`. Megatron's timer is phantora's step."""
    workdir = tmp_path / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, workdir)
    args = [*MODEL, "--num-layers", "2", *RUN, *DATA, *NO_APEX_NO_TE, *MOE, *MIXTRAL]
    args += ["--no-check-for-nan-in-loss-and-grad"]
    run = run_program(workdir, "pretrain_gpt.py", args, tmp_path / "out", 4, ("--phantom",), env=ENV)
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count("phantom mode: MoE routing assumed balanced") == 1
    assert run.results()["moe_routing"] == "balanced"
    its = iterations(run)
    assert [i for i, _, _ in its] == [1, 2, 3] and len(run.steps()) == 3
    timer_is_the_step(its, run.steps())
    assert_documented(run.step_ms(), "pretrain_gpt.py", "core_v0.17.0 in phantom mode")


@pytest.mark.slow
def test_a_routing_map_over_4_kib_in_phantom_mode(tmp_path: Path) -> None:
    """16 experts, EP 2, in phantom mode: each rank's routing map is 2 x 128 tokens x 16 experts = 4,096 booleans and
    the gathered one 8,192 B, over the value channel's old 4 KiB limit, where the run stopped in one line
    (`tokens_per_expert.sum().item()`, token_dispatcher.py:301). Now it carries the map and trains; the trace holds
    the map's all-gather, 8,192 B, once per MoE layer and step (2 x 3)."""
    workdir = tmp_path / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, workdir)
    moe = ["--num-experts", "16", *MOE[2:]]
    args = [*MODEL, "--num-layers", "2", *RUN, *DATA, *NO_APEX_NO_TE, *moe, *MIXTRAL]
    args += ["--no-check-for-nan-in-loss-and-grad"]
    run = run_program(workdir, "pretrain_gpt.py", args, tmp_path / "out", 4, ("--phantom",), env=ENV)
    assert run.returncode == 0, run.output[-3000:]
    assert run.results()["moe_routing"] == "balanced"
    assert [i for i, _, _ in iterations(run)] == [1, 2, 3]
    events = json.loads((tmp_path / "out" / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    gathers = [e for e in events if e.get("pid") == 0 and str(e.get("name", "")).startswith("all_gather")]
    tokens, experts, ep = 2 * 128, 16, 2
    assert sum(1 for e in gathers if e["args"].get("bytes") == ep * tokens * experts) == 2 * 3
