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

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conformance import PROGRAMS, TIMEOUT_S, Run, assert_documented, assert_manifest_tree, run_program
from test_megatron_lm import (
    DATA,
    ENV,
    ITERATION,
    MODEL,
    NO_APEX_NO_TE,
    RUN,
    barrier_ms,
    iterations,
    timer_is_the_step,
    trains,
)

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
def test_the_alltoall_dispatcher_with_tensor_parallelism_in_real_mode(tmp_path: Path) -> None:
    """TP 2 with sequence parallelism x EP 2 (expert TP 2), the alltoall dispatcher, real mode: each TP rank holds
    its own tokens' routing, so the dispatcher all-gathers the TP pair's tokens into a list of unequal parts
    (`_gather_along_first_dim` with `output_split_sizes`) and its backward reduce-scatters them. ProcessGroupNCCL
    runs those as one NCCL group of broadcasts and of reductions, one a root; gloo, which moves real mode's data,
    refused the unequal list before 51e5186f ("ProcessGroupGloo::allgather: invalid tensor size"). The run trains
    (Megatron's timer is phantora's step), and rank 0's trace has the reductions on its TP pair (Megatron calls
    no `dist.reduce` itself) and the broadcasts beside its data's."""
    workdir = tmp_path / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, workdir)
    args = [*MODEL, "--num-layers", "2", *RUN, *DATA, *NO_APEX_NO_TE, *MOE, *MIXTRAL]
    args += ["--moe-token-dispatcher-type", "alltoall", "--tensor-model-parallel-size", "2", "--sequence-parallel"]
    run = run_program(workdir, "pretrain_gpt.py", args, tmp_path / "out", 4, env=ENV)
    trains(run)
    logged = {m[1]: m[2] for m in re.finditer(r"^  (\w+) \.+ (\S+)$", run.log(0), flags=re.M)}
    assert (logged["expert_tensor_parallel_size"], logged["moe_token_dispatcher_type"]) == ("2", "alltoall")
    events = json.loads((tmp_path / "out" / "trace.json").read_text())["traceEvents"]
    comm = [e for e in events if e.get("pid") == 0 and e.get("cat") == "comm"]
    reductions = [e for e in comm if str(e["name"]).startswith("reduce#")]
    assert reductions and all(e["args"]["group"] == [0, 1] for e in reductions)
    assert any(str(e["name"]).startswith("broadcast#") and e["args"]["group"] == [0, 1] for e in comm)


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
    timer_is_the_step(its, run.steps(), barrier_ms(run))
    assert_documented(run.step_ms(), "pretrain_gpt.py", "core_v0.17.0 in phantom mode")


@pytest.mark.slow
def test_the_alltoall_dispatcher_in_phantom_mode_on_the_packet_network(tmp_path: Path) -> None:
    """The same MoE GPT with `--moe-token-dispatcher-type alltoall` (Megatron's all-to-all dispatcher, what its MoE
    examples run with expert parallelism), in phantom mode on the packet network (`--phantom --network ns3 --cc
    dcqcn`; the 4 GPUs share a host, so NVLink carries every byte). EP 2 of DP 4 (the dense layers' data parallel
    group is the world: 8 / (2 x 4) = 1 micro-batch a step). On the balanced routing each rank's T = s x b = 256
    tokens' k = 2 choices go half to its EP peer, so every all-to-all of the tokens moves T k / EP x h x 4 B =
    131,072 B each way between gpu0-gpu1 and gpu2-gpu3: dispatch and combine, forward and backward, 4 a layer and
    step (24 in 3 steps of 2 layers); the routing probabilities go with the dispatch, T k / EP x 4 B = 1,024 B,
    forward and backward (12), LL on the wire (NCCL's p2p LL below its 16 KiB threshold: a flag word with each
    data word, 2,048 B). The experts' counts are all-gathered over the EP group, E x 8 B a rank, once a layer and
    step (6 of 64 B). Each all-to-all's span carries NCCL's choice of both its pairs, with their bytes."""
    workdir = tmp_path / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, workdir)
    args = [*MODEL, "--num-layers", "2", *RUN, *DATA, *NO_APEX_NO_TE, *MOE, *MIXTRAL]
    args += ["--moe-token-dispatcher-type", "alltoall", "--no-check-for-nan-in-loss-and-grad"]
    options = ("--phantom", "--network", "ns3", "--cc", "dcqcn")
    out = tmp_path / "out"
    run = run_program(workdir, "pretrain_gpt.py", args, out, 4, options, env=ENV)
    assert run.returncode == 0, run.output[-3000:]
    assert run.results()["moe_routing"] == "balanced"
    its = iterations(run)
    assert [i for i, _, _ in its] == [1, 2, 3] and len(run.steps()) == 3
    timer_is_the_step(its, run.steps(), barrier_ms(run))
    tokens, k, ep, h, experts, steps, layers = 128 * 2, 2, 2, 128, 4, 3, 2
    tokens_bytes, probs_bytes = tokens * k // ep * h * 4, tokens * k // ep * 4
    with (out / "flows.csv").open() as f:
        flows = [r for r in csv.DictReader(f) if r["tag"].startswith("all_to_all#")]
    moved: dict[tuple[str, str], int] = {}
    for r in flows:  # a call's channels summed: tag "all_to_all#1@0.1/0>1/p2p/ch0"
        name, pair = r["tag"].split("/")[:2]
        moved[name, pair] = moved.get((name, pair), 0) + int(r["size_bytes"])
    for pair in ("0>1", "1>0", "2>3", "3>2"):
        sizes = sorted(n for (_, p), n in moved.items() if p == pair)
        assert sizes == [2 * probs_bytes] * (2 * layers * steps) + [tokens_bytes] * (4 * layers * steps), pair
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    mine = [e["args"] for e in events if e.get("pid") == 0 and e.get("cat") == "comm"]
    gathers = [a["bytes"] for a in mine if a["group"] == [0, 1] and a["bytes"] == ep * experts * 8]
    assert len(gathers) == layers * steps
    for a in (a for a in mine if a["group"] == [0, 1] and a["bytes"] == tokens * k * h * 4):
        pairs = {(p["src"], p["dst"]): p["bytes"] for p in a["nccl"]["pairs"]}
        assert pairs == {(0, 1): tokens_bytes, (1, 0): tokens_bytes}
    assert_documented(run.step_ms(), "pretrain_gpt.py", "core_v0.17.0, `--moe-token-dispatcher-type alltoall`")


@pytest.mark.slow
def test_expert_parallel_all_to_all_across_the_hosts_on_the_packet_network(tmp_path: Path) -> None:
    """EP 4 (one expert a rank) with the alltoall dispatcher, `--phantom`, placed by a one-job `phantora run --jobs`
    file on GPUs [0, 1, 8, 9] of testbed16 (docs/jobs.md: a job's rank r runs on its r-th GPU), so ranks 0-1 and 2-3
    share a host and the 8 other ordered pairs cross the leaf-spine fabric, with `--network ns3 --cc dcqcn`. On the
    balanced routing each rank's T = 256 tokens' k = 2 choices go a quarter to each expert, so every token
    all-to-all moves T k / EP x h x 4 B = 65,536 B on each of the 12 ordered pairs: dispatch and combine, forward
    and backward, 24 in 3 steps of 2 layers (jobs/moe/flows.csv, a call's channels summed), the cross-host ones
    between the hosts' GPUs; the leaves' uplinks carry at least those bytes (links.csv: wire bytes, headers
    included). Megatron's timer is the job's simulated step less its barrier (`timer_is_the_step`)."""
    workdir = tmp_path / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, workdir)
    moe = ["--num-experts", "4", "--expert-model-parallel-size", "4", "--moe-router-topk", "2"]
    args = [*MODEL, "--num-layers", "2", *RUN, *DATA, *NO_APEX_NO_TE, *moe, *MIXTRAL]
    args += ["--moe-token-dispatcher-type", "alltoall", "--no-check-for-nan-in-loss-and-grad"]
    spec = tmp_path / "jobs.toml"
    spec.write_text(
        f'[[job]]\nname = "moe"\nscript = {json.dumps(str(workdir / "pretrain_gpt.py"))}\nargs = {json.dumps(args)}\n'
        f'ranks = 4\nplacement = [0, 1, 8, 9]\nenv = {{ CUDA_DEVICE_MAX_CONNECTIONS = "1" }}\n'
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--phantom", "--jobs", str(spec)]
    cmd += ["--network", "ns3", "--cc", "dcqcn", "--out", str(out), "--no-progress"]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path}
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    job = Run(proc.returncode, proc.stdout + proc.stderr, workdir, out / "jobs" / "moe")
    assert job.results()["moe_routing"] == "balanced"
    logged = (out / "logs" / "moe.rank3.log").read_text()
    its = [(int(m[1]), float(m[2]), float(m[3])) for m in ITERATION.finditer(logged)]
    assert [i for i, _, _ in its] == [1, 2, 3] and len(job.steps()) == 3
    events = json.loads((job.out / "trace.json").read_text())["traceEvents"]
    barrier_us = max(e["dur"] for e in events if e.get("pid") == 3 and str(e.get("name")).startswith("barrier#"))
    timer_is_the_step(its, job.steps(), barrier_us / 1e3)  # a world all-reduce of 4 B across the hosts
    tokens, k, ep, h, steps, layers = 128 * 2, 2, 4, 128, 3, 2
    gpus = {0: "gpu0", 1: "gpu1", 2: "gpu8", 3: "gpu9"}
    moved: dict[tuple[str, str], int] = {}
    ends: dict[str, tuple[str, str]] = {}
    with (job.out / "flows.csv").open() as f:
        for r in csv.DictReader(f):
            if r["tag"].startswith("all_to_all#"):
                name, pair = r["tag"].split("/")[:2]
                moved[name, pair] = moved.get((name, pair), 0) + int(r["size_bytes"])
                ends[pair] = (r["src"], r["dst"])
    pairs = [(a, b) for a in range(ep) for b in range(ep) if a != b]
    for a, b in pairs:
        sizes = [n for (_, p), n in moved.items() if p == f"{a}>{b}" and n == tokens * k // ep * h * 4]
        assert len(sizes) == 4 * layers * steps and ends[f"{a}>{b}"] == (gpus[a], gpus[b]), (a, b)
    with (out / "links.csv").open() as f:
        uplinks = sum(
            int(r["bytes"]) for r in csv.DictReader(f) if r["from"] == "leaf0" and r["to"].startswith("spine")
        )
    assert uplinks >= 2 * 2 * 4 * layers * steps * tokens * k // ep * h * 4  # host 0's 2 ranks to host 1's 2
    assert_documented(job.step_ms(), "pretrain_gpt.py", "core_v0.17.0, EP 4 across the hosts")


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
