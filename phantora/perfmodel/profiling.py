"""Recording a measured table on a CUDA machine: a small sweep of op calls, each timed with CUDA events.

Each spec builds distinct input buffers (so rows are not `aliased`) and a callable. Timing: warm-up
calls, then `iters` calls between two CUDA events; with `graphs=True` the calls are first captured
in a CUDA graph and replayed, so CPU launch overhead does not stretch short kernels (ops that cannot
be captured fall back to a plain loop, whose time is then an upper bound for kernels shorter than
a launch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from phantora.errors import PhantoraError
from phantora.perfmodel.features import OpCall, make_call
from phantora.perfmodel.ops import op_class
from phantora.perfmodel.table import MeasuredRow

Builder = Callable[[Any], tuple[Callable[[], Any], OpCall]]  # device -> (fn, recorded call)


@dataclass(frozen=True)
class Spec:
    """One op call to measure: its class (for --only) and a builder of (callable, OpCall) on a device."""

    op_class: str
    name: str
    build: Builder


def _t(torch: Any, shape: tuple[int, ...], dtype: str, device: Any) -> Any:
    """A fresh input tensor (random on a real device; shape-only on 'meta')."""
    if str(device) == "meta":
        return torch.empty(shape, dtype=getattr(torch, dtype), device=device)
    return torch.randn(shape, dtype=getattr(torch, dtype), device=device)


def _gemm(m: int, n: int, k: int, dtype: str) -> Spec:
    def build(device: Any) -> tuple[Callable[[], Any], OpCall]:
        import torch

        a, b = _t(torch, (m, k), dtype, device), _t(torch, (k, n), dtype, device)
        return (lambda: torch.ops.aten.mm(a, b)), make_call("aten::mm", [(m, k), (k, n)], [dtype, dtype])

    return Spec("gemm", f"mm {m}x{n}x{k} {dtype}", build)


def _attention(b: int, h: int, s: int, d: int, backward: bool) -> Spec:
    def build(device: Any) -> tuple[Callable[[], Any], OpCall]:
        import torch

        q, k, v = (_t(torch, (b, h, s, d), "bfloat16", device) for _ in range(3))
        fwd = torch.ops.aten._scaled_dot_product_flash_attention
        if not backward:
            call = make_call(fwd.default.name(), [q.shape] * 3, ["bfloat16"] * 3, {"causal": True})
            return (lambda: fwd(q, k, v, 0.0, True)), call
        o = fwd(q, k, v, 0.0, True)
        grad = _t(torch, (b, h, s, d), "bfloat16", device)
        bwd = torch.ops.aten._scaled_dot_product_flash_attention_backward
        shapes = [grad.shape, q.shape, k.shape, v.shape, o[0].shape, o[1].shape]
        call = make_call(bwd.default.name(), shapes, ["bfloat16"] * 5 + ["float32"], {"causal": True})
        return (lambda: bwd(grad, q, k, v, o[0], o[1], o[2], o[3], o[4], o[5], 0.0, True, o[6], o[7])), call

    return Spec("attention_bwd" if backward else "attention_fwd", f"sdpa{'_bwd' if backward else ''} {b}x{h}x{s}x{d}",
                build)  # fmt: skip


def _unary(op: str, n: int, dtype: str, extra: dict | None = None) -> Spec:
    def build(device: Any) -> tuple[Callable[[], Any], OpCall]:
        import torch

        x = _t(torch, (n,), dtype, device)
        fn = {
            "zeros_like": lambda: torch.ops.aten.zeros_like(x),
            "sum": lambda: torch.ops.aten.sum(x),
            "_softmax": lambda: torch.ops.aten._softmax(x.view(-1, 1024), -1, False),
            "_to_copy": lambda: torch.ops.aten._to_copy(x, dtype=getattr(torch, (extra or {})["dtype"])),
        }[op]
        shape = (n // 1024, 1024) if op == "_softmax" else (n,)
        return fn, make_call(f"aten::{op}", [shape], [dtype], extra)

    return Spec(op_class(op), f"{op} {n} {dtype}", build)


def _binary(op: str, n: int, dtype: str) -> Spec:
    def build(device: Any) -> tuple[Callable[[], Any], OpCall]:
        import torch

        x, y = _t(torch, (n,), dtype, device), _t(torch, (n,), dtype, device)
        fn = getattr(torch.ops.aten, op)
        return (lambda: fn(x, y)), make_call(f"aten::{op}", [(n,), (n,)], [dtype, dtype])

    return Spec("elementwise", f"{op} {n} {dtype}", build)


def _foreach(op: str, tensors: int, n: int) -> Spec:
    def build(device: Any) -> tuple[Callable[[], Any], OpCall]:
        import torch

        lists = 3 if op == "_foreach_addcmul_" else 1
        ts = [[_t(torch, (n,), "float32", device) for _ in range(tensors)] for _ in range(lists)]
        fn = getattr(torch.ops.aten, op)
        run = (lambda: fn(ts[0], ts[1], ts[2], 0.5)) if lists == 3 else (lambda: fn(ts[0], 0.9))
        call = make_call(f"aten::{op}", [(n,)] * (tensors * lists), ["float32"] * (tensors * lists),
                         {"list_len": tensors})  # fmt: skip
        return run, call

    return Spec("foreach", f"{op} {tensors}x{n}", build)


def _memcpy(kind: str, n: int) -> Spec:
    def build(device: Any) -> tuple[Callable[[], Any], OpCall]:
        import torch

        if kind == "memcpy_h2d":
            src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            dst = torch.empty(n, dtype=torch.uint8, device=device)
        else:
            src = torch.empty(n, dtype=torch.uint8, device=device)
            dst = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        return (lambda: dst.copy_(src, non_blocking=True)), make_call(kind, [(n,)], ["uint8"])

    return Spec(kind, f"{kind} {n}", build)


def default_specs() -> list[Spec]:
    """The built-in sweep: a few shapes per op class, in bf16, fp16 and fp32."""
    specs: list[Spec] = []
    for dtype in ("bfloat16", "float16", "float32"):
        for m, n, k in ((256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (1024, 4096, 4096),
                        (4096, 1024, 4096), (8192, 8192, 1024), (128, 4096, 4096), (4096, 128, 16384)):  # fmt: skip
            specs.append(_gemm(m, n, k, dtype))
    for s, d in ((1024, 128), (4096, 128), (4096, 64), (8192, 32)):
        specs += [_attention(2, 16, s, d, False), _attention(2, 16, s, d, True)]
    for n in (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 27):
        for dtype in ("bfloat16", "float32"):
            specs += [_binary("add", n, dtype), _binary("mul", n, dtype), _unary("zeros_like", n, dtype),
                      _unary("sum", n, dtype), _unary("_softmax", n, dtype)]  # fmt: skip
        specs.append(_unary("_to_copy", n, "bfloat16", {"dtype": "float32"}))
        specs.append(_unary("_to_copy", n, "float32", {"dtype": "bfloat16"}))
    for tensors, n in ((8, 1 << 16), (64, 1 << 20), (16, 1 << 24)):
        specs += [_foreach("_foreach_mul_", tensors, n), _foreach("_foreach_addcmul_", tensors, n)]
    for n in (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 28):
        specs += [_memcpy("memcpy_h2d", n), _memcpy("memcpy_d2h", n)]
    return specs


def require_cuda() -> Any:
    """torch, if it can see a CUDA device; else a PhantoraError saying why profiling cannot run here."""
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise PhantoraError(
            "phantora profile times ops on a real GPU, and this machine has none that torch can use "
            f"(torch {torch.__version__}, {build}; torch.cuda.is_available() is False). "
            "Run it on a CUDA machine, or use a recorded table such as perfdb/l40s with `phantora calibrate`."
        )
    return torch


def time_ns(torch: Any, fn: Callable[[], Any], *, warmup: int, iters: int, graphs: bool) -> int:
    """Mean GPU time of one call of `fn` in ns, measured with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run: Callable[[], Any]
    if graphs:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(iters):
                    fn()
            graph.replay()  # warm the graph once
            run = graph.replay
        except RuntimeError:
            torch.cuda.synchronize()
            graphs = False
    if not graphs:

        def run() -> None:
            for _ in range(iters):
                fn()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    run()
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) * 1e6 / iters)


def profile(
    specs: list[Spec], *, warmup: int = 3, iters: int = 10, graphs: bool = True, device: str = "cuda"
) -> Iterator[MeasuredRow]:
    """Measure every spec on the CUDA device; yields one row per spec."""
    torch = require_cuda()
    for spec in specs:
        fn, call = spec.build(torch.device(device))
        ns = time_ns(torch, fn, warmup=warmup, iters=iters, graphs=graphs)
        yield MeasuredRow(call, ns, False, spec.name, call.op)
