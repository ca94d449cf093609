"""Probe the simulated CUDA device as a CUDA program sees it; the last rank (not on device 0) writes what it saw
as JSON (argv[1])."""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

out: dict = {}
local = int(os.environ["LOCAL_RANK"])
out["initialized_at_start"] = [torch.cuda.is_initialized(), torch.cuda._initialized]  # CUDA initialises lazily
queued: list = []
torch.cuda._lazy_call(lambda: queued.append(torch.cuda.is_initialized()))  # runs at initialisation
out["available"] = torch.cuda.is_available()
out["count"] = torch.cuda.device_count()
out["initialized_after_count"] = torch.cuda.is_initialized()
torch.cuda.set_device(local)
out["initialized"] = [torch.cuda.is_initialized(), torch.cuda._initialized, queued]
out["current"] = torch.cuda.current_device()
out["name"] = torch.cuda.get_device_name()
props = torch.cuda.get_device_properties(local)
out["total_memory"] = props.total_memory
out["sms"] = props.multi_processor_count
out["capability"] = list(torch.cuda.get_device_capability())
out["bf16"] = torch.cuda.is_bf16_supported()
out["version"] = torch.version.cuda
dist.init_process_group("cuda:nccl,cpu:gloo")
out["default_backend"] = [dist.get_default_backend_for_device(d) for d in ("cuda", torch.device("cuda", local))]
x = torch.ones(1024, 1024, device="cuda")  # 4 MiB
out["device"] = str(x.device)
out["is_cuda"] = x.is_cuda
before = torch.cuda.memory_allocated()
y = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")  # 1 MiB more
out["alloc_delta"] = torch.cuda.memory_allocated() - before
del y
torch.cuda.empty_cache()
reserved = torch.cuda.memory_reserved()
z = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # >= 10 MiB: a segment of its own size
grown = torch.cuda.memory_reserved() - reserved
del z
kept = torch.cuda.memory_reserved() - reserved  # freed, still cached
torch.cuda.empty_cache()
out["reserved"] = [grown, kept, torch.cuda.memory_reserved() - reserved]
out["from_list"] = str(torch.tensor([1, 2, 3], device="cuda").device)
acc = torch.accelerator
with acc.device_index(0):
    inside = acc.current_device_index()
out["accelerator"] = [
    acc.current_device_index(),
    inside,
    acc.memory_allocated() == torch.cuda.memory_allocated() > 0,
    acc.get_memory_info() == torch.cuda.mem_get_info(),
    torch.float8_e4m3fn in acc.get_device_capability()["supported_dtypes"],
    list(torch.cuda.Stream.priority_range()),
]
index = torch.cuda.current_device()  # an integer device is the current accelerator's (Megatron-LM)
out["int_device"] = [str(torch.tensor(3, device=index).device), str(torch.zeros(2, device=index).device)]
with torch.device("meta"):  # a device context reaches torch.tensor & co as it reaches torch's other factories
    out["device_context"] = [str(torch.tensor([]).device), str(torch.as_tensor([1.0]).device)]
with torch.device("cuda"):
    out["device_context"].append(str(torch.tensor([1.0]).device))
out["pinned_to_cuda"] = str(torch.arange(4).pin_memory().to("cuda", non_blocking=True).device)
out["host_copy"] = str(x.cpu().device)
out["dot_cuda"] = [str(torch.zeros(2).cuda().device), str(torch.zeros(2).to("cuda").device)]  # the current device
out["pinned"] = [torch.arange(4).pin_memory().is_pinned(), torch.empty(4, pin_memory=True).is_pinned()]
out["graph_is_class"] = isinstance(torch.cuda.CUDAGraph, type)  # annotations such as `CUDAGraph | None`
if os.environ.get("PHANTORA_PHANTOM") != "1":  # values: real mode only
    out["tolist"] = torch.arange(3, device="cuda").tolist()
    out["scalars"] = torch.tensor([torch.ones((), device="cuda") * 2, torch.ones((), device="cuda")]).tolist()
    gen = torch.cuda.default_generators[local].manual_seed(7)
    state = torch.cuda.random.get_rng_state()
    first = torch.rand(3, device="cuda").tolist()
    gen.set_state(state)
    out["replayed"] = torch.rand(3, device="cuda").tolist() == first and gen.initial_seed() == 7
    host = torch.empty(4, pin_memory=True)  # a non-blocking copy into pinned memory holds the values once synced
    host.copy_(torch.arange(4.0, device="cuda"), non_blocking=True)
    torch.cuda.current_stream().synchronize()
    out["nonblocking_to_host"] = host.tolist()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 256  # phantom mode times a large one without computing it
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(10):
    a @ a
end.record()
torch.cuda.synchronize()
out["matmul_ms"] = start.elapsed_time(end) / 10
out["matmul_n"] = n
dist.all_reduce(x)
out["all_reduce"] = float(x[0, 0].item()) if not os.environ.get("PHANTORA_PHANTOM") == "1" else None
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    out["side_stream"] = torch.cuda.current_stream() == side
out["default_back"] = torch.cuda.current_stream() == torch.cuda.default_stream()
# sdpa_kernel / sdp_kernel contexts on plain cuda tensors: the backend each allows runs, with the math path's values
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

qkv = torch.randn(3, 2, 4, 64, 32, device="cuda")
ref = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True)
out["sdpa"] = {}
for backend, dtype in ((SDPBackend.FLASH_ATTENTION, torch.bfloat16), (SDPBackend.EFFICIENT_ATTENTION, torch.float16)):
    q = qkv.to(dtype).requires_grad_()
    with sdpa_kernel(backend):
        o = torch.nn.functional.scaled_dot_product_attention(*q, is_causal=True)
    o.sum().backward()
    diff = None if os.environ.get("PHANTORA_PHANTOM") == "1" else float((o.float() - ref).abs().max())
    out["sdpa"][backend.name] = [str(o.device), str(o.dtype), q.grad is not None, diff]
with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False):
    flags = [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()]
    flags.append(str(torch.nn.functional.scaled_dot_product_attention(*qkv.bfloat16()).device))
out["sdp_kernel"] = [*flags, torch.backends.cuda.math_sdp_enabled()]  # restored on exit
causal = torch.ones(64, 64, dtype=torch.bool, device="cuda").tril()  # a boolean mask: the efficient kernel's bias
masked = torch.nn.functional.scaled_dot_product_attention(*qkv, attn_mask=causal)
with sdpa_kernel(SDPBackend.MATH):
    math = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True)
if os.environ.get("PHANTORA_PHANTOM") != "1":
    out["sdpa_masked_math"] = [float((masked - ref).abs().max()), float((math - ref).abs().max())]
try:  # flash takes fp16/bf16 only: an fp32 call with only flash allowed has no kernel, as on a GPU
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), warnings.catch_warnings(record=True):
        torch.nn.functional.scaled_dot_product_attention(*qkv)
    out["flash_fp32"] = "ran"
except RuntimeError as exc:
    out["flash_fp32"] = str(exc)
out["flash_available"] = torch.backends.cuda.is_flash_attention_available()
out["nccl_version"] = list(torch.cuda.nccl.version())
# GradScaler and autocast with device_type="cuda"
lin = torch.nn.Linear(64, 64).cuda()
scaler = torch.amp.GradScaler("cuda")
with torch.autocast(device_type="cuda", dtype=torch.float16):
    y = lin(torch.randn(8, 64, device="cuda"))
    amp = [str(y.dtype), torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda") == torch.float16]
scaler.scale(y.float().pow(2).mean()).backward()
scaler.step(torch.optim.SGD(lin.parameters(), lr=0.1))
scaler.update()
out["amp"] = [*amp, None if os.environ.get("PHANTORA_PHANTOM") == "1" else scaler.get_scale()]
# stream priorities, torch.accelerator's setters, nvtx
streams = [torch.cuda.Stream(priority=p) for p in (0, -1, -3)]
acc.set_device_index(local)
acc.synchronize()
torch.cuda.nvtx.range_push("step")
torch.cuda.nvtx.mark("here")
torch.cuda.nvtx.range_pop()
with torch.cuda.nvtx.range("block"):
    pass
out["streams"] = [s.priority for s in streams] + [acc.current_device_index()]
for call in ("make_graphed_callables", "record_memory_history"):
    try:
        if call == "make_graphed_callables":
            torch.cuda.make_graphed_callables(lin, (torch.randn(2, 64, device="cuda"),))
        else:
            torch.cuda.memory._record_memory_history(max_entries=100)
        out[call] = "no error"
    except Exception as exc:  # noqa: BLE001 - the probe reports what was raised
        out[call] = f"{type(exc).__name__}: {exc}"
for call in ("graph", "oom"):
    try:
        if call == "graph":
            torch.cuda.CUDAGraph()
        else:
            torch.empty(2 * props.total_memory, dtype=torch.uint8, device="cuda")
        out[call] = "no error"
    except Exception as exc:  # noqa: BLE001 - the probe reports what was raised
        out[call] = f"{type(exc).__name__}: {exc}"
if dist.get_rank() == dist.get_world_size() - 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
dist.destroy_process_group()
