"""Measured tables: formats, malformed input (file and line), lookup priority, curves files, GPU transfer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.paths import shared_dir
from phantora.perfmodel import (
    ComputeModel,
    Curves,
    MeasuredRow,
    TimingTable,
    compute_features,
    get_gpu,
    load_curves,
    make_call,
    predict_ns,
    read_table,
    write_table,
)

PERFDB = Path(os.environ.get("PHANTORA_PERFDB", shared_dir() / "perfdb/l40s"))
needs_perfdb = pytest.mark.skipif(not (PERFDB / "compute.csv").exists(), reason=f"perfdb not found at {PERFDB}")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


def test_round_trip(tmp_path):
    rows = [
        MeasuredRow(make_call("aten::mm", [(64, 32), (32, 16)], ["bf16", "bf16"]), 5000),
        MeasuredRow(make_call("aten::_to_copy", [(100,)], ["bf16"], {"dtype": "float32"}), 1200),
        MeasuredRow(make_call("aten::add", [(), (4,)], ["float32", "float32"]), 900),
    ]
    path = tmp_path / "out.csv"
    write_table(path, rows)
    back = read_table(path)
    assert [(r.call.key(), r.nanos) for r in back] == [(r.call.key(), r.nanos) for r in rows]


@pytest.mark.parametrize(
    "text,line,field,words",
    [
        ("op,shapes,dtypes,nanos\n", 1, None, "unknown table header"),
        ('op,shapes,dtypes,extra,nanos\naten::mm,"[[2,2],[2,2]]","[""bf16"",""bf16""]",,10\naten::mm,5\n', 3, None,
         "columns"),
        ('op,shapes,dtypes,extra,nanos\n# comment\naten::mm,"[[2,2],[2,2]","[""bf16"",""bf16""]",,10\n', 3, "shapes",
         "bad JSON"),
        ('op,shapes,dtypes,extra,nanos\naten::mm,"[[2,2],[2,2]]","[""bf16"",""bf16""]",,-4\n', 2, "nanos", "negative"),
        ('op,shapes,dtypes,extra,nanos\naten::mm,"[[2,2],[2,2]]","[""bf16"",""bogus""]",,4\n', 2, "dtype",
         "unknown dtype"),
        ('op,shapes,dtypes,extra,nanos\naten::mm,"[[2,3],[2,2]]","[""bf16"",""bf16""]",,4\n', 2, "shapes",
         "inner dimensions"),
        ('op,key,nanos\nMM,"{""MatMul"":[]}",5\n', 2, "key", "single entry"),
        ('op,key,nanos\nConv2d,"{""Conv2d"":[{""shape"":[1],""dtype"":""Float""}]}",5\n', 2, "op", "unknown perfdb op"),
        ("kind,size_bytes,nanos\nHostToDevice,12x,5\n", 2, "size_bytes", "not an integer"),
    ],
)  # fmt: skip
def test_malformed_tables_name_file_and_line(tmp_path, text, line, field, words):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as e:
        read_table(path)
    assert e.value.file == str(path) and e.value.line == line
    assert f"{path}:{line}" in str(e.value)
    if field:
        assert e.value.field == field
    if words:
        assert words in str(e.value)


def test_missing_table_file(tmp_path):
    with pytest.raises(InputError) as e:
        read_table(tmp_path / "nope.csv")
    assert e.value.file.endswith("nope.csv")


def test_table_entry_takes_priority_over_model():
    call = make_call("aten::mm", [(1024, 1024), (1024, 1024)], ["bf16", "bf16"])
    measured = 123_457
    model = ComputeModel("l40s", table=TimingTable([MeasuredRow(call, measured)]))
    assert model.predict_ns("aten::mm.default", [(1024, 1024), (1024, 1024)], ["bfloat16", "BFloat16"]) == measured
    bare = ComputeModel("l40s")
    assert bare.predict_ns("aten::mm", [(1024, 1024), (1024, 1024)], ["bf16", "bf16"]) != measured
    # another shape, or other extra arguments, is not the measured call: the model answers
    other = model.predict_ns("aten::mm", [(1024, 1024), (1024, 2048)], ["bf16", "bf16"])
    assert other == bare.predict_ns("aten::mm", [(1024, 1024), (1024, 2048)], ["bf16", "bf16"])


def test_curves_json_round_trip_and_errors(tmp_path):
    curves = Curves.default()
    curves.params["gemm"]["eff_max"] = 0.55
    curves.op_mult["aten::sum"] = {"bytes": 1.5}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(curves.to_json()))
    back = load_curves(path)
    assert back.params == curves.params and back.op_mult == curves.op_mult
    bad = curves.to_json()
    bad["params"]["gemm"]["eff_max"] = -1
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError) as e:
        load_curves(path)
    assert e.value.file == str(path) and e.value.field == "params.gemm"
    path.write_text("{not json")
    with pytest.raises(InputError) as e:
        load_curves(path)
    assert e.value.line == 1


def test_unknown_gpu_and_dtype_in_predict():
    with pytest.raises(InputError) as e:
        predict_ns("aten::mm", [(8, 8), (8, 8)], ["bf16", "bf16"], "tpu-v5")
    assert e.value.field == "gpu"
    with pytest.raises(InputError) as e:
        predict_ns("aten::mm", [(8, 8), (8, 8)], ["fp8", "fp8"], "a100")  # A100 has no FP8 tensor cores
    assert e.value.field == "dtype"
    with pytest.raises(InputError) as e:
        predict_ns("aten::mm", [(8, 8), (8, 8)], ["bf16"], "h100")
    assert e.value.field == "dtypes"


def test_transfer_follows_peaks():
    """The L40S-shaped fallback's assumption: the same fraction of each GPU's own peak."""

    def fallback_ns(op: str, shapes: list, gpu: str) -> int:
        return ComputeModel(gpu, public=False).predict_ns(op, shapes, ["bf16", "bf16"])

    big = [(16384, 16384), (16384, 16384)]
    a100, h100 = (fallback_ns("aten::mm", big, g) for g in ("a100", "h100"))
    assert a100 / h100 == pytest.approx(989 / 312, rel=0.02)  # compute-bound: tensor peak ratio
    n = 1 << 30  # 2 GiB operands, far beyond any L2: DRAM-bound
    add = [(n,), (n,)]
    a100, h100 = (fallback_ns("aten::add", add, g) for g in ("a100", "h100"))
    assert a100 / h100 == pytest.approx(3350 / 2039, rel=0.02)  # memory-bound: DRAM bandwidth ratio


def test_predictions_respect_physical_peaks():
    """No prediction beats the data sheet: achieved FLOP/s and bytes/s stay below peak."""
    for gpu in ("a100", "h100", "h200", "b200", "l40s"):
        g = get_gpu(gpu)
        for dtype in ("bf16", "fp16", "fp32"):
            for m in (64, 1024, 8192):
                call = make_call("aten::mm", [(m, m), (m, m)], [dtype, dtype])
                ns = ComputeModel(gpu).predict_call(call)
                peak = g.matmul_peak(compute_features(call).dtype)
                assert 0 < 2 * m**3 / (ns * 1e-9) < peak
        n = 1 << 28
        ns = predict_ns("aten::mul", [(n,), (n,)], ["fp32", "fp32"], gpu)
        assert 3 * 4 * n / (ns * 1e-9) < g.mem_bw


@needs_perfdb
def test_perfdb_tables_read_completely():
    compute = read_table(PERFDB / "compute.csv")
    memcpy = read_table(PERFDB / "memcpy.csv")
    assert len(compute) == 594 and len(memcpy) == 113  # row counts stated in perfdb/README.md
    assert all(r.aliased for r in compute) and not any(r.aliased for r in memcpy)
    # README: ConvDType rows with 0 ns are same-dtype no-ops; the adapter maps exactly those to no kernel
    for r in compute:
        if r.label == "ConvDType":
            assert (compute_features(r.call).op_class == "noop") == (r.nanos == 0)
    lin = next(r for r in compute if r.label == "Linear")
    x, w = lin.call.shapes[:2]
    assert compute_features(lin.call).flops == 2 * x[0] * x[1] * x[2] * w[0]  # README: 2 * numel(X) * N


def test_table_from_another_gpu_is_refused(tmp_path):
    call = make_call("aten::mm", [(8, 8), (8, 8)], ["bf16", "bf16"])
    path = tmp_path / "t.csv"
    write_table(path, [MeasuredRow(call, 777)], comment="measured on an L40S")
    table = TimingTable.from_files([path], gpu="l40s")
    assert ComputeModel("L40S", table=table).predict_call(call) == 777
    with pytest.raises(InputError, match="from l40s, not h100"):
        ComputeModel("h100", table=table)
