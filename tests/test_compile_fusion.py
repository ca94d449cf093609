"""torch.compile's kernel fusion (runtime/fusion.py): a compiled region's pointwise and reduction ops are charged as
fused kernels, (bytes read from outside + bytes still referenced) / HBM bandwidth + one launch; a matmul stays its
own kernel; the backward of the region's autograd nodes is fused too; PHANTORA_COMPILE_FUSION=off keeps op by op."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from phantora.launcher import RunConfig, launch
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime import fusion
from phantora.runtime.simcuda import device

SCRIPT = Path(__file__).resolve().parent / "scripts" / "compile_fusion_chain.py"
N, C = 4096, 1024  # the script's x: N x C fp32
X = N * C * 4  # bytes of one N x C tensor
ROW = N * 4  # bytes of layer_norm's mean (or rstd)
aten = torch.ops.aten


def kernel(nbytes: int) -> int:
    """One kernel of `nbytes` on the H100's HBM under the roofline, plus its launch."""
    return math.ceil(nbytes / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, int], list[tuple[str, float]]]:
    """The script's timings and the run's compute kernels (name, µs), in order."""
    tmp = tmp_path_factory.mktemp("fusion")
    seen = tmp / "seen.json"
    launch(
        RunConfig(
            str(SCRIPT),
            [str(seen)],
            "testbed16",
            nproc=1,
            out_dir=tmp / "out",
            tensors="phantom",
            compute_model="roofline",
            timeout_s=180,
        )
    )
    trace = json.loads((tmp / "out" / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = [(e["name"], e["dur"]) for e in events if e.get("ph") == "X" and not e["name"].startswith("step")]
    return json.loads(seen.read_text()), kernels


def test_a_compiled_pointwise_chain_is_one_kernel_of_its_input_and_output(run: Any) -> None:
    """x * 2 + 1 -> gelu -> layer_norm without grad: x read once, the result written once (the intermediates and
    layer_norm's mean and rstd are dropped), one launch; eagerly, four kernels each reading and writing."""
    seen, _ = run
    assert seen["compiled"] == kernel(2 * X)
    assert seen["eager"] == 3 * kernel(2 * X) + kernel(2 * X + 2 * ROW)
    assert seen["module"] == kernel(2 * X)  # a compiled nn.Module (torch's OptimizedModule): its forward
    assert seen["decorated"] == kernel(2 * X)  # @torch.compile(mode="max-autotune"): timed as the default mode


def test_a_matmul_in_the_chain_stays_its_own_kernel(run: Any) -> None:
    """gelu(x * 2 + 1) @ w -> layer_norm: the fused prologue writes the matmul's input, the matmul is charged as
    alone (the same time as torch.mm of those shapes), and layer_norm reads its output."""
    seen, kernels = run
    assert seen["compiled_mm"] == kernel(2 * X) + seen["mm"] + kernel(2 * X)
    names = [n for n, _ in kernels]
    i = names.index("aten.mm")
    assert names[i - 1 : i + 2] == ["fused:mul_add_gelu", "aten.mm", "fused:native_layer_norm"]


def test_the_backward_of_the_region_is_attributed_to_it_and_fused(run: Any) -> None:
    """With grad, the forward also writes what autograd saves (gelu's and layer_norm's inputs, mean, rstd); the
    backward's layer_norm_backward, gelu_backward and mul, run under the region's autograd nodes, are one kernel:
    it reads the saved tensors and the loss's broadcast gradient (one element) and writes x's gradient. The loss's
    sum is outside the region, as is the gradient's first element (ones_like)."""
    seen, kernels = run
    assert seen["forward_for_grad"] == kernel(4 * X + 2 * ROW)
    backward = kernel(3 * X + 2 * ROW + 4)
    assert seen["backward"] == kernel(8) + backward
    assert kernels[-2:] == [
        ("aten.ones_like", kernel(8) / 1e3),
        ("fused:native_layer_norm_backward_gelu_backward_mul", backward / 1e3),
    ]


def test_reductions_along_two_axes_fuse_only_from_torch_2_10(run: Any) -> None:
    """y = x * 2; y.sum(1), y.sum(0). Inductor fuses nodes of one iteration space only (`SIMDScheduling.can_fuse`):
    the row sum (4096 outputs of 1024) takes the product as its prologue, the column sum (1024 of 4096) is another
    loop order. Before torch 2.10 (no MixOrderReduction) it is a second kernel, into which the product, a pointwise
    node, is inlined as well (never written): x + the row sums, then x + the column sums. From 2.10 one kernel
    reads x and writes the two sums."""
    seen, _ = run
    assert seen["two_axes"] == kernel(X + 4 * N + 4 * C)
    assert seen["two_axes_before_2.10"] == kernel(X + 4 * N) + kernel(X + 4 * C)


def test_iteration_spaces_that_share_a_kernel() -> None:
    """Inductor's rule, (numel, rnumel) of two nodes: pointwise ones of one numel; reductions of one shape; a
    pointwise node over a reduction's input or output; the two orders of one tensor only with mix-order fusion."""
    assert fusion.fits(4096, 1, 4096, 1) and not fusion.fits(4096, 1, 1024, 1)
    assert fusion.fits(4096 * 1024, 1, 4096, 1024) and fusion.fits(4096, 1024, 4096, 1)
    assert not fusion.fits(4096 * 1024, 1, 4096, 512)
    assert fusion.fits(4096, 1024, 4096, 1024) and not fusion.fits(4096, 1024, 4096, 512)
    assert not fusion.fits(4096, 1024, 1024, 4096) and fusion.fits(4096, 1024, 1024, 4096, mix_order=True)


def test_inductor_extern_kernels_are_not_fused() -> None:
    for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default):
        assert fusion.kind(op) == fusion._EXTERN
    assert fusion.kind(aten._scaled_dot_product_flash_attention.default) == fusion._EXTERN
    assert fusion.kind(aten._foreach_add.List) == fusion._EXTERN
    for op in (aten.add.Tensor, aten.gelu.default, aten.native_layer_norm.default, aten._softmax.default):
        assert fusion.kind(op) == fusion._FUSE
    for op in (aten.view.default, aten.t.default, aten.detach.default):
        assert fusion.kind(op) == fusion._VIEW
    # the compute model's reductions and fills are Inductor's generated kernels, but for its fallbacks
    for op in (aten.sum.dim_IntList, aten.var_mean.correction, aten.amax.default, aten.zeros_like.default):
        assert fusion.kind(op) == fusion._FUSE
    for op in (aten._masked_softmax.default, aten._masked_softmax_backward.default):
        assert fusion.kind(op) == fusion._EXTERN


def test_the_switch_keeps_op_by_op_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """PHANTORA_COMPILE_FUSION=off: torch.compile's result is returned as torch made it (no region)."""

    def compile_fn(model: Any = None, **kwargs: Any) -> Any:
        return model

    def f(t: torch.Tensor) -> torch.Tensor:
        return t + 1

    monkeypatch.setenv(fusion.ENV, "off")
    assert not fusion.enabled()
    assert device._eager_compile(compile_fn)(f) is f
    monkeypatch.setenv(fusion.ENV, "on")
    assert fusion.enabled()
    wrapped = device._eager_compile(compile_fn)(f)
    assert wrapped is not f and getattr(wrapped, "_phantora_region", False)


def test_under_the_calibrated_model_a_one_op_kernel_costs_the_eager_op() -> None:
    """The calibrated model times a fused kernel as its own elementwise kernel of as many bytes: a group of one bf16
    add is the eager add, to the ns, below the HBM roofline's bandwidth (never faster than an eager kernel)."""
    from phantora.runtime.compute import Calibrated

    for gpu in ("a100", "h100"):
        model = Calibrated(get_gpu(gpu))
        n = 1 << 26
        a = torch.empty(n, dtype=torch.bfloat16, device="meta")
        eager = model.cost(aten.add.Tensor, (a, a), {}, a)
        assert fusion.memory_ns(model, 3 * 2 * n) + model.launch_ns == eager.ns
        assert fusion.memory_ns(model, 3 * 2 * n) > 3 * 2 * n / get_gpu(gpu).mem_bw * 1e9


def _chain(t: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(torch.nn.functional.gelu(t * 2 + 1), (C,))


def _session_running_a_region() -> tuple[Any, int]:
    """A rank session in this process (roofline H100, no network) that ran the script's no-grad chain once as a
    compiled region (`fusion.region`, what torch.compile's result is wrapped in); a weak reference to it and the
    chain's simulated ns. Nothing of the session is returned strongly."""
    import weakref

    from phantora.runtime import session as session_mod
    from phantora.runtime.compute import Roofline
    from phantora.runtime.dispatch import ChargeMode
    from phantora.runtime.nonet import NoNetworkClient
    from phantora.runtime.session import RankSession
    from phantora.runtime.simcuda.tensor import SimCudaTensor

    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    mode = ChargeMode(s)
    x = SimCudaTensor(torch.randn(N, C), 0)
    session_mod.install(s)
    try:
        with torch.no_grad(), mode:
            start = s.clock.compute_ns
            out = fusion.region(_chain)(x)
            del out  # the region's output: alive at its end, so written
            ns = s.clock.compute_ns - start
        assert fusion.mode_of(s).kernels == 1
    finally:
        session_mod.install(None)
    return weakref.ref(s), ns


def test_a_dropped_session_and_its_fusion_layer_are_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fusion layer is kept per session, weakly: once the program drops a session, gc collects it and its layer
    (before, a module dict held every session's layer, and the layer its session). The chain's fused time is the
    closed form of the launched run's (x read once, the result written once, one launch), in each session."""
    import gc

    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank (no device guard here)
    refs = []
    for _ in range(2):
        ref, ns = _session_running_a_region()
        assert ns == kernel(2 * X)
        refs.append(ref)
    gc.collect()
    assert [r() for r in refs] == [None, None]
