"""Megatron-LM's own `pretrain_gpt.py` (tag core_v0.16.1, the training loop of megatron-core 0.16.1), unchanged,
under `phantora run --topology testbed16 --nproc 4`, with mock data and the null tokenizer.

`megatron/training` is not in the megatron-core wheel, so the program is vendored with the files it imports
(programs/megatron-lm, listed with their git blob ids in megatron-lm.blobs), `megatron/core` included: run
from a Megatron-LM checkout, `megatron.core` is the checkout's, and Megatron's start-up builds the checkout's
dataset helpers with `make` (pybind11, g++), which the wheel cannot (it ships no Makefile). The flags are the
ones the issue names for a host without apex or Transformer Engine, and `CUDA_DEVICE_MAX_CONNECTIONS=1` as
Megatron's scripts set it. Megatron logs its iterations on the last rank.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import megatron_helpers
import pytest
from conformance import PROGRAMS, Run, assert_documented, assert_manifest_tree, run_program

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from tests.installed import needs

pytestmark = needs("megatron.core", "pybind11")
UPSTREAM = "megatron-lm"
VOCAB = 1280  # --vocab-size 1024, padded by Megatron to a multiple of 128 x TP
MODEL = ["--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128"]
MODEL += ["--max-position-embeddings", "128"]
RUN = ["--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "3", "--lr", "1e-4"]
RUN += ["--log-interval", "1"]
DATA = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024", "--split", "1,0,0"]
DATA += ["--eval-iters", "0", "--eval-interval", "1000"]
NO_APEX_NO_TE = ["--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-persist-layer-norm"]
NO_APEX_NO_TE += ["--no-masked-softmax-fusion"]
ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
# torch.cuda.memory._snapshot's TraceEntry actions (torch/cuda/memory.py)
TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot")
ITERATION = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+) \|.*?lm loss: (\S+) \|"
)


def test_vendored_files_are_megatron_lms() -> None:
    """Every vendored file is the file at core_v0.16.1 that megatron-lm.blobs names, and nothing else is there."""
    assert_manifest_tree(UPSTREAM)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One copy of the checkout for every case: the first run builds the dataset helpers in it, unless an earlier
    session's are cached (megatron_helpers.py; Megatron's `make` then finds them up to date)."""
    dest = tmp_path_factory.mktemp("megatron") / "Megatron-LM"
    shutil.copytree(PROGRAMS / UPSTREAM, dest)
    megatron_helpers.reuse(dest)
    yield dest
    megatron_helpers.keep(dest)


def pretrain(workdir: Path, out: Path, parallel: list[str], layers: int = 2) -> Run:
    args = [*MODEL, "--num-layers", str(layers), *RUN, *DATA, *NO_APEX_NO_TE, *parallel]
    return run_program(workdir, "pretrain_gpt.py", args, out, 4, env=ENV)


def iterations(run: Run) -> list[tuple[int, float, float]]:
    """Megatron's iteration lines (iteration, elapsed ms, lm loss), from whichever rank logs them."""
    for rank in range(4):
        found = [(int(m[1]), float(m[2]), float(m[3])) for m in ITERATION.finditer(run.log(rank))]
        if found:
            return found
    return []


def barrier_ms(run: Run) -> float:
    """The `dist.barrier()` that restarts Megatron's timer, as the logging rank ran it: the host's launch of its
    all-reduce (on by default since 39f211b9: the host waits at the barrier, so the launch is not hidden) and the
    all-reduce itself (the trace's longest `barrier#` on that rank)."""
    rank = next(r for r in range(4) if ITERATION.search(run.log(r)))
    events = json.loads((run.out / "trace.json").read_text())["traceEvents"]
    g_us = max(e["dur"] for e in events if e.get("pid") == rank and str(e.get("name")).startswith("barrier#"))
    return (g_us + host_launch_us(DEFAULT_BATCHES)) / 1e3


def timer_is_the_step(its: list[tuple[int, float, float]], steps: list[dict], barrier_ms: float = 0.0) -> None:
    """Megatron's own 'elapsed time per iteration' against phantora's simulated steps (Megatron prints 0.1 ms).
    Megatron does not reset its interval timer after the first iteration (training.py `training_log`:
    `should_reset = not is_first_iteration`, its iteration count likewise), so iteration 2 prints the mean of
    iterations 1 and 2 since the timer started: (iteration 1's figure + step 2) / 2, within half of the first
    figure's rounding more; iteration 3 prints its own step, less the `dist.barrier()` that restarts the timer
    (`barrier_ms`: about 15 us on one host with the host's launch, 17.7 us across testbed16's hosts; either can
    cross a rounding boundary, as a 2.061 ms step printed 2.0 did, so the callers pass it)."""
    (_, first, _), (_, second, _), *rest = its
    step2 = steps[1]["time_ns"] / 1e6 - barrier_ms
    assert second == pytest.approx((first + step2) / 2, abs=0.05 + 0.025 + 1e-9)
    for (_, ms, _), step in zip(rest, steps[2:], strict=True):
        assert ms == pytest.approx(step["time_ns"] / 1e6 - barrier_ms, abs=0.05 + 1e-9)


def trains(run: Run) -> None:
    """3 iterations, Megatron's own timer phantora's simulated step (`timer_is_the_step`), and a first loss of
    about ln(vocabulary): an untrained model's prediction is close to uniform."""
    assert run.returncode == 0, run.output[-3000:]
    its = iterations(run)
    assert [i for i, _, _ in its] == [1, 2, 3] and len(run.steps()) == 3
    timer_is_the_step(its, run.steps(), barrier_ms(run))
    assert its[0][2] == pytest.approx(math.log(VOCAB), rel=0.02)


def test_tensor_parallel_with_the_distributed_optimizer(workdir: Path, tmp_path: Path) -> None:
    """TP 2 x DP 2, Megatron's distributed optimizer."""
    run = pretrain(workdir, tmp_path / "out", ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"])
    trains(run)
    assert_documented(run.step_ms(), "pretrain_gpt.py", "2 layers, TP 2 x DP 2")


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "interleaved"])
def test_pipeline_parallel(workdir: Path, tmp_path: Path, schedule: str) -> None:
    """PP 2 x DP 2 over 4 layers: 1F1B, or interleaved with one layer per virtual stage (2 per rank)."""
    parallel = ["--pipeline-model-parallel-size", "2"]
    if schedule == "interleaved":
        parallel += ["--num-layers-per-virtual-pipeline-stage", "1"]
    run = pretrain(workdir, tmp_path / "out", parallel, layers=4)
    trains(run)
    assert_documented(run.step_ms(), "pretrain_gpt.py", f"4 layers, PP 2 x DP 2, {schedule}")


@pytest.mark.slow
def test_moe_needs_transformer_engine_at_this_tag(workdir: Path, tmp_path: Path) -> None:
    """MoE (4 experts, EP 2) stops in megatron-core 0.16.1's router: without Transformer Engine the name
    `te_general_gemm` is never defined (moe_utils.py imports it only with TE, :22-37), and the router's gating
    function tests it before anything else (:1192), on a real GPU as here: an upstream limitation, fixed in
    9ed8b0c (core_v0.17.0). The run ends on Megatron's own error in one line naming the program's line."""
    parallel = ["--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-router-topk", "2"]
    run = pretrain(workdir, tmp_path / "out", parallel)
    assert run.returncode != 0
    last = run.log(0).strip().splitlines()[-1]
    assert last.startswith("phantora: rank 0 failed (at ")
    assert last.endswith("megatron/core/transformer/moe/moe_utils.py:1192 in forward): NameError: name "
                         "'te_general_gemm' is not defined")  # fmt: skip


def collectives(out: Path, rank: int = 0) -> list[tuple[str, int]]:
    """(kind, bytes) of each collective `rank` issued, in order (trace.json)."""
    events = json.loads((out / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return [
        (str(e["name"]).split("#")[0], int(e["args"]["bytes"]))
        for e in events
        if e.get("pid") == rank and e.get("cat") != "compute" and e.get("ph") == "X" and "bytes" in e.get("args", {})
    ]


@pytest.mark.slow
def test_sequence_parallel_with_the_simulated_apex(workdir: Path, tmp_path: Path) -> None:
    """TP 2 x DP 2 with `--sequence-parallel`. The local spec's norm is apex's FusedLayerNorm (torch's refuses
    sequence parallelism), here phantora's simulated apex (runtime/simcuda/simapex.py), said once.

    The traffic is Megatron's sequence-parallel design (Korthikanti et al. 2022, Megatron-core
    tensor_parallel/layers.py and mappings.py): between TP regions the activations are sharded along the sequence, so
    each column-parallel linear all-gathers its [s, b, h] input in forward and again in backward (for its weight
    gradient) and reduce-scatters its input gradient, and each row-parallel linear reduce-scatters its output in
    forward and all-gathers its output gradient in backward. A layer has two of each (QKV and fc1; the attention
    projection and fc2): 6 all-gathers and 4 reduce-scatters. The output layer is a column-parallel linear (2 and 1);
    the learned position embedding makes the embedding all-reduce, then split (its backward: 1 all-gather). Each
    moves the whole activation, s x b x h x 4 B (fp32), and there are 8 / (2 x 2) = 2 micro-batches a step."""
    parallel = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
    run = pretrain(workdir, tmp_path / "out", parallel)
    trains(run)
    # Megatron-core's attention.py tries `from flash_attn import ...` at import, which finds the simulated FA2
    # (simflash.py, since 60dbf445) and names it; the local spec runs none of its kernels
    assert run.output.count("simulated packages: apex, flash-attn") == 1
    assert run.output.count("flash-attn imported, none of its functions called") == 1
    assert run.results()["simulated_packages"] == ["apex", "flash-attn"]
    assert run.results()["simulated_packages_unused"] == ["flash-attn"]
    assert not [k for k in run.kernels() if "flash" in k.lower()]
    layers, micro, activation = 2, 8 // (2 * 2), 128 * 2 * 128 * 4
    comm = collectives(tmp_path / "out")
    for kind, per_micro in (("all_gather", 6 * layers + 2 + 1), ("reduce_scatter", 4 * layers + 1)):
        sizes = [n for k, n in comm if k == kind and n >= activation]
        assert sizes == [activation] * (3 * micro * per_micro), kind
    assert_documented(run.step_ms(), "pretrain_gpt.py", "2 layers, `--sequence-parallel`, TP 2 x DP 2")


def spans(out: Path) -> list[tuple[int, str, int, tuple[int, ...], dict | None]]:
    """(rank, kind, bytes, group, NCCL's choice) of every collective span in trace.json, in order."""
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    return [
        (
            e["pid"],
            str(e["name"]).split("#")[0],
            int(e["args"]["bytes"]),
            tuple(e["args"]["group"]),
            e["args"].get("nccl"),
        )
        for e in events
        if e.get("cat") == "comm" and e.get("ph") == "X" and "bytes" in e.get("args", {})
    ]


@pytest.mark.slow
def test_sequence_parallel_with_an_interleaved_pipeline_and_the_distributed_optimizer(
    workdir: Path, tmp_path: Path
) -> None:
    """TP 2 with `--sequence-parallel` x PP 2 interleaved (`--num-layers-per-virtual-pipeline-stage 1`: model chunks
    0 and 2 on stage 0, 1 and 3 on stage 1) with `--use-distributed-optimizer`, 4 layers on 4 GPUs (DP 1: 8 / 2 = 4
    micro-batches a step). The closed forms of the config, per rank over 3 steps (12 micro-batches):

    - sequence parallelism (as the TP 2 x DP 2 case): a layer's 6 all-gathers and 4 reduce-scatters of the whole
      s x b x h x 4 B activation on the TP pair, 2 layers a stage; the embedding (stage 0) adds 1 all-gather, the
      output layer (stage 1) 2 all-gathers and 1 reduce-scatter;
    - the pipeline: each micro-batch crosses the 3 chunk boundaries forward and back, stage 0 sending 2 of the
      forward and 1 of the backward, stage 1 the others: 3 sends and 3 receives a micro-batch of the
      sequence-sharded activation, s / TP x b x h x 4 B, to the other stage's rank of the same TP position
      (flows.csv: 36 x 65,536 B each way between gpu0-gpu2 and gpu1-gpu3);
    - the tied word embedding's gradient, all-reduced between the first and the last stage (Megatron's embedding
      group) once a step, and once at set-up: padded vocabulary / TP x h x 4 B, 4 times;
    - the distributed optimizer's reduce-scatters and all-gathers run on a data-parallel group of one: no NCCL
      call, so their spans carry no choice, and every other span with bytes carries its own (trace.json)."""
    parallel = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2"]
    parallel += ["--num-layers-per-virtual-pipeline-stage", "1", "--use-distributed-optimizer"]
    out = tmp_path / "out"
    run = pretrain(workdir, out, parallel, layers=4)
    trains(run)
    s, b, h, tp, micro = 128, 2, 128, 2, 3 * 8 // 2
    activation, sharded = s * b * h * 4, s // tp * b * h * 4
    comm = spans(out)
    for rank in range(4):
        first = rank < 2
        mine = [(k, n, g) for r, k, n, g, _ in comm if r == rank]
        tp_group = (rank - rank % 2, rank - rank % 2 + 1)
        for kind, per_micro in (
            ("all_gather", 6 * 2 + (1 if first else 2)),
            ("reduce_scatter", 4 * 2 + (0 if first else 1)),
        ):
            assert [n for k, n, g in mine if k == kind and g == tp_group and n == activation] == [activation] * (
                micro * per_micro
            ), (rank, kind)
        peer = (rank + 2) % 4
        for kind in ("send", "recv"):
            assert [n for k, n, g in mine if k == kind] == [sharded] * (3 * micro), (rank, kind)
            assert {g for k, _, g in mine if k == kind} == {(peer,)}
        embedding = (rank % 2, rank % 2 + 2)
        assert [n for k, n, g in mine if k == "all_reduce" and g == embedding] == [VOCAB // tp * h * 4] * 4
    for _, kind, nbytes, group, choice in comm:
        if kind not in ("send", "recv") and len(group) == 1:
            assert choice is None, (kind, nbytes, group)
        elif nbytes:
            assert choice is not None, (kind, nbytes, group)
    with (out / "flows.csv").open() as f:
        p2p = [r for r in csv.DictReader(f) if r["tag"].startswith("send#")]
    for src, dst in ((0, 2), (2, 0), (1, 3), (3, 1)):
        pair = [int(r["size_bytes"]) for r in p2p if (r["src"], r["dst"]) == (f"gpu{src}", f"gpu{dst}")]
        assert sum(pair) == 3 * micro * sharded, (src, dst)
    assert_documented(run.step_ms(), "pretrain_gpt.py", "4 layers, TP 2 x PP 2 interleaved, `--sequence-parallel`")


@pytest.mark.slow
def test_record_memory_history_dumps_a_snapshot_memory_viz_reads(workdir: Path, tmp_path: Path) -> None:
    """TP 2 x DP 2 with `--record-memory-history`: model_provider.py records with the legacy call and attaches an
    OOM observer (torch._C), and training.py pickles `torch.cuda.memory._snapshot()` on the last rank. The snapshot
    agrees with its own trace: every block the trace allocates and does not free is an active block of a segment;
    torch's `segsum` reads it (it reports a block/segment size mismatch in its text)."""
    import pickle

    from torch.cuda import _memory_viz

    snap = tmp_path / "snapshot.pickle"
    parallel = ["--tensor-model-parallel-size", "2", "--record-memory-history", "--memory-snapshot-path", str(snap)]
    run = pretrain(workdir, tmp_path / "out", parallel)
    trains(run)
    data = pickle.loads(snap.read_bytes())
    traces = [t for t in data["device_traces"] if t]
    assert len(traces) == 1 and {e["action"] for e in traces[0]} <= set(TRACE_ACTIONS)
    live: dict[int, int] = {}
    for e in traces[0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    blocks = [b for s in data["segments"] for b in s["blocks"]]
    active = {b["address"]: b["size"] for b in blocks if b["state"] == "active_allocated"}
    assert live and all(active.get(addr) == size for addr, size in live.items())
    for s in data["segments"]:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    assert "mismatch" not in _memory_viz.segsum(data)
