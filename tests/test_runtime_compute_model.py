"""The runtime's compute models: calibrated by default, roofline on request, measured tables first, bad files named."""

from __future__ import annotations

import math

import pytest
import torch

from phantora.errors import InputError
from phantora.perfmodel.gpus import GPUS, get_gpu
from phantora.perfmodel.model import ComputeModel
from phantora.rank_options import Options
from phantora.runtime.compute import COMPUTE_MODELS, Calibrated, Roofline, build_model, cache_key

aten = torch.ops.aten


def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def mm_cost(model: Roofline, m: int, k: int, n: int, dtype: torch.dtype = torch.bfloat16):
    a, b = meta(m, k, dtype=dtype), meta(k, n, dtype=dtype)
    return model.cost(aten.mm.default, (a, b), {}, aten.mm.default(a, b))


# ----- the default, and choosing ---------------------------------------------------------------------
def test_calibrated_is_the_default_everywhere():
    assert COMPUTE_MODELS[0] == "calibrated"
    assert Options().compute_model == "calibrated"
    assert Options.from_env({}).compute_model == "calibrated"
    assert type(build_model()) is Calibrated
    from phantora.cli import build_parser

    args = build_parser().parse_args(["run", "-t", "star8", "train.py"])
    assert args.compute_model == "calibrated" and args.perf_table == [] and args.curves is None
    from phantora.launcher import RunConfig

    assert RunConfig("train.py").compute_model == "calibrated"


def test_start_session_builds_the_calibrated_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # a real-data session sets TORCH_GLOO_LAZY_INIT for its rank (gloo_store.connect_lazily): keep it out of this
    # test process, whose later tests start plain gloo programs (tests/frameworks/test_deepspeed.py's reference run)
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "0")
    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT")
    from phantora.runtime import compute
    from phantora.runtime.bootstrap import end_session, start_session
    from phantora.runtime.nonet import NoNetworkClient

    s, mode = start_session(Options(network="none", time_patch=False, trace="none"), client=NoNetworkClient())
    try:
        assert type(s.model) is Calibrated and compute.get_model() is s.model
        x = torch.ones(64, 64)
        x @ x  # charged through the dispatch mode
        assert s.ops >= 1 and s.now() > 0
    finally:
        end_session(s, mode)
        compute.set_model(Roofline(get_gpu("h100")))


def test_both_models_are_selectable_and_pass_to_ranks():
    assert type(build_model("roofline", "h100")) is Roofline
    assert type(build_model("calibrated", "h100")) is Calibrated
    with pytest.raises(InputError, match="field 'compute_model'.*must be one of calibrated, roofline"):
        build_model("magic", "h100")
    opts = Options(compute_model="roofline")
    assert Options.from_env(opts.to_env()).compute_model == "roofline"
    opts = Options(perf_tables=("/a/t1.csv", "/b/t2.csv"), curves="/c/curves.json")
    back = Options.from_env(opts.to_env())
    assert back.perf_tables == ("/a/t1.csv", "/b/t2.csv") and back.curves == "/c/curves.json"
    # the same op costs differently under the two models; FLOPs (for MFU) are counted the same way
    roof, cal = mm_cost(build_model("roofline", "h100", 0), 4096, 4096, 4096), mm_cost(build_model(), 4096, 4096, 4096)
    assert roof.flops == cal.flops == 2 * 4096**3 and roof.dtype == cal.dtype == "bf16"
    assert cal.ns > roof.ns


def test_tables_and_curves_need_the_calibrated_model(tmp_path):
    with pytest.raises(InputError, match="need --compute-model calibrated"):
        build_model("roofline", "h100", perf_tables=[str(tmp_path / "t.csv")])


# ----- GEMM sanity, GPUs and dtypes ----------------------------------------------------------------
@pytest.mark.parametrize("size", [1024, 4096, 8192])
def test_h100_bf16_gemm_is_bounded_by_peak(size):
    cost = mm_cost(build_model("calibrated", "h100", 0), size, size, size)
    ideal = 2 * size**3 / 989e12 * 1e9  # REFERENCE.md section 2: 989 dense bf16 TFLOP/s
    assert cost.flops == 2 * size**3
    assert cost.ns >= ideal
    assert cost.ns <= (2.0 if size >= 4096 else 4.0) * ideal  # large GEMMs reach at least half of peak


CASES = [(g, d) for g in ("a100", "h100", "h200", "b200", "l40s") for d in ("bf16", "fp16", "fp32", "tf32", "fp8")]
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32,
               "fp8": torch.float8_e4m3fn}  # fmt: skip


@pytest.mark.parametrize(("gpu", "dtype"), CASES)
def test_every_gpu_and_dtype(gpu, dtype):
    spec = get_gpu(gpu)
    model = build_model("calibrated", gpu, 0)
    prec = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        if dtype == "fp8" and gpu == "a100":
            assert "fp8" not in spec.tensor_flops
            with pytest.raises(InputError, match="no float8_e4m3fn tensor cores"):
                mm_cost(model, 4096, 4096, 4096, TORCH_DTYPE[dtype])
            return
        cost = mm_cost(model, 4096, 4096, 4096, TORCH_DTYPE[dtype])
    finally:
        torch.set_float32_matmul_precision(prec)
    assert cost.dtype == dtype
    peak = spec.peak(dtype)
    assert cost.ns >= cost.flops / peak * 1e9
    assert cost.ns <= 4 * cost.flops / peak * 1e9


def test_one_gpu_table():
    """One GpuSpec per GPU: the runtime's short-name peaks are the calibrated model's matmul peaks."""
    assert {"a100", "h100", "h200", "b200", "l40s"} <= set(GPUS)
    for g in GPUS.values():
        assert g.peak("bf16") == g.matmul_peak("bfloat16") and g.peak("fp32") == g.matmul_peak("float32")
        assert g.peak("tf32") == g.matmul_peak("float32", tf32=True) and g.peak("fp64") == g.fp32_flops
        assert ("fp8" in g.tensor_flops) == (g.chip != "GA100")  # Ampere: no fp8 tensor cores
        assert g.peak("fp8") == g.tensor_flops.get("fp8", g.tensor_flops["bfloat16"])
    assert get_gpu("H100 SXM") is GPUS["h100"] and get_gpu("l40s-pcie") is GPUS["l40s"]
    assert GPUS["l40s"].peak("fp8") == 733e12 and GPUS["b200"].peak("fp8") == 4500e12  # dense, no sparsity


# ----- measured tables -----------------------------------------------------------------------------
def test_measured_entry_overrides_exactly_that_op_and_shape(tmp_path):
    table = tmp_path / "measured.csv"
    table.write_text(
        'op,shapes,dtypes,extra,nanos\naten::mm,"[[512,256],[256,1024]]","[""bfloat16"",""bfloat16""]",,12345\n'
    )
    plain = build_model("calibrated", "h100", 0)
    with_table = build_model("calibrated", "h100", 0, perf_tables=[str(table)])
    assert mm_cost(with_table, 512, 256, 1024).ns == 12345
    assert mm_cost(plain, 512, 256, 1024).ns != 12345
    # another shape, another dtype, another op: the model, not the table
    assert mm_cost(with_table, 512, 256, 512).ns == mm_cost(plain, 512, 256, 512).ns
    assert mm_cost(with_table, 512, 256, 1024, torch.float16).ns == mm_cost(plain, 512, 256, 1024, torch.float16).ns
    a, b = meta(1, 512, 256), meta(1, 256, 1024)
    out = aten.bmm.default(a, b)
    assert with_table.cost(aten.bmm.default, (a, b), {}, out).ns == plain.cost(aten.bmm.default, (a, b), {}, out).ns
    # the launch overhead is charged on top of a measured kernel time, as on top of a modelled one
    assert mm_cost(build_model("calibrated", "h100", 700, perf_tables=[str(table)]), 512, 256, 1024).ns == 13045


def test_bad_table_and_curves_paths_name_the_file(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(InputError, match="nope.csv: cannot read table"):
        build_model("calibrated", "h100", perf_tables=[str(missing)])
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,table\n")
    with pytest.raises(InputError, match="bad.csv:1: unknown table header"):
        build_model("calibrated", "h100", perf_tables=[str(bad)])
    with pytest.raises(InputError, match="gone.json: cannot read curves"):
        build_model("calibrated", "h100", curves=str(tmp_path / "gone.json"))
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(InputError, match="junk.json:1: bad JSON"):
        build_model("calibrated", "h100", curves=str(junk))


def test_cli_reports_a_bad_table_before_starting_ranks(tmp_path, capsys):
    from phantora.cli import main

    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    assert main(["run", "--topology", "star8", "--perf-table", str(tmp_path / "missing.csv"), str(script)]) == 2
    err = capsys.readouterr().err
    assert "missing.csv" in err and "cannot read table" in err
    assert main(["run", "--topology", "star8", "--curves", str(tmp_path / "c.json"), str(script)]) == 2
    assert "c.json" in capsys.readouterr().err


def test_a_curves_file_changes_the_model(tmp_path):
    from phantora.perfmodel.model import load_curves, save_curves

    curves = load_curves()
    curves.params["gemm"]["eff_max"] /= 2  # half as efficient GEMMs
    path = tmp_path / "curves.json"
    save_curves(path, curves)
    slow = mm_cost(build_model("calibrated", "h100", 0, curves=str(path)), 8192, 8192, 8192).ns
    assert slow > 1.5 * mm_cost(build_model("calibrated", "h100", 0), 8192, 8192, 8192).ns


# ----- agreement with the perfmodel, meta tensors, free ops, cache -------------------------------------
def test_kernel_time_is_the_perfmodels_plus_launch():
    model = build_model("calibrated", "h100", 1000)
    ref = ComputeModel("h100")
    assert (
        mm_cost(model, 1024, 512, 256).ns == ref.predict_ns("aten::mm", [(1024, 512), (512, 256)], ["bf16"] * 2) + 1000
    )
    x = meta(4096, 1024)
    out = aten.gelu.default(x)
    assert (
        model.cost(aten.gelu.default, (x,), {}, out).ns == ref.predict_ns("aten::gelu", [(4096, 1024)], ["bf16"]) + 1000
    )


def test_meta_and_real_tensors_cost_the_same():
    model = build_model("calibrated", "l40s")
    a, b = torch.randn(256, 128), torch.randn(128, 64)
    real = model.compute(aten.mm.default, (a, b), {}, a @ b)
    am, bm = a.to("meta"), b.to("meta")
    fake = model.compute(aten.mm.default, (am, bm), {}, aten.mm.default(am, bm))
    assert real == fake and real.flops == 2 * 256 * 128 * 64


@pytest.mark.parametrize("kind", COMPUTE_MODELS)
def test_views_and_allocation_are_free(kind):
    model = build_model(kind, "h100")
    x = meta(1024, 1024)
    for func, args in ((aten.view.default, (x, [1024 * 1024])), (aten.t.default, (x,)),
                       (aten.transpose.int, (x, 0, 1)), (aten.detach.default, (x,)),
                       (aten.empty_like.default, (x,)), (aten.alias.default, (x,))):  # fmt: skip
        assert model.cost(func, args, {}, func(*args)).ns == 0
    if kind == "calibrated":  # dropout with p = 0 launches no kernel
        p = meta(1024)
        out = aten.native_dropout.default(p, 0.0, True)
        assert model.cost(aten.native_dropout.default, (p, 0.0, True), {}, out).ns == 0


def test_cache_keys_on_shapes_not_on_changing_floats():
    model = build_model("calibrated", "h100")
    params = [meta(1024, dtype=torch.float32) for _ in range(4)]
    first = model.cost(aten._foreach_mul_.Scalar, (params, 0.9), {}, None)
    size = len(model._cache)
    second = model.cost(aten._foreach_mul_.Scalar, (params, 0.8), {}, None)  # a new learning rate
    assert second is first and len(model._cache) == size
    k1 = cache_key(aten.sum.dim_IntList, (meta(8, 8), [0]), {}, meta(8))
    k2 = cache_key(aten.sum.dim_IntList, (meta(8, 8), [1]), {}, meta(8))
    assert k1 != k2  # the reduced dim is part of the key
    assert math.isfinite(first.ns) and first.ns > 0
