"""Fitting: deterministic stratified split, recovery of known parameters, and the held-out error on perfdb."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from phantora.errors import InputError
from phantora.paths import shared_dir
from phantora.perfmodel import (
    MeasuredRow,
    class_errors,
    compute_features,
    fit_curves,
    get_gpu,
    make_call,
    predict_rows,
    read_table,
    split_rows,
)

PERFDB = Path(os.environ.get("PHANTORA_PERFDB", shared_dir() / "perfdb/l40s"))
needs_perfdb = pytest.mark.skipif(not (PERFDB / "compute.csv").exists(), reason=f"perfdb not found at {PERFDB}")


@pytest.fixture(scope="module")
def perfdb_rows() -> list[MeasuredRow]:
    return read_table(PERFDB / "compute.csv") + read_table(PERFDB / "memcpy.csv")


@needs_perfdb
def test_split_is_deterministic_stratified_and_disjoint(perfdb_rows):
    rows = perfdb_rows
    a = split_rows(rows, 0.3, 7)
    assert a == split_rows(rows, 0.3, 7)
    assert a != split_rows(rows, 0.3, 8)
    train, test = a
    assert not set(train) & set(test) and sorted(train + test) == list(range(len(rows)))
    assert len(test) == pytest.approx(0.3 * len(rows), abs=12)  # rounding per class
    classes = {}
    for i in train + test:
        classes.setdefault(compute_features(rows[i].call, aliased=rows[i].aliased).op_class, set()).add(i)
    for cls, idx in classes.items():
        if len(idx) >= 2:
            assert idx & set(test) and idx & set(train), cls
    with pytest.raises(InputError):
        split_rows(rows, 1.0, 0)


def _synthetic_copy_rows(sizes: list[int]) -> list[MeasuredRow]:
    """Rows of a made-up GPU that copies bf16->fp32 with a 1000 ns launch floor, at 80% of the L40S data-sheet
    DRAM bandwidth once the copy's 6 bytes per element overflow L2, and at 4 TB/s while they fit."""
    gpu = get_gpu("l40s")
    rows = []
    for n in sizes:
        nbytes = 6 * n
        bw = 4e12 if nbytes < 0.5 * gpu.l2_bytes else 0.8 * gpu.mem_bw
        ns = round(1000 + nbytes / bw * 1e9)
        rows.append(MeasuredRow(make_call("aten::_to_copy", [(n,)], ["bf16"], {"dtype": "fp32"}), ns))
    return rows


def test_fit_recovers_known_floor_and_bandwidth():
    small = [1 << p for p in range(8, 22)]  # up to 12 MiB moved: inside L2
    large = [int(x) for x in np.geomspace(1e8, 2e9, 12)]  # 600 MB to 12 GB moved: DRAM
    rows = _synthetic_copy_rows(small + large)
    curves = fit_curves(rows[::2], "l40s")
    p = curves.params["copy"]
    assert p["floor_ns"] == pytest.approx(1000, rel=0.05)
    assert p["e_dram"] == pytest.approx(0.8, rel=0.02)
    preds = predict_rows(rows[1::2], "l40s", curves)  # sizes the fit never saw
    assert max(x.rel_error for x in preds) < 0.03
    again = fit_curves(rows[::2], "l40s")
    assert json.dumps(again.to_json()) == json.dumps(curves.to_json())  # deterministic


def test_fit_needs_timed_rows():
    rows = [MeasuredRow(make_call("aten::view", [(4,)], ["fp32"]), 0)]
    with pytest.raises(InputError, match="no timed rows"):
        fit_curves(rows, "l40s")


@needs_perfdb
def test_fitted_model_beats_untuned_roofline_on_held_out_rows(perfdb_rows):
    rows = perfdb_rows
    train_idx, test_idx = split_rows(rows, 0.3, 0)
    curves = fit_curves([rows[i] for i in train_idx], "l40s")
    test = [rows[i] for i in test_idx]
    fitted = {e.op_class: e for e in class_errors(predict_rows(test, "l40s", curves))}
    roof = {e.op_class: e for e in class_errors(predict_rows(test, "l40s", None))}
    assert fitted["overall"].median < 0.5 * roof["overall"].median
    assert fitted["overall"].p90 < roof["overall"].p90
    for cls in ("gemm", "elementwise", "copy", "reduction", "fill", "foreach"):
        assert fitted[cls].count >= 10
        assert fitted[cls].median < roof[cls].median, cls
    # the curves are a few numbers, not a copy of the table
    numbers = sum(len(v) for v in curves.params.values()) + sum(len(v) for v in curves.op_mult.values())
    assert numbers < len(train_idx) / 4
