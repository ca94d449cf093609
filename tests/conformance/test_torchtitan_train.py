"""torchtitan's own training entry (`torchtitan/train.py` of the torchtitan 0.3.0 wheel, unchanged) with its
`llama3_debugmodel` config, under `phantora run --topology testbed16`.

Two flags are torch 2.13's, not phantora's (docs/runtime.md "torchtitan, unmodified"): the default spmd_types
backend needs a newer FSDP2, and CUDA graphs are not simulated. torchtitan reads its tokenizer and the c4_test
corpus from ./tests/assets, which the wheel does not ship: tests/frameworks/assets.py writes small ones.
"""

from __future__ import annotations

import collections
import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from conformance import Run, assert_documented, run_program

from tests.installed import needs, package_dir

pytestmark = needs("torchtitan")
TRAIN = str(package_dir("torchtitan") / "train.py")
TRAIN_DOC = "torchtitan/train.py"  # its rows in docs/runtime.md
BASE = ["--module", "llama3", "--config", "llama3_debugmodel"]
TORCH_2_13 = ["--parallelism.spmd_backend", "partial_dtensor", "--training.disable_cuda_graphs"]
LINE = re.compile(r"step:\s+(\d+)\s+\S*loss:\s+([0-9.]+)\s+\S*grad_norm:\s+([0-9.]+).*?tps:\s+([0-9,]+)")


def titan_steps(run: Run, rank: int = 0) -> dict[int, tuple[str, str, int]]:
    """torchtitan's own log lines: {step: (loss, grad_norm as printed, tokens/s per GPU)}."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", run.log(rank))
    return {int(m[1]): (m[2], m[3], int(m[4].replace(",", ""))) for m in LINE.finditer(plain)}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from frameworks.assets import make_torchtitan_assets

    return make_torchtitan_assets(tmp_path_factory.mktemp("titan"))


def test_llama3_debugmodel_as_its_docs_run_it_in_phantom_mode(workdir: Path, tmp_path: Path) -> None:
    """The config's own sequence (2048) and local batch (8) on 4 GPUs, FSDP 4. Real mode needs more host memory
    than this machine has (issue 34); phantom mode runs it. torchtitan's tokens/s is the config's tokens per
    rank over phantora's simulated step."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "4"]
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 4, ("--phantom",))
    assert run.returncode == 0, run.output[-3000:]
    logged = titan_steps(run)
    assert sorted(logged) == [1, 2, 3, 4] and len(run.steps()) == 4
    for step, st in zip([2, 3, 4], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(8 * 2048 / (st["time_ns"] / 1e9), rel=0.01)
    assert_documented(
        run.step_ms(), TRAIN_DOC, "`llama3_debugmodel` as its docs run it (sequence 2048, local batch 8), FSDP 4"
    )


@pytest.mark.slow
def test_train_resumes_from_its_own_checkpoint_as_if_never_stopped(workdir: Path, tmp_path: Path) -> None:
    """torchtitan's checkpointing (torch.distributed.checkpoint of the FSDP2 model, optimizer, LR schedule and
    data loader) in real mode: 6 steps saving every 2; with step-6 removed, a second run loads step-4 and its
    steps 5 and 6 print the first run's losses and gradient norms to the last digit, and its step 6 (which saves
    a checkpoint in both runs) takes the first run's simulated time."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "6", "--training.seq_len", "256"]
    args += ["--training.local_batch_size", "2", "--training.mixed_precision_param", "float32", "--debug.seed", "42"]
    args += ["--checkpoint.enable", "--checkpoint.interval", "2", "--checkpoint.no-last-save-model-only"]
    shutil.rmtree(workdir / "outputs", ignore_errors=True)
    first = run_program(workdir, TRAIN, args, tmp_path / "first", 2)
    assert first.returncode == 0, first.output[-3000:]
    folder = workdir / "outputs" / "checkpoint"
    assert sorted(p.name for p in folder.iterdir()) == ["step-2", "step-4", "step-6"]
    shutil.rmtree(folder / "step-6")
    again = run_program(workdir, TRAIN, args, tmp_path / "again", 2)
    assert again.returncode == 0, again.output[-3000:]
    assert "Loading the checkpoint from ./outputs/checkpoint/step-4" in again.log(0)
    before, after = titan_steps(first), titan_steps(again)
    # loading the optimizer state calls `optim.step()` once (torch's `_init_optim_state`): one step more
    assert sorted(after) == [5, 6] and len(again.steps()) == 3
    assert again.steps()[-1]["time_ns"] == pytest.approx(first.steps()[-1]["time_ns"], rel=0.01)  # both save step 6
    assert [after[s][:2] for s in (5, 6)] == [before[s][:2] for s in (5, 6)]
    assert before[4][0] != before[5][0]  # the loss moves from step to step: equal losses are not a constant
    assert_documented(first.step_ms(), TRAIN_DOC, "FSDP 2, sequence 256, batch 2, fp32")
    assert_documented(again.steps()[-1]["time_ns"] / 1e6, TRAIN_DOC, "the same again, step-6 removed")


DEEPSEEK_EP2 = ["--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel", *TORCH_2_13, "--training.steps", "3"]
DEEPSEEK_EP2 += ["--training.seq_len", "256", "--training.local_batch_size", "2"]
DEEPSEEK_EP2 += ["--parallelism.expert_parallel_degree", "2", "--debug.seed", "42"]


@pytest.mark.slow
def test_deepseek_v3_debugmodel_with_expert_parallelism(workdir: Path, tmp_path: Path) -> None:
    """torchtitan's deepseek_v3_debugmodel (MoE) with EP 2 on 2 GPUs, real mode. The run exits 0 and logs a loss that
    falls; tokens/s is the tokens per rank over the simulated step."""
    run = run_program(workdir, TRAIN, DEEPSEEK_EP2, tmp_path / "out", 2)
    assert run.returncode == 0, run.output[-3000:]
    logged = titan_steps(run)
    assert sorted(logged) == [1, 2, 3] and float(logged[3][0]) < float(logged[1][0])
    for step, st in zip([2, 3], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(2 * 256 / (st["time_ns"] / 1e9), rel=0.01)
    assert_documented(run.step_ms(), TRAIN_DOC, "`--module deepseek_v3 --config deepseek_v3_debugmodel`, EP 2 on")


@pytest.mark.slow
def test_deepseek_v3_debugmodel_with_expert_parallelism_in_phantom_mode(workdir: Path, tmp_path: Path) -> None:
    """The same in phantom mode: the router's top-k over phantom scores takes the balanced routing
    (runtime/simcuda/kept_values.py), named once on screen and in results.json. Each of the 8 experts gets T k / E
    of a rank's T = 2 x 256 tokens' k = 3 choices, so every dispatch or combine all-to-all moves T k x dim 256 x 2 B
    (bf16) per rank, and the counts' all-to-all 8 int64."""
    phantom = run_program(workdir, TRAIN, DEEPSEEK_EP2, tmp_path / "phantom", 2, ("--phantom",))
    assert phantom.returncode == 0, phantom.output[-3000:]
    assert phantom.output.count("phantom mode: MoE routing assumed balanced") == 1
    assert phantom.results()["moe_routing"] == "balanced"
    tokens, k, dim, moe_layers = 2 * 256, 3, 256, 5  # the debug model: 6 layers, the first dense
    events = json.loads((tmp_path / "phantom" / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    sizes = [e["args"]["bytes"] for e in events if e.get("pid") == 0 and str(e.get("name")).startswith("all_to_all#")]
    # per step and MoE layer: the counts, then dispatch and combine, forward and backward
    assert sorted(sizes) == sorted([8 * 8] * 3 * moe_layers + [tokens * k * dim * 2] * 4 * 3 * moe_layers)
    assert_documented(
        phantom.step_ms(), TRAIN_DOC, "`--module deepseek_v3 --config deepseek_v3_debugmodel`, `--phantom`"
    )


DEEPSEEK_PP2_EP2 = [*DEEPSEEK_EP2[:4], *TORCH_2_13, "--training.steps", "3"]  # the module and config, as above
DEEPSEEK_PP2_EP2 += ["--training.seq_len", "256", "--training.local_batch_size", "4", "--debug.seed", "42"]
DEEPSEEK_PP2_EP2 += ["--parallelism.expert_parallel_degree", "2", "--parallelism.pipeline_parallel_degree", "2"]
DEEPSEEK_PP2_EP2 += ["--parallelism.pipeline_parallel_schedule", "1F1B"]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 341 s at load 12-27 (the run itself is bounded by TIMEOUT_S)
def test_deepseek_v3_debugmodel_with_a_pipeline_and_expert_parallelism(workdir: Path, tmp_path: Path) -> None:
    """PP 2 x EP 2 on 4 GPUs (FSDP 2 in a stage), 1F1B, local batch 4 (4 micro-batches of 1), real mode. It hung in
    its first step before 11ff07d (torch's pipeline warm-up vote, stage 0's first send, held the rank in gloo's
    connect). Closed forms from the config: each micro-batch sends its activation forward and its gradient back,
    1 x 256 tokens x dim 256 x 2 B (bf16); each MoE layer of a stage (layers 1-2 on stage 0, 3-5 on stage 1) exchanges
    the 8 experts' int64 counts once a micro-batch's forward, and once in the pipeline's shape inference."""
    run = run_program(workdir, TRAIN, DEEPSEEK_PP2_EP2, tmp_path / "out", 4)
    assert run.returncode == 0, run.output[-3000:]
    assert "Using pipeline schedule 1F1B" in run.log(0) and "pp=2" in run.log(0) and "ep=2" in run.log(0)
    logged = titan_steps(run, rank=2)  # the last stage logs the loss
    assert sorted(logged) == [1, 2, 3] and float(logged[3][0]) < float(logged[1][0])
    for step, st in zip([2, 3], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(4 * 256 / (st["time_ns"] / 1e9) / 2, rel=0.01)
    events = json.loads((tmp_path / "out" / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    micro, steps, activation = 4, 3, 1 * 256 * 256 * 2
    for rank, moe_layers in ((0, 2), (1, 2), (2, 3), (3, 3)):
        mine = [e for e in events if e.get("pid") == rank]
        p2p = [e["args"]["bytes"] for e in mine if str(e.get("name")).startswith(("send#", "recv#"))]
        assert p2p.count(activation) == 2 * micro * steps, rank
        a2a = [e["args"]["bytes"] for e in mine if str(e.get("name")).startswith("all_to_all#")]
        assert a2a.count(8 * 8) == (micro * steps + 1) * moe_layers, rank
    with (tmp_path / "out" / "flows.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["tag"].startswith("send#")]
    per_call: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for r in rows:  # a call's flows (one per channel) sum to its bytes
        per_call[(r["tag"].split("/")[0], r["src"], r["dst"])] += int(r["size_bytes"])
    pairs = {("gpu0", "gpu2"), ("gpu2", "gpu0"), ("gpu1", "gpu3"), ("gpu3", "gpu1")}
    assert {(s, d) for _, s, d in per_call} == pairs
    assert (
        sorted(collections.Counter((s, d) for (_, s, d), n in per_call.items() if n == activation).values())
        == [micro * steps] * 4
    )
    assert_documented(run.step_ms(), TRAIN_DOC, "`--module deepseek_v3 --config deepseek_v3_debugmodel`, PP 2 x EP 2")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 167 s at load 15-22
def test_deepseek_v3_pipeline_and_expert_parallelism_in_phantom_mode_on_packets(workdir: Path, tmp_path: Path) -> None:
    """The same PP 2 x EP 2 run in phantom mode on the packet network (`--network ns3 --cc dcqcn`; the 4 GPUs share a
    host, so its NVLink carries every byte). On the balanced routing each rank sends T k / EP of a micro-batch's
    T = 256 tokens' k = 3 choices to its EP peer, `256 x 3 / 2 x 256 x 2 B = 196,608 B`, in every dispatch and combine,
    forward and backward (4 a MoE layer and micro-batch), and in the pipeline's shape inference: a forward (2 a
    layer) on both stages, and on the last stage the backward that finds its input gradient's shape (2 more)."""
    options = ("--phantom", "--network", "ns3", "--cc", "dcqcn")
    run = run_program(workdir, TRAIN, DEEPSEEK_PP2_EP2, tmp_path / "out", 4, options)
    assert run.returncode == 0, run.output[-3000:]
    assert run.results()["moe_routing"] == "balanced"
    micro, steps, moe = 4, 3, {"0.1": 2, "2.3": 3}  # the MoE layers of each stage's EP group (ranks 0-1, 2-3)
    with (tmp_path / "out" / "flows.csv").open() as f:
        rows = list(csv.DictReader(f))
    tokens: collections.Counter[tuple[str, str, str, str]] = collections.Counter()
    for r in rows:  # all_to_all#N.pgG@0.1/0>1/p2p/chC: a call's transfer 0 -> 1 over its channels (flow_tags.call_name:
        # `.pgG` names the process group when it is not the first over its ranks, as the EP group is since 66bf5efb)
        m = re.match(r"all_to_all#(\d+(?:\.pg\d+)?)@([\d.]+)/(\d+)>(\d+)/", r["tag"])
        if m:
            tokens[(m[2], m[1], m[3], m[4])] += int(r["size_bytes"])
    count_bytes = 2 * (8 // 2) * 8  # a peer's 4 experts' int64 counts, on the wire as LL (a flag word each)
    counts = [n for n in tokens.values() if n == count_bytes]
    transfers = [k for k, n in tokens.items() if n != count_bytes]
    assert {tokens[k] for k in transfers} == {256 * 3 // 2 * 256 * 2}
    for group, layers in moe.items():
        inference = 2 * layers if group == "0.1" else 4 * layers
        assert sum(k[0] == group for k in transfers) == 2 * (4 * layers * micro * steps + inference), group
    assert len(counts) == 2 * sum((micro * steps + 1) * layers for layers in moe.values())
    sends = collections.Counter()
    for r in rows:
        if r["tag"].startswith("send#"):
            sends[(r["tag"].split("/")[0], r["src"], r["dst"])] += int(r["size_bytes"])
    assert sorted(collections.Counter(k[1:] for k, n in sends.items() if n == 256 * 256 * 2).values()) == [12] * 4
    assert_documented(run.step_ms(), TRAIN_DOC, "the same in phantom mode on the packet network")


@pytest.mark.slow
def test_dcp_checkpoints_stall_their_steps_by_the_storage_model(workdir: Path, tmp_path: Path) -> None:
    """torchtitan's DCP checkpoints every 2 steps under `phantora run --storage 2` (a host link of 2 GB/s, 2 B a ns,
    which the host's 2 ranks share): each rank writes its own `.distcp` shard, so the step that saves (after steps 2
    and 4, in step lines 2 and 4) stalls for the larger shard, which takes no less than alone on the link (its
    bytes / 2) and no more than both shards' bytes / 2 (the old fixed half-link share, its bytes / 1, is more than
    that); steps.jsonl counts both shards' bytes."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "6", "--training.seq_len", "256"]
    args += ["--training.local_batch_size", "2", "--training.mixed_precision_param", "float32", "--debug.seed", "42"]
    args += ["--checkpoint.enable", "--checkpoint.interval", "2", "--checkpoint.no-last-save-model-only"]
    shutil.rmtree(workdir / "outputs", ignore_errors=True)
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 2, ("--storage", "2"))
    assert run.returncode == 0, run.output[-3000:]
    folder = workdir / "outputs" / "checkpoint"
    shards = {s: [(folder / s / f"__{r}_0.distcp").stat().st_size for r in (0, 1)] for s in ("step-2", "step-4")}
    lines = [json.loads(line) for line in (run.out / "steps.jsonl").read_text().splitlines()]
    assert len(lines) == 6
    io = [(x.get("storage_ns", 0), x.get("storage_bytes", 0)) for x in lines]
    want = {2: shards["step-2"], 4: shards["step-4"]}
    assert [b for _, b in io] == [sum(want[i]) if i in want else 0 for i in range(6)]
    assert [ns for i, (ns, _) in enumerate(io) if i not in want] == [0, 0, 0, 0]
    for i, shards in want.items():
        assert max(shards) / 2 <= io[i][0] <= sum(shards) / 2 + 2
    for i in (2, 4):  # the saving step is longer than the next one by at least the stall
        assert lines[i]["time_ns"] >= lines[i + 1]["time_ns"] + io[i][0]
    assert_documented(run.step_ms(), TRAIN_DOC, "the same under `phantora run --storage 2`")


@pytest.mark.slow
def test_llama3_debugmodel_with_tensor_parallelism_in_phantom_mode(workdir: Path, tmp_path: Path) -> None:
    """`--parallelism.tensor_parallel_degree 2` on 4 GPUs (FSDP 2 x TP 2), the config's sequence and batch, phantom
    mode. torchtitan divides the tokens by the non-data-parallel degree: its tokens/s is 8 x 2048 / (step x 2)."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "4", "--parallelism.tensor_parallel_degree", "2"]
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 4, ("--phantom",))
    assert run.returncode == 0, run.output[-3000:]
    assert "tp=2" in run.log(0)
    logged = titan_steps(run)
    assert sorted(logged) == [1, 2, 3, 4] and len(run.steps()) == 4
    for step, st in zip([2, 3, 4], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(8 * 2048 / (st["time_ns"] / 1e9) / 2, rel=0.01)
    assert_documented(
        run.step_ms(), TRAIN_DOC, "`llama3_debugmodel` as its docs run it, `--parallelism.tensor_parallel_degree 2`"
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 2026-12-02, load 21-24: Interleaved1F1B 290 s, 1F1B 178 s (the default 300 s stopped both)
@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B"])
def test_llama3_debugmodel_with_pipelines_in_phantom_mode(workdir: Path, tmp_path: Path, schedule: str) -> None:
    """`--parallelism.pipeline_parallel_degree 2` on 4 GPUs (FSDP 2 x PP 2), the config's sequence and batch, phantom
    mode: torch's warm-up vote (int32 sends) and its stage metadata (`send_object_list`) carry their values
    (runtime/phantom_pipelining.py, runtime/object_values.py), and the vote's 4-byte sends are in the trace.
    torchtitan's tokens/s is 8 x 2048 / (step x 2) (the PP degree)."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "4", "--parallelism.pipeline_parallel_degree", "2"]
    args += ["--parallelism.pipeline_parallel_schedule", schedule]
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 4, ("--phantom",))
    assert run.returncode == 0, run.output[-3000:]
    assert f"Using pipeline schedule {schedule}" in run.log(0)
    logged = titan_steps(run)
    assert sorted(logged) == [1, 2, 3, 4] and len(run.steps()) == 4
    for step, st in zip([2, 3, 4], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(8 * 2048 / (st["time_ns"] / 1e9) / 2, rel=0.01)
    events = json.loads((tmp_path / "out" / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    sends = [e["args"]["bytes"] for e in events if e.get("pid") == 0 and str(e.get("name", "")).startswith("send#")]
    assert sends[0] == 4  # the vote: one int32
    row = (
        "the same, `--parallelism.pipeline_parallel_schedule 1F1B`"
        if schedule == "1F1B"
        else "`llama3_debugmodel` as its docs run it (sequence 2048, local batch 8), `--parallelism.pipeline_parallel"
    )
    assert_documented(run.step_ms(), TRAIN_DOC, row)


@pytest.mark.slow
def test_llama3_debugmodel_with_a_pipeline_alone_in_phantom_mode(workdir: Path, tmp_path: Path) -> None:
    """`--parallelism.pipeline_parallel_degree 2` alone on 2 GPUs, phantom mode. DTensor's RNG tracker broadcasts
    rank 0's generator state and compares it with the rank's own; the state's 16 bytes travel with the broadcast
    (runtime/tensor_values.py). torchtitan seeds each stage differently, so rank 1, and only rank 1, warns that the
    states differed, as torch does on GPUs. tokens/s is 8 x 2048 / (step x 2)."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "4", "--parallelism.pipeline_parallel_degree", "2"]
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 2, ("--phantom",))
    assert run.returncode == 0, run.output[-3000:]
    warning = "DTensor is synchronizing RNG states of every rank with the state from rank 0"
    assert warning not in run.log(0) and warning in run.log(1)
    logged = titan_steps(run)
    assert sorted(logged) == [1, 2, 3, 4] and len(run.steps()) == 4
    for step, st in zip([2, 3, 4], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(8 * 2048 / (st["time_ns"] / 1e9) / 2, rel=0.01)
    assert_documented(run.step_ms(), TRAIN_DOC, "`llama3_debugmodel`, `--parallelism.pipeline_parallel_degree 2` alone")


@pytest.mark.slow
def test_llama3_debugmodel_with_context_parallelism(workdir: Path, tmp_path: Path) -> None:
    """`--parallelism.context_parallel_degree 2` on 2 GPUs, real mode, sequence 256, batch 2: torch's context
    parallelism (FlexAttention with a block mask, the keys and values all-gathered) runs; the loss falls, and
    torchtitan's tokens/s is 2 x 256 over the simulated step over the CP degree."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "3", "--training.seq_len", "256"]
    args += ["--training.local_batch_size", "2", "--debug.seed", "42", "--parallelism.context_parallel_degree", "2"]
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 2)
    assert run.returncode == 0, run.output[-3000:]
    assert "cp=2" in run.log(0) and "Applied Context Parallel" in run.log(0)
    logged = titan_steps(run)
    assert sorted(logged) == [1, 2, 3] and float(logged[3][0]) < float(logged[1][0])
    for step, st in zip([2, 3], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(2 * 256 / (st["time_ns"] / 1e9) / 2, rel=0.01)
    assert_documented(
        run.step_ms(), TRAIN_DOC, "`llama3_debugmodel`, `--parallelism.context_parallel_degree 2` on 2 GPUs"
    )


@pytest.mark.slow
def test_llama3_debugmodel_with_context_parallelism_in_phantom_mode(workdir: Path, tmp_path: Path) -> None:
    """The config's sequence (2048) and batch (8) on 4 GPUs, FSDP 2 x CP 2, phantom mode: tokens/s is 8 x 2048 over
    the simulated step over the CP degree."""
    args = [*BASE, *TORCH_2_13, "--training.steps", "4", "--parallelism.context_parallel_degree", "2"]
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 4, ("--phantom",))
    assert run.returncode == 0, run.output[-3000:]
    assert "cp=2" in run.log(0)
    logged = titan_steps(run)
    assert sorted(logged) == [1, 2, 3, 4] and len(run.steps()) == 4
    for step, st in zip([2, 3, 4], run.steps()[1:], strict=True):
        assert logged[step][2] == pytest.approx(8 * 2048 / (st["time_ns"] / 1e9) / 2, rel=0.01)
    assert_documented(
        run.step_ms(),
        TRAIN_DOC,
        "`llama3_debugmodel` as its docs run it, `--parallelism.context_parallel_degree 2` on 4",
    )


@pytest.mark.slow
def test_dcp_checkpoints_save_and_resume_in_phantom_mode(workdir: Path, tmp_path: Path) -> None:
    """torchtitan's DCP checkpointing of the config as its docs run it (FSDP 4, sequence 2048, batch 8), phantom
    mode, `--storage 2` (a host link of 2 GB/s, 2 B a ns, shared by the 4 ranks): every rank writes its part, and
    the folder holds the files of a coordinated save (one `.metadata`, by which torchtitan finds it); a rank's part
    is at least its quarter of the fp32 parameters and Adam's two moments, 3 x 4 bytes x the logged parameter count
    / 4 (plus the pickled data-loader, schedule and train states). The ranks write at once, so max-min sharing of
    the link ends rank r's part at sum over ranks j of min(b_j, b_r) / 2 ns. A second run to step 6 loads step-4
    (reading at least as much, in no less than its bytes / 2 nor more than all ranks' bytes / 2) and goes on from
    step 5."""
    args = [*BASE, *TORCH_2_13, "--checkpoint.enable", "--checkpoint.interval", "2"]
    args += ["--checkpoint.no-last-save-model-only"]
    shutil.rmtree(workdir / "outputs", ignore_errors=True)
    first = run_program(
        workdir, TRAIN, [*args, "--training.steps", "4"], tmp_path / "first", 4, ("--phantom", "--storage", "2")
    )
    assert first.returncode == 0, first.output[-3000:]
    step2 = workdir / "outputs" / "checkpoint" / "step-2"
    assert sorted(p.name for p in step2.iterdir()) == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    params = int(
        re.search(r"size: ([0-9,]+) total parameters", re.sub(r"\x1b\[[0-9;]*m", "", first.log(0)))[1].replace(",", "")
    )
    saved = {}
    for rank in range(4):
        lines = [json.loads(x) for x in (first.out / "steps" / f"rank{rank}.jsonl").read_text().splitlines()]
        saved[rank] = lines[2]["storage_bytes"], lines[2]["storage_ns"]
        assert 3 * params <= saved[rank][0] <= 3 * params + 2**20
        assert [x.get("storage_bytes", 0) for i, x in enumerate(lines) if i != 2] == [0, 0, 0]
    for rank, (nbytes, ns) in saved.items():
        assert abs(ns - sum(min(b, nbytes) for b, _ in saved.values()) / 2) <= 2, (rank, saved)
    ns = max(ns for _, ns in saved.values())
    steps = first.steps()
    assert steps[2]["time_ns"] >= steps[3]["time_ns"] + ns
    again = run_program(
        workdir, TRAIN, [*args, "--training.steps", "6"], tmp_path / "again", 4, ("--phantom", "--storage", "2")
    )
    assert again.returncode == 0, again.output[-3000:]
    assert "Loading the checkpoint from ./outputs/checkpoint/step-4" in again.log(0)
    assert sorted(titan_steps(again)) == [5, 6]
    loads = []
    for rank in range(4):
        lines = [json.loads(x) for x in (again.out / "steps" / f"rank{rank}.jsonl").read_text().splitlines()]
        loaded = next(x for x in lines if x.get("storage_bytes"))  # the load (each rank reads replicated items whole)
        loads.append((loaded["storage_bytes"], loaded["storage_ns"]))
        assert 3 * params <= loaded["storage_bytes"] <= 3 * params + 2**23
    for nbytes, ns in loads:
        assert nbytes / 2 <= ns <= sum(b for b, _ in loads) / 2 + 2, loads


@pytest.mark.slow
def test_llama3_varlen_attn_on_the_default_h100_takes_the_simulated_fa3(workdir: Path, tmp_path: Path) -> None:
    """`llama3_debugmodel_varlen_attn` on the default H100 (SM 9.0), where torchtitan activates FlashAttention 3:
    its `flash_attn_interface` is the simulated one (said in results.json), so the model builds and trains (it
    stopped at the import before); `varlen_attn` is charged as the flash kernel, a forward and a backward per layer
    and step. Phantom mode, sequence 256."""
    args = ["--module", "llama3", "--config", "llama3_debugmodel_varlen_attn", *TORCH_2_13]
    args += ["--training.steps", "3", "--training.seq_len", "256"]
    run = run_program(workdir, TRAIN, args, tmp_path / "out", 2, ("--phantom",))
    assert run.returncode == 0, run.output[-3000:]
    assert sorted(titan_steps(run)) == [1, 2, 3] and len(run.steps()) == 3
    assert run.results()["simulated_packages"] == ["flash-attn-3"]
    # torch's FA3 activation imports it; varlen_attn's forward is charged as FA3's: the package counts as used
    assert "simulated_packages_unused" not in run.results()
    events = json.loads((tmp_path / "out" / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = collections.Counter(e["name"] for e in events if e.get("ph") == "X" and e.get("pid") == 0)
    assert names["aten._flash_attention_forward"] == names["aten._flash_attention_backward"] > 0
