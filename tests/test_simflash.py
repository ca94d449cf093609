"""The simulated FlashAttention packages (runtime/simcuda/simflash.py, flash_api.py, flash_kernels.py).

Outputs against torch's own SDPA on the same data (each packed sequence on its own; a causal mask aligned to the
bottom right as FlashAttention's; a sliding window as SDPA's explicit mask; grouped key heads by `enable_gqa`), a
softcap against its closed form c tanh(s / c) in fp64, gradients against SDPA's autograd; the charge equals the
compute model's flash kernel (``_scaled_dot_product_flash_attention`` and its backward) of the same shapes; the
packages' import and metadata as a GPU host's, an installed package never shadowed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.results.summary import format_summary, summarize
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import attention, flash_api, flash_kernels, simflash, varlen
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session
from tests.installed import needs

B, S, HEADS, KV_HEADS, D = 2, 10, 4, 2, 16
LENGTHS = [5, 12, 7]
TOL = {"rtol": 2e-2, "atol": 2e-2}  # bf16 data


@pytest.fixture(params=[False, True], ids=["real", "phantom"])
def charged(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    yield from charged_session(monkeypatch, request.param, Roofline(get_gpu("h100"), launch_ns=DEFAULT_LAUNCH_NS))


def _data(*shape_heads: tuple[int, ...]) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(*shape).bfloat16() for shape in shape_heads]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """torch's SDPA of (batch, seq, heads, dim) data in fp32, grouped key heads shared (`enable_gqa`)."""
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)


def _keep(sq: int, sk: int, left: int = -1, right: int = 0) -> torch.Tensor:
    """FlashAttention's mask, bottom right: query i sees keys [i + sk - sq - left, i + sk - sq + right]."""
    diag = torch.arange(sq).unsqueeze(1) + sk - sq
    j = torch.arange(sk).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        keep &= j <= diag + right
    if left >= 0:
        keep &= j >= diag - left
    return keep


def _flash_cost(
    model: Roofline, b: int, sq: int, sk: int, causal: bool, backward: bool = False, heads: int = HEADS, dim: int = D
) -> object:
    """The compute model's flash kernel of (b, heads, sq / sk, dim) bf16, as SDPA's."""
    q, k = (torch.empty(b, heads, n, dim, dtype=torch.bfloat16, device="meta") for n in (sq, sk))
    if not backward:
        return model.cost(attention.FLASH, (q, k, k, 0.0, causal, False), {"scale": None}, None)
    lse = torch.empty(b, heads, sq, dtype=torch.float32, device="meta")
    seed, offset = torch.empty(2, dtype=torch.uint64, device="meta"), torch.empty((), dtype=torch.uint64, device="meta")
    args = (q, q, k, k, q, lse, None, None, sq, sk, 0.0, causal, seed, offset)
    return model.cost(attention.FLASH_BACKWARD, args, {"scale": None}, None)


def _sim(x: torch.Tensor, phantom: bool) -> SimCudaTensor:
    return SimCudaTensor(x.to("meta") if phantom else x, 0)


@pytest.mark.parametrize("causal", [True, False])
def test_dense_attention_is_sdpas_and_charged_as_the_flash_kernel(
    charged: tuple[RankSession, list], causal: bool
) -> None:
    """(batch, seq, heads, dim), grouped key heads: SDPA's output (causal: its lower triangle), the log-sum-exp
    (batch, heads, seq), one kernel charged as the flash kernel of (B, HEADS, S, D)."""
    s, seen = charged
    host = _data((B, S, HEADS, D), (B, S, KV_HEADS, D), (B, S, KV_HEADS, D))
    sims = [_sim(x, s.phantom) for x in host]  # outside the mode: a host tensor's move to meta is no GPU op
    with ChargeMode(s):
        out, lse = flash_kernels.FORWARD(*sims, None, None, None, None, None, causal,
                                         -1, -1, 0.0)  # fmt: skip
    assert [name for name, _ in seen] == ["phantora_flash.fwd"]
    assert seen[0][1] == _flash_cost(s.model, B, S, S, causal)
    assert seen[0][1].flops == 2 * B * HEADS * S * S * 2 * D  # torch's formula: every pair
    assert (out.shape, lse.shape, lse.dtype) == ((B, S, HEADS, D), (B, HEADS, S), torch.float32)
    if not s.phantom:
        torch.testing.assert_close(out.elem.float(), _sdpa(*host, _keep(S, S) if causal else None), **TOL)


@pytest.mark.parametrize("w", [3, 20])
def test_a_window_is_charged_its_pairs(charged: tuple[RankSession, list], w: int) -> None:
    """A causal window of w keys over B sequences of S: the causal kernel's FLOPs times W / C, W = (w + 1) S -
    w (w + 1) / 2 the pairs it keeps and C = S (S + 1) / 2 the causal ones (a window wider than S: the causal
    kernel's); the same bytes. FlashAttention's window (-1, 0) without `causal` is the causal kernel itself."""
    s, seen = charged
    host = _data((B, S, HEADS, D), (B, S, KV_HEADS, D), (B, S, KV_HEADS, D))
    sims = [_sim(x, s.phantom) for x in host]
    with ChargeMode(s):
        for causal, left in ((True, w), (False, -1)):
            flash_kernels.FORWARD(*sims, None, None, None, None, None, causal, left, 0, 0.0)
    (_, window), (_, plain) = seen
    full = _flash_cost(s.model, B, S, S, True)
    kept = (w + 1) * S - w * (w + 1) // 2 if w < S else S * (S + 1) // 2
    assert window.flops == round(full.flops * kept / (S * (S + 1) // 2)) and window.nbytes == full.nbytes
    assert plain == full


def test_packed_sequences_are_each_sdpas(charged: tuple[RankSession, list]) -> None:
    """flash_attn_varlen's layout (total, heads, dim): each sequence is SDPA of itself, causal; the log-sum-exp is
    (heads, total); the charge is varlen.py's, a flash kernel per length (phantom: max_seqlen each)."""
    s, seen = charged
    total = sum(LENGTHS)
    host = _data((total, HEADS, D), (total, KV_HEADS, D), (total, KV_HEADS, D))
    cum = torch.tensor([0, 5, 17, 24], dtype=torch.int32)
    sims = [_sim(x, s.phantom) for x in host]
    with ChargeMode(s):
        out, lse = flash_kernels.FORWARD(*sims, SimCudaTensor(cum, 0), SimCudaTensor(cum, 0), 12, 12, None, True, -1,
                                         -1, 0.0)  # fmt: skip
    assert (out.shape, lse.shape) == ((total, HEADS, D), (HEADS, total))
    lengths = [12, 12] if s.phantom else LENGTHS
    assert seen[0][1].flops == sum(2 * HEADS * n * n * 2 * D for n in lengths)
    if s.phantom:
        return
    for a, b in zip(cum[:-1].tolist(), cum[1:].tolist(), strict=True):
        want = _sdpa(*(x[a:b].unsqueeze(0) for x in host), _keep(b - a, b - a))[0]
        torch.testing.assert_close(out.elem[a:b].float(), want, **TOL)


@pytest.mark.parametrize(("sq", "sk", "left", "right"), [(10, 10, 3, 0), (4, 10, -1, 0), (10, 10, 2, 1)])
def test_windows_and_unequal_lengths_align_to_the_bottom_right(sq: int, sk: int, left: int, right: int) -> None:
    """FA3's flash_attn_func on host tensors (the same kernel, uncharged): a window (left, right), and causal
    attention of 4 queries over 10 keys (query i sees keys up to i + 6), against SDPA with FlashAttention's mask."""
    q, k, v = _data((B, sq, HEADS, D), (B, sk, KV_HEADS, D), (B, sk, KV_HEADS, D))
    out = flash_api.flash_attn_func(q, k, v, causal=right == 0 and left < 0, window_size=(left, right))
    torch.testing.assert_close(out.float(), _sdpa(q, k, v, _keep(sq, sk, left, right)), **TOL)


def test_a_softcap_is_its_closed_form() -> None:
    """Scores c tanh(q k^T / sqrt(d) / c), causal, in fp64 from the same data; gradients of the same."""
    q, k, v = (x.requires_grad_() for x in _data((1, S, HEADS, D), (1, S, HEADS, D), (1, S, HEADS, D)))
    out = flash_api.fa2_func(q, k, v, causal=True, softcap=2.0)
    leaves = [x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    scores = 2.0 * torch.tanh(leaves[0] @ leaves[1].transpose(-1, -2) * D**-0.5 / 2.0)
    want = (scores.masked_fill(~_keep(S, S), float("-inf")).softmax(-1) @ leaves[2]).transpose(1, 2)
    torch.testing.assert_close(out.double(), want, **TOL)
    grad = torch.randn_like(want)
    (out.double() * grad).sum().backward()
    (want * grad).sum().backward()
    for x, leaf in zip((q, k, v), leaves, strict=True):
        torch.testing.assert_close(x.grad.double(), leaf.grad.transpose(1, 2), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("api", ["fa3", "fa2"])
def test_gradients_are_sdpas(api: str) -> None:
    """The autograd of flash_attn_func and flash_attn_varlen_func (FA3's and FA2's) against SDPA's, causal, grouped
    key heads: the key and value gradients summed over the query heads that share them."""
    dense, varlen = (
        (flash_api.flash_attn_func, flash_api.flash_attn_varlen_func)
        if api == "fa3"
        else (flash_api.fa2_func, flash_api.fa2_varlen_func)
    )
    q, k, v = (x.requires_grad_() for x in _data((B, S, HEADS, D), (B, S, KV_HEADS, D), (B, S, KV_HEADS, D)))
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    grad = torch.randn(B, S, HEADS, D)
    dense(q, k, v, causal=True).float().mul(grad).sum().backward()
    _sdpa(*leaves, _keep(S, S)).mul(grad).sum().backward()
    for x, leaf in zip((q, k, v), leaves, strict=True):
        torch.testing.assert_close(x.grad.float(), leaf.grad, rtol=5e-2, atol=5e-2)
    packed = [x.detach().flatten(0, 1).requires_grad_() for x in (q, k, v)]
    cum = torch.arange(0, B * S + 1, S, dtype=torch.int32)
    varlen(*packed, cum, cum, S, S, causal=True).float().mul(grad.flatten(0, 1)).sum().backward()
    for x, leaf in zip(packed, leaves, strict=True):
        torch.testing.assert_close(x.grad.float(), leaf.grad.flatten(0, 1), rtol=5e-2, atol=5e-2)


def test_the_backward_is_charged_as_the_flash_backward(charged: tuple[RankSession, list]) -> None:
    """One kernel, the compute model's ``_scaled_dot_product_flash_attention_backward`` of the same shapes; dq, dk,
    dv in their inputs' shapes (grouped keys keep their heads)."""
    s, seen = charged
    host = _data((B, S, HEADS, D), (B, S, KV_HEADS, D), (B, S, KV_HEADS, D))
    q, k, v = (_sim(x, s.phantom) for x in host)
    with ChargeMode(s):
        out, lse = flash_kernels.FORWARD(q, k, v, None, None, None, None, None, True, -1, -1, 0.0)
        grads = flash_kernels.BACKWARD(out, q, k, v, out, lse, None, None, None, None, None, True, -1, -1, 0.0)
    assert seen[1][0] == "phantora_flash.bwd" and seen[1][1] == _flash_cost(s.model, B, S, S, True, backward=True)
    assert [g.shape for g in grads] == [x.shape for x in host]


def test_fa3s_ops_run_the_same_kernels(charged: tuple[RankSession, list], fresh_flash: None) -> None:
    """``torch.ops.flash_attn_3.fwd`` / ``bwd`` (what torch's FA3 registration looks for), with FA3's schemas: the
    same kernels and charges (writing into a given `out` / `dq`: tests/scripts/cuda_flash_attn.py, in a rank)."""
    s, seen = charged
    import flash_attn_interface  # noqa: F401

    host = _data((B, S, HEADS, D), (B, S, KV_HEADS, D), (B, S, KV_HEADS, D))
    q, k, v = (_sim(x, s.phantom) for x in host)
    with ChargeMode(s):
        out, lse, *_ = torch.ops.flash_attn_3.fwd(q, k, v, is_causal=True)
        grads = torch.ops.flash_attn_3.bwd(out, q, k, v, out, lse, is_causal=True)
    assert [g.shape for g in grads[:3]] == [x.shape for x in host] and grads[3].shape == (B, HEADS, S)
    charges = [(n, c) for n, c in seen if n.startswith("phantora_flash")]
    assert charges[0][1] == _flash_cost(s.model, B, S, S, True)
    assert charges[1][1] == _flash_cost(s.model, B, S, S, True, backward=True)
    if not s.phantom:
        torch.testing.assert_close(out.elem.float(), _sdpa(*host, _keep(S, S)), **TOL)


_NAMES = ("flash_attn_interface", "flash_attn")


@pytest.fixture
def fresh_flash(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No FlashAttention module imported, and the simulated finder installed, for one test."""
    for name in [m for m in sys.modules if m.split(".")[0] in _NAMES]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(simflash, "_imported", set())
    monkeypatch.setattr(simflash, "_called", set())
    monkeypatch.setitem(varlen._charged, "fa3", False)
    simflash.install()
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in _NAMES]:
        del sys.modules[name]


def test_the_packages_import_as_on_a_gpu_host(fresh_flash: None) -> None:
    """What torch's FA3 registration and HF transformers check: the modules, FA3's ops, the distributions'
    versions and top-level modules; FA4's `flash_attn.cute` does not import."""
    import flash_attn
    from flash_attn.bert_padding import pad_input, unpad_input  # noqa: F401
    from flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401

    assert hasattr(torch.ops.flash_attn_3, "fwd") and hasattr(torch.ops.flash_attn_3, "bwd")
    assert flash_attn.__version__ == importlib.metadata.version("flash_attn") == simflash.FA2_VERSION
    assert importlib.metadata.version("flash-attn-3") == simflash.FA3_VERSION
    tops = importlib.metadata.packages_distributions()
    assert "flash-attn" in tops["flash_attn"] and "flash-attn-3" in tops["flash_attn_interface"]
    with pytest.raises(ImportError):
        importlib.import_module("flash_attn.cute")
    assert simflash.simulated_packages() == ["flash-attn", "flash-attn-3"]


def test_a_package_imported_but_never_called_is_named_apart(fresh_flash: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-core try-imports `flash_attn` and may never call it: such a package is `unused` until one of its
    attention functions (or FA3's ops) runs; the summary then says it was only imported."""
    import flash_attn
    import flash_attn_interface

    assert simflash.unused_packages() == ["flash-attn", "flash-attn-3"]
    monkeypatch.setattr(varlen, "_torch_fa3_active", lambda: True)  # torchtitan activates torch's FA3 on SM 9.0
    assert varlen._kernel(varlen.FORWARD, {}) == {"flash_kernel": "fa3"}  # aten flash forward, charged as FA3
    assert simflash.unused_packages() == ["flash-attn"]
    monkeypatch.setitem(varlen._charged, "fa3", False)
    q = torch.zeros(1, 4, 2, 8)
    flash_attn.flash_attn_func(q, q, q, causal=True)
    assert simflash.unused_packages() == ["flash-attn-3"]
    flash_attn_interface.flash_attn_func(q, q, q, causal=True)
    assert simflash.unused_packages() == []
    ranks: dict[int, dict] = {r: {"rank": r, "step_ends_ns": [1000], "end_ns": 1000} for r in range(2)}
    ranks[0].update(simulated_packages=["apex", "flash-attn"], simulated_packages_unused=["flash-attn"])
    ranks[1].update(simulated_packages=["flash-attn", "flash-attn-3"], simulated_packages_unused=["flash-attn"])
    summary = summarize(ranks, get_gpu("h100"))
    assert summary["simulated_packages_unused"] == ["flash-attn"]  # flash-attn-3 ran on rank 1
    text = format_summary(summary)
    assert "flash-attn imported, none of its functions called" in text and "FlashAttention 3 runs as" in text
    ranks[1]["simulated_packages_unused"] = []
    assert "simulated_packages_unused" not in summarize(ranks, get_gpu("h100"))  # flash-attn ran on rank 1


def test_unpad_and_pad_are_inverse_on_kept_rows() -> None:
    """bert_padding: the rows a mask keeps, packed with their cumulative lengths, and back (zeros elsewhere)."""
    x = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    rows, indices, cu, longest, used = simflash.unpad_input(x, mask)
    assert rows.shape == (5, 3) and cu.tolist() == [0, 2, 5] and longest == 3 and used.tolist() == [2, 3]
    assert torch.equal(simflash.pad_input(rows, indices, 2, 4), x * mask.unsqueeze(-1))


def test_an_installed_package_is_not_shadowed(
    fresh_flash: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "flash_attn_interface.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    module = importlib.import_module("flash_attn_interface")
    assert getattr(module, "REAL", False) and not hasattr(module, "__phantora_simulated__")


def test_what_is_not_simulated_says_so() -> None:
    from phantora.runtime.simcuda.devices import NotSimulatedError

    q = torch.zeros(1, 2, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(NotSimulatedError, match="dropout_p=0.1"):
        flash_api.fa2_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotSimulatedError, match="KV cache"):
        flash_api.flash_attn_with_kvcache(q, q, q)


SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_flash_attn.py"


@pytest.mark.slow
def test_flash_attention_packages_in_a_rank(tmp_path: Path) -> None:
    """A rank's `import flash_attn_interface` / `flash_attn` get the simulated packages (said in results.json);
    torch's FA3 registration activates; FA3's output and gradients and FA2's packed output are SDPA's; each call is
    one kernel: two forwards and a backward of phantora_flash, and FA3's op with a given `out`."""
    from phantora.launcher import RunConfig, launch

    out, run = tmp_path / "seen.json", tmp_path / "run"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, timeout_s=300, out_dir=str(run)))
    seen = json.loads(out.read_text())
    assert seen["simulated"] == [True, True] and seen["impl"] == "FA3" and seen["device"] == "cuda:0"
    assert seen["error"] < 0.02 and seen["grad_error"] < 0.05 and seen["packed_error"] < 0.02 and seen["out_written"]
    events = json.loads((run / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [e["name"] for e in events if e.get("ph") == "X"]
    assert (names.count("phantora_flash.fwd"), names.count("phantora_flash.bwd")) == (3, 1)
    results = json.loads((run / "results.json").read_text())
    assert results["simulated_packages"] == ["flash-attn", "flash-attn-3"]
    assert "simulated_packages_unused" not in results  # both called


@pytest.mark.slow
@needs("transformers")
def test_transformers_flash_attention_2_and_3_are_its_sdpa(tmp_path: Path) -> None:
    """HF transformers' `attn_implementation="flash_attention_2"` / `"flash_attention_3"` take the simulated
    `flash_attn` / `flash_attn_interface` (their availability checks read the distributions' metadata) and, on a
    padded batch, give the loss and gradients of `"sdpa"` with the same weights; each layer's attention is one flash
    kernel forward and one backward."""
    from phantora.launcher import RunConfig, launch

    script = Path(__file__).resolve().parent / "scripts" / "hf_flash_attention.py"
    out, run = tmp_path / "seen.json", tmp_path / "run"
    launch(RunConfig(str(script), [str(out)], "testbed16", nproc=1, timeout_s=300, out_dir=str(run)))
    seen = json.loads(out.read_text())
    assert seen["impls"] == ["flash_attention_2", "flash_attention_3", "sdpa"]
    assert seen["losses"][0] == pytest.approx(seen["losses"][2], rel=1e-3)
    assert seen["losses"][1] == pytest.approx(seen["losses"][2], rel=1e-3)
    assert max(seen["grad_errors"]) < 0.02 * seen["grad_scale"]
    events = json.loads((run / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [e["name"] for e in events if e.get("ph") == "X"]
    assert (names.count("phantora_flash.fwd"), names.count("phantora_flash.bwd")) == (4, 4)


def _fa_tflops(b: int, h: int, s: int, d: int, ns: int) -> float:
    """A charge's causal forward rate by the FlashAttention papers' count: 2 B H S^2 D over its time (TFLOP/s)."""
    return 2.0 * b * h * s * s * d / ns / 1e3


def test_fa3_forward_is_charged_at_fa3s_published_rate(monkeypatch: pytest.MonkeyPatch, fresh_flash: None) -> None:
    """On the calibrated H100, phantom (meta data), panel (d)'s 8k shape, causal (2 x 16 heads x 8,192 x 128; the
    figure's fp16, bf16 here: the same peak): FA3's op and `flash_attn_interface.flash_attn_func` forward at FA3's
    published 602 TFLOP/s, FA2's `flash_attn_func` and torch's varlen flash op at FA2's 333, within 5% (the fits'
    in-sample errors there: 1.7%, 1.6%); the same varlen op once torch's FA3 implementation is active (the state
    `activate_flash_attention_impl("FA3")` leaves, which on a real H100 routes it to FA3's kernel) at FA3's; FA3's
    backward at FA2's (no FA3 backward figures)."""
    import flash_attn
    import flash_attn_interface
    from torch.nn.attention import _registry

    from phantora.runtime.compute import Calibrated
    from phantora.runtime.simcuda import varlen

    session = charged_session(monkeypatch, True, Calibrated(get_gpu("h100"), launch_ns=0))
    s, seen = next(session)
    b, sq, h, d = 2, 8192, 16, 128
    q, k, v = (SimCudaTensor(torch.empty(b, sq, h, d, dtype=torch.bfloat16, device="meta"), 0) for _ in range(3))
    cum = SimCudaTensor(torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device="meta"), 0)
    packed = [SimCudaTensor(x.elem.flatten(0, 1), 0) for x in (q, k, v)]

    def torch_varlen() -> int:
        seen.clear()
        with ChargeMode(s):
            varlen.FORWARD(*packed, cum, cum, sq, sq, 0.0, True, False)
        return seen[0][1].ns

    try:
        with ChargeMode(s):
            out, lse, *_ = torch.ops.flash_attn_3.fwd(q, k, v, is_causal=True)
            torch.ops.flash_attn_3.bwd(out, q, k, v, out, lse, is_causal=True)
            flash_attn_interface.flash_attn_func(q, k, v, causal=True)
            flash_attn.flash_attn_func(q, k, v, causal=True)
        fa3_op, fa3_bwd, fa3_func, fa2_func = (c for n, c in seen if n.startswith("phantora_flash"))
        assert _fa_tflops(b, h, sq, d, fa3_op.ns) == pytest.approx(602, rel=0.05)
        assert fa3_func == fa3_op
        assert _fa_tflops(b, h, sq, d, fa2_func.ns) == pytest.approx(333, rel=0.05)
        assert fa3_bwd == _flash_cost(s.model, b, sq, sq, True, backward=True, heads=h, dim=d)  # FA2's backward
        assert _fa_tflops(b, h, sq, d, torch_varlen()) == pytest.approx(333, rel=0.05)
        monkeypatch.setattr(_registry, "_FLASH_ATTENTION_ACTIVE", ("FA3", None))
        assert _fa_tflops(b, h, sq, d, torch_varlen()) == pytest.approx(602, rel=0.05)
    finally:
        session.close()
