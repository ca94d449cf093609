"""FlashAttention-3's forward on H100 (public_kernels.csv kind `fa3_fwd`, the FlashAttention-3 bars of the FA3
README's figure): its rows and citations, its own fit, and the charge of a call marked `kernel="fa3"` against the
published TFLOP/s; FlashAttention-2 class calls (torch's own flash SDPA) keep the die's fit on the other rows."""

from __future__ import annotations

import pytest

from phantora.perfmodel import pubfit
from phantora.perfmodel.features import make_call
from phantora.perfmodel.model import ComputeModel, load_curves
from phantora.perfmodel.public import read_points, read_public

FIGURE = "Dao-AILab/flash-attention@0251105 assets/flash3_fp16_fwd.png"
TOL = 0.05  # the FA3 fit's in-sample errors at the shapes below: (a) 4k 2.2%, (d) 8k 1.7%, (e) 16k 0.1%


def flash_fwd(b: int, h: int, s: int, d: int, causal: bool, kernel: str | None) -> object:
    extra: dict[str, object] = {"causal": causal} | ({"kernel": kernel} if kernel else {})
    return make_call("aten::_scaled_dot_product_flash_attention", [[b, h, s, d]] * 3, ["float16"] * 3, extra)


def fa_forward_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    """The FlashAttention papers' counting: 4 x batch x heads x seq^2 x head dim, halved when causal."""
    return 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)


def test_fa3_rows_are_the_figures_fa3_bars():
    rows = [r for r in read_public() if r.kind == "fa3_fwd"]
    assert len(rows) == 35  # six panels of six sequence lengths, the 1k bar of panel (e) hidden by the legend
    for r in rows:
        assert r.gpu == "h100" and r.source.startswith(FIGURE) and "FlashAttention-3 bars" in r.locator
        b, h, s, d = r.shape
        assert b * s == 16384 and h * d == 2048  # batch x seqlen = 16k tokens, hidden 2048
        assert r.kernel_class == "attention-fa3"
    panel_e = {r.shape[2] for r in rows if "panel (e)" in r.locator}
    assert panel_e == {512, 2048, 4096, 8192, 16384}
    peak = max(rows, key=lambda r: r.value)
    assert (peak.shape, peak.causal, peak.value) == ((1, 8, 16384, 256), False, 756)  # panel (e), 16k


@pytest.mark.parametrize(
    ("shape", "causal", "tflops"),
    [((2, 16, 8192, 128), True, 602), ((1, 8, 16384, 256), False, 756), ((4, 32, 4096, 64), False, 476)],
)
def test_fa3_forward_charged_at_the_published_rate(shape, causal, tflops):
    """Panels (d) 8k, (e) 16k, (a) 4k: the charge is the paper's FLOPs over its TFLOP/s, within the fit's error."""
    ns, tier = ComputeModel("h100").timed_call(flash_fwd(*shape, causal, "fa3"))
    assert tier == "public"
    assert ns == pytest.approx(fa_forward_flops(*shape, causal) / (tflops * 1e12) * 1e9, rel=TOL)


def test_fa2_class_charges_keep_the_dies_fit():
    """Without the mark, the same call is torch's FlashAttention-2 class kernel: the FA2 bar of the same figure
    (panel (d) 8k, 333 TFLOP/s), timed by the die's fit on its other rows, which the FA3 rows do not touch."""
    m = ComputeModel("h100")
    fa2 = flash_fwd(2, 16, 8192, 128, True, None)
    ns = m.timed_call(fa2)[0]
    assert ns == pytest.approx(fa_forward_flops(2, 16, 8192, 128, True) / 333e12 * 1e9, rel=TOL)
    assert ns > 1.5 * m.timed_call(flash_fwd(2, 16, 8192, 128, True, "fa3"))[0]  # FA3: 602 / 333 = 1.81x faster
    gh100 = [p for p in read_points() if p.gpu.chip == "GH100" and not p.row.kernel]
    alone = pubfit.fit_die(gh100, load_curves())
    for group, values in pubfit.shipped_fits()["GH100"].params.items():
        assert alone.params[group] == pytest.approx(values, rel=1e-6), group
    backward = make_call(
        "aten::_scaled_dot_product_flash_attention_backward",
        [[2, 16, 8192, 128]] * 5 + [[2, 16, 8192]],
        ["float16"] * 5 + ["float32"],
        {"causal": True, "kernel": "fa3"},
    )
    unmarked = make_call(backward.op, list(backward.shapes), list(backward.dtypes), {"causal": True})
    assert m.timed_call(backward)[0] == m.timed_call(unmarked)[0]  # no FA3 backward rows: FA2's backward


def test_fa3_mark_without_a_fit_is_the_flash_kernel():
    """FA3 has no published figures on the A100 (it is a Hopper kernel): the mark changes nothing there."""
    m = ComputeModel("a100")
    marked, unmarked = flash_fwd(2, 16, 8192, 128, True, "fa3"), flash_fwd(2, 16, 8192, 128, True, None)
    assert m.timed_call(marked) == m.timed_call(unmarked)


def test_fa3_fit_is_its_own_and_starts_from_the_die():
    fits = pubfit.shipped_fits()
    fa3 = fits["GH100/fa3"]
    assert fa3.classes == ["attention_fwd"] and fa3.rows == 35
    assert set(fa3.params) == {"attention"} and "eff_bwd" not in fa3.params["attention"]
    pts = [p for p in read_points() if pubfit.fit_key(p) == "GH100/fa3"]
    fresh = pubfit.fit_die(pts, pubfit.base_for("GH100/fa3", load_curves(), fits), name="GH100/fa3")
    for key, value in fa3.params["attention"].items():
        assert fresh.params["attention"][key] == pytest.approx(value, rel=1e-6), key
