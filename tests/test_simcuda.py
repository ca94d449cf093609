"""The simulated CUDA device: programs written for CUDA + NCCL run unchanged under `phantora run`.

Each test runs real rank processes; the probe script (tests/scripts/cuda_probe.py) reports what a
CUDA program sees. Expected values come from the GPU table and vendor figures, the losses from the
same training on gloo without phantora.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from test_runtime_e2e import GPT_ARGS, losses, run_gloo, star

from bridge.errors import BridgeError
from phantora.collectives.nccl.tables import MODEL_NCCL_VERSION
from phantora.launcher import RunConfig, RunReport, launch
from phantora.perfmodel.gpus import get_gpu
from phantora.runtime.compute import Calibrated
from phantora.runtime.memory import capacity_of
from phantora.runtime.simcuda import attention

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "scripts" / "cuda_probe.py"
CUDA_DDP = ROOT / "examples" / "cuda_ddp.py"
# What CUDA reports for each GPU (nvidia-smi / torch.cuda.get_device_name on the real parts; compute capability
# from NVIDIA's CUDA GPUs table)
CUDA_NAME = {"h100": "NVIDIA H100 80GB HBM3", "a100": "NVIDIA A100-SXM4-80GB"}
CAPABILITY = {"h100": (9, 0), "a100": (8, 0)}
SMS = {"h100": 132, "a100": 108}  # the SXM parts' streaming multiprocessors (NVIDIA's H100 and A100 data sheets)


def probe(tmp_path: Path, *, gpu: str = "h100", tensors: str = "real", size: int = 256) -> dict:
    out = tmp_path / f"probe-{gpu}-{tensors}.json"
    launch(RunConfig(str(PROBE), [str(out), str(size)], "testbed16", nproc=2, gpu=gpu, tensors=tensors, timeout_s=300))
    return json.loads(out.read_text())


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_the_device_answers_the_gpus_name_capability_and_size(monkeypatch: pytest.MonkeyPatch, gpu: str) -> None:
    """The GPU-specific answers of the probe below, in this process (the a100 probe run is slow): the simulated
    device of `gpu` is named, versioned and sized as the real part."""
    from phantora.runtime.simcuda import api, devices

    spec = get_gpu(gpu)
    monkeypatch.setitem(devices.state, "gpu", spec)
    assert api.get_device_name() == CUDA_NAME[gpu]
    assert api.get_device_capability() == CAPABILITY[gpu]
    props = api.get_device_properties(0)
    assert (props.name, (props.major, props.minor)) == (CUDA_NAME[gpu], CAPABILITY[gpu])
    assert (props.multi_processor_count, props.total_memory) == (SMS[gpu], capacity_of(spec))
    assert api.get_arch_list() == ["sm_{}{}".format(*CAPABILITY[gpu])] and api.is_bf16_supported()


# the a100 run checks the same GPU-specific answers through a live run (the fast test above); slow
@pytest.mark.parametrize("gpu", ["h100", pytest.param("a100", marks=pytest.mark.slow)])
def test_torch_cuda_answers_as_the_simulated_gpu(tmp_path: Path, gpu: str) -> None:
    seen = probe(tmp_path, gpu=gpu)
    spec = get_gpu(gpu)
    assert seen["available"] and seen["count"] == 2 and seen["current"] == 1  # testbed16: 2 of a host's GPUs
    # lazy initialisation: not at start nor by device_count; set_device initialises and runs the queued call
    assert seen["initialized_at_start"] == [False, False] and not seen["initialized_after_count"]
    assert seen["initialized"] == [True, True, [False]]
    assert seen["name"] == CUDA_NAME[gpu]
    assert seen["capability"] == list(CAPABILITY[gpu])
    assert seen["sms"] == SMS[gpu] and seen["total_memory"] == capacity_of(spec)
    assert seen["bf16"] and seen["version"]
    assert seen["device"] == "cuda:1" and seen["is_cuda"]
    assert seen["from_list"] == seen["pinned_to_cuda"] == "cuda:1" and seen["host_copy"] == "cpu"
    assert seen["int_device"] == ["cuda:1", "cuda:1"]  # torch.tensor(n, device=torch.cuda.current_device())
    # inside `with torch.device(...)` torch.tensor builds on that device, as torch's other factories do
    # (transformers' from_pretrained asks torch.tensor([]).device whether it builds on meta)
    assert seen["device_context"] == ["meta", "meta", "cuda:1"]
    # torch.accelerator: the device, a device_index context, memory as torch.cuda's, capability; stream priorities
    assert seen["accelerator"] == [1, 0, True, True, True, [0, -3]]
    assert seen["dot_cuda"] == ["cuda:1", "cuda:1"]  # `.cuda()` and `.to("cuda")` go to the current device
    assert seen["pinned"] == [True, True] and seen["graph_is_class"]
    assert seen["tolist"] == [0, 1, 2] and seen["scalars"] == [2.0, 1.0]
    assert seen["nonblocking_to_host"] == [0.0, 1.0, 2.0, 3.0]
    assert seen["replayed"]  # torch.cuda.default_generators: set_state replays the same draws
    assert seen["alloc_delta"] == 1 << 20  # memory_allocated counts the simulated device's bytes
    assert seen["reserved"] == [64 << 20, 64 << 20, 0]  # a 64 MiB segment; cached when freed; empty_cache
    assert seen["all_reduce"] == 2.0  # "cuda:nccl,cpu:gloo": the all-reduce of ones over 2 ranks moved real data
    # a CUDA build's default backend for cuda is NCCL (torch's Backend.default_device_backend_map); the FSDP2 and
    # DDP examples pass it to init_process_group
    assert seen["default_backend"] == ["nccl", "nccl"]
    assert seen["side_stream"] and seen["default_back"]
    assert seen["graph"].startswith("NotSimulatedError: torch.cuda.CUDAGraph")
    # sdpa_kernel(FLASH) in bf16 and (EFFICIENT) in fp16 run on the device, with backward, to the math path's values
    # within each dtype's rounding; the deprecated sdp_kernel context sets torch's flags and restores them
    flash, efficient = seen["sdpa"]["FLASH_ATTENTION"], seen["sdpa"]["EFFICIENT_ATTENTION"]
    assert flash[:3] == ["cuda:1", "torch.bfloat16", True] and flash[3] < 0.05
    assert efficient[:3] == ["cuda:1", "torch.float16", True] and efficient[3] < 0.01
    assert seen["sdp_kernel"] == [True, False, "cuda:1", True]
    assert seen["flash_fp32"] == "No available kernel. Aborting execution."  # torch's own error
    assert max(seen["sdpa_masked_math"]) < 1e-5  # a boolean mask (efficient) and sdpa_kernel(MATH): the same values
    assert seen["flash_available"]  # torch's CUDA wheels are built with flash attention (USE_FLASH_ATTENTION)
    # torch.cuda.nccl.version() (c10d logging and DCP call it once get_backend() says "nccl"): the modelled NCCL
    assert seen["nccl_version"] == [*MODEL_NCCL_VERSION, 0]
    # autocast(device_type="cuda") runs a Linear in fp16; GradScaler("cuda") keeps torch's init_scale 2**16 after a
    # finite step (it grows only after growth_interval = 2000 such steps)
    assert seen["amp"] == ["torch.float16", True, True, 65536.0]
    # a stream keeps the priority asked within (0, -3); accelerator.set_device_index; nvtx calls are accepted
    assert seen["streams"] == [0, -1, -3, 1]
    call = "make_graphed_callables"  # refused in one line naming the call
    assert seen[call].startswith("NotSimulatedError: torch.cuda.") and "\n" not in seen[call]
    assert seen["record_memory_history"] == "no error"  # recorded as on a GPU (tests/test_memory_history.py)
    assert seen["oom"].startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate")


def test_cuda_events_time_a_matmul_as_the_gpu_model_does(tmp_path: Path) -> None:
    """Phantom mode, 8192^3 bf16 on H100: published cuBLAS runs reach 60-80% of the 989 TFLOP/s peak."""
    seen = probe(tmp_path, tensors="phantom", size=8192)
    n = seen["matmul_n"]
    achieved = 2 * n**3 / (seen["matmul_ms"] / 1e3)
    assert 0.5 * 989e12 < achieved < 0.85 * 989e12
    assert seen["device"] == "cuda:1" and seen["all_reduce"] is None
    assert seen["oom"].startswith("OutOfMemoryError")


CUDA_DDP_ARGS = [*GPT_ARGS, "--steps", "3"]


@pytest.fixture(scope="module")
def cuda_ddp_real(tmp_path_factory: pytest.TempPathFactory) -> RunReport:
    """examples/cuda_ddp.py run once in real mode on 2 ranks: the two tests below read the same run."""
    out = tmp_path_factory.mktemp("cuda-ddp") / "out"
    return launch(RunConfig(str(CUDA_DDP), CUDA_DDP_ARGS, star(2), nproc=2, out_dir=out, timeout_s=300))


def test_unmodified_cuda_ddp_script_trains_as_on_gloo(cuda_ddp_real: RunReport) -> None:
    """examples/cuda_ddp.py (CUDA + NCCL, no phantora API) under phantora: the losses of the same script on
    gloo; steps marked by its optimizer; its own CUDA-event step times are phantora's simulated ones."""
    want = losses(run_gloo(CUDA_DDP, [*CUDA_DDP_ARGS, "--device", "cpu"], 2)[0])
    rep = cuda_ddp_real
    log = rep.logs["rank 0"]
    assert losses(log) == want and len(want) == 3
    steps = rep.summary["steps"]
    assert len(steps) == 3
    event_ms = [float(x) for x in re.findall(r"time ([0-9.]+) ms", log)]
    # the event window starts before the batch's host-to-device copy: within 5% of the step
    for ms, st in zip(event_ms[1:], steps[1:], strict=True):
        assert ms == pytest.approx(st["time_ns"] / 1e6, rel=0.05)


def test_phantom_cuda_program_times_equal_real(cuda_ddp_real: RunReport) -> None:
    """The steady step; DDP rebuilds its buckets from the first steps' gradient order only in real mode."""
    real = cuda_ddp_real.summary["steps"]
    cfg = RunConfig(str(CUDA_DDP), CUDA_DDP_ARGS, star(2), nproc=2, tensors="phantom", timeout_s=300)
    ph = launch(cfg).summary["steps"]
    assert ph[-1]["time_ns"] == real[-1]["time_ns"] > 0


def test_without_the_simulated_device_cuda_is_unavailable(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import torch\nprint('cuda available:', torch.cuda.is_available())\n")
    rep = launch(RunConfig(str(script), [], star(2), nproc=1, sim_cuda=False, timeout_s=120))
    assert "cuda available: False" in rep.logs["rank 0"]


CUDA_FSDP = ROOT / "tests" / "scripts" / "cuda_fsdp.py"


def test_unmodified_fsdp2_on_a_cuda_mesh_trains_as_on_gloo() -> None:
    """Meta-device init, to_empty("cuda"), DTensor shards on a cuda DeviceMesh, NCCL: the losses of gloo."""
    want = losses(run_gloo(CUDA_FSDP, ["cpu"], 2)[0])
    real = launch(RunConfig(str(CUDA_FSDP), [], "testbed16", nproc=2, timeout_s=300))
    assert losses(real.logs["rank 0"]) == want and len(want) == 3
    assert "on cuda" in real.logs["rank 0"]


@pytest.mark.slow  # two 2-rank runs; fast: phantom equals real on the DDP program (above), FSDP2 trains (above)
def test_unmodified_fsdp2_in_phantom_mode_times_its_steps_as_in_real_mode() -> None:
    """FSDP2's DTensor shards without their data: the step times of real mode."""
    real = launch(RunConfig(str(CUDA_FSDP), [], "testbed16", nproc=2, timeout_s=300))
    ph = launch(RunConfig(str(CUDA_FSDP), [], "testbed16", nproc=2, tensors="phantom", timeout_s=300))
    # steps after the first (which also holds the initialisation, whose host copies differ in phantom mode)
    assert [s["time_ns"] for s in ph.summary["steps"][1:]] == [s["time_ns"] for s in real.summary["steps"][1:]]


def test_unmodified_tensor_parallel_on_a_cuda_mesh_trains_as_on_gloo() -> None:
    """DTensor TP's functional collectives give GPU tensors, and its backward runs: the losses of gloo."""
    script = ROOT / "tests" / "scripts" / "cuda_tp.py"
    want = losses(run_gloo(script, ["cpu"], 2)[0])
    real = launch(RunConfig(str(script), [], "testbed16", nproc=2, timeout_s=300))
    assert losses(real.logs["rank 0"]) == want and len(want) == 3
    assert "on cuda" in real.logs["rank 0"]


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_triton_kernels_are_charged_an_estimate_and_listed(tmp_path: Path, tensors: str) -> None:
    """A program's own triton kernels: right values in real mode (triton's interpreter on the host data, a kernel's
    @triton.jit helpers interpreted with it), each launch charged its tensor arguments' bytes at HBM bandwidth plus
    the launch, and listed."""
    n = 1 << 16  # triton's interpreter runs the kernels element by element in real mode: keep them small
    script = ROOT / "tests" / "scripts" / "cuda_triton.py"
    cfg = RunConfig(str(script), [str(n)], "testbed16", nproc=1, tensors=tensors, out_dir=tmp_path, timeout_s=300)
    rep = launch(cfg)
    if tensors == "real":
        assert "add right True scale right True square right True" in rep.logs["rank 0"]
    listed = rep.summary["untimed_kernels"]
    assert listed["triton::add_kernel"]["count"] == 1 and listed["triton::scale_kernel"]["count"] == 2  # no trials
    assert "HBM bandwidth" in listed["triton::add_kernel"]["charged"]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    durs = {e["name"]: e["dur"] for e in events if e.get("name", "").startswith("triton::")}
    gpu, launch_ns = get_gpu("h100"), 1000  # the default launch overhead (docs/runtime.md)
    assert listed["triton::square_kernel"]["count"] == 1  # its helper runs inside it: no launch of its own
    sizes = (
        ("triton::add_kernel", 3 * 4 * n),
        ("triton::scale_kernel", 2 * 4 * n),
        ("triton::square_kernel", 2 * 4 * n),
    )
    for name, tensors_bytes in sizes:
        want_ns = math.ceil(tensors_bytes / gpu.mem_bw * 1e9) + launch_ns
        assert durs[name] * 1000 == pytest.approx(want_ns, abs=1), name


def test_rng_flex_attention_and_peak_reset_as_on_a_gpu(tmp_path: Path) -> None:
    """Counter-based RNG (replay, DTensor shards, checkpoint's dropout replay); FlexAttention against
    SDPA (values, gradients, the time of the kernel each runs); a program's peak reset leaves the run's peak."""
    out = tmp_path / "seen.json"
    script = str(ROOT / "tests" / "scripts" / "cuda_rng_attention.py")
    rep = launch(RunConfig(script, [str(out)], "testbed16", nproc=2, out_dir=tmp_path / "run"))
    seen = json.loads(out.read_text())
    assert seen["replays"] and seen["successive_differ"] and seen["host_untouched"]
    assert seen["offset_moved"] == 12  # 10 values, rounded up to Philox's 4 per call
    assert seen["dtensor_draws_differ"] and seen["checkpoint_mask_replayed"]
    assert seen["flex_device"] == "cuda:0"
    assert seen["flex_max_diff"] < 1e-5 and seen["flex_grad_max_diff"] < 1e-4
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    dur: dict[str, list[float]] = {}  # rank 0's kernels by name, in program order: the fp32 calls, then bf16
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("pid") == 0:
            dur.setdefault(e["name"], []).append(e["dur"])
    flex, flex_bwd = dur["flex_attention"], dur["flex_attention_backward"]
    assert len(flex) == len(flex_bwd) == 3
    # bf16: sdpa runs the flash kernel, and FlexAttention's fused kernel is charged as it, forward and backward
    flash = "aten._scaled_dot_product_flash_attention_for_cpu"
    assert dur[flash] == [flex[1]] and flex[1] > 0
    assert dur[flash + "_backward"] == [flex_bwd[1]] and flex_bwd[1] > flex[1]
    # fp32: sdpa runs the memory-efficient kernel (3 TF32 products per fp32 product); FlexAttention's Triton kernel
    # does its fp32 dots as torch's matmul precision says ("highest": IEEE fp32 on CUDA cores), H100: 67 TFLOP/s
    # against 494.5 / 3 = 164.8 (TF32 / 3) and 989 bf16 (data sheet), so it costs more than the efficient kernel
    efficient = "aten._scaled_dot_product_efficient_attention"
    assert flex[0] > dur[efficient][0] > 0 and flex[0] > flex[1]
    assert flex_bwd[0] > dur[efficient + "_backward"][0] and flex_bwd[0] > flex_bwd[1]
    assert seen["flex_ms"] >= seen["sdpa_ms"]  # bf16; plus the small ops of flex_attention's Python wrapper
    # bf16, a causal window of 128 over 1,024 (2 x 4 heads of 32): 2n - 1 = 15 of the causal mask's n(n + 1)/2 = 36
    # (128, 128) blocks (n = 8), so the causal kernel's pairs times 15/36, forward and backward (runtime/flex_blocks.py)
    model, pairs = Calibrated(get_gpu("h100"), 1000), round(1024 * 1025 // 2 * 15 / 36)
    x = torch.empty(2, 4, 1024, 32, dtype=torch.bfloat16, device="meta")
    lse, flags = torch.empty(2, 4, 1024, device="meta"), {"is_causal": True, "kept_pairs": pairs}
    forward = model.cost(attention.FLASH, (x, x, x), flags, (x, lse))
    backward = model.cost(attention.FLASH_BACKWARD, (x, x, x, x, x, lse), flags, (x, x, x))
    assert flex[2] * 1000 == pytest.approx(forward.ns, abs=1)
    assert forward.ns < model.cost(attention.FLASH, (x, x, x), {"is_causal": True}, (x, lse)).ns
    assert flex_bwd[2] * 1000 == pytest.approx(backward.ns, abs=1)
    assert seen["peak_after_reset"] == seen["allocated_after_reset"]
    assert rep.summary["memory"]["peak_bytes"] >= 256 << 20


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_memory_comes_back_when_dropped_and_shape_propagation_takes_none(tmp_path: Path, tensors: str) -> None:
    """With the cycle collector off, as torchtitan runs: an all-gather's output is free once the program drops it
    (phantora's collective path keeps no reference cycle); FakeTensorMode's tensors take no device memory;
    a model built on meta takes none until `to_empty` places its shards; FSDP2's freed unsharded parameters
    are free; torch.compile'd code runs (eagerly) on the simulated device."""
    out = tmp_path / "seen.json"
    script = str(ROOT / "tests" / "scripts" / "cuda_memory_lifetimes.py")
    rep = launch(RunConfig(script, [str(out)], "testbed16", nproc=2, tensors=tensors, out_dir=tmp_path / "run"))
    seen = json.loads(out.read_text())
    assert rep.logs["rank 0"].count("phantora: torch.compile runs eagerly") == 1  # said once, not per call
    n, world = 1 << 20, 2
    assert seen["one_tensor"] == 4 * n  # 4 MiB: a multiple of the allocator's 512-byte block
    assert seen["all_gather_output"] == 4 * n * world
    assert seen["after_async_all_reduce"] == 4 * n
    assert seen["fake_device"] == "cuda:0" and seen["fake_bytes"] == 0
    assert seen["meta_model_bytes"] == 0 and seen["placed_shard_bytes"] == 4096 * 4096 * 4 // world
    # after an FSDP2 forward only its output is left: each layer's 4 MiB unsharded weight was freed
    assert seen["fsdp_forward_kept"] == seen["fsdp_output_bytes"] == 8 * 1024 * 4
    assert seen["compiled_device"] == "cuda:0"
    if tensors == "real":
        assert seen["gathered_sum"] == world * n and seen["compiled"] == [1.0, 3.0, 5.0, 7.0]


def test_the_cuda_toolkit_answers_as_the_simulated_machines(tmp_path: Path) -> None:
    """CUDA_HOME and nvcc -V give torch.version.cuda's release (Megatron-LM parses it); compiling fails, and a CUDA
    extension build ends the run with one line naming the extension."""
    seen_file = tmp_path / "seen.json"
    script = ROOT / "tests" / "scripts" / "cuda_toolkit.py"
    with pytest.raises(BridgeError):
        launch(RunConfig(str(script), [str(seen_file)], "testbed16", nproc=1, out_dir=tmp_path / "out", timeout_s=120))
    seen = json.loads(seen_file.read_text())
    assert seen["torch_cuda"] == "12.4" and seen["release"] == "12.4," and seen["on_path"] == 0
    assert Path(seen["cuda_home"], "bin", "nvcc").is_file()
    assert seen["compile"][0] != 0 and "nvcc cannot compile for the simulated GPU" in seen["compile"][1]
    last = (tmp_path / "out" / "logs" / "rank0.log").read_text().strip().splitlines()[-1]
    assert "cuda_toolkit.py:21" in last
    assert "NotSimulatedError: building the CUDA extension 'fused_softmax' (torch.utils.cpp_extension.load)" in last
