"""`phantora calibrate` and `phantora profile` as a user runs them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from phantora.cli import main
from phantora.paths import shared_dir
from phantora.perfmodel import compute_features, load_curves
from phantora.perfmodel.profiling import default_specs

PERFDB = Path(os.environ.get("PHANTORA_PERFDB", shared_dir() / "perfdb/l40s"))
needs_perfdb = pytest.mark.skipif(not (PERFDB / "memcpy.csv").exists(), reason=f"perfdb not found at {PERFDB}")


@needs_perfdb
def test_calibrate_reports_held_out_errors_and_writes_curves(tmp_path, capsys):
    out = tmp_path / "fit.json"
    argv = ["calibrate", str(PERFDB / "memcpy.csv"), "--gpu", "l40s", "--holdout", "0.3", "--seed", "3"]
    assert main(argv + ["--out", str(out), "--errors", str(tmp_path / "err.csv")]) == 0
    text = capsys.readouterr().out
    assert "113 rows" in text and "| memcpy_h2d |" in text and "| overall |" in text
    curves = load_curves(out)
    assert curves.meta["seed"] == 3 and curves.meta["holdout"] == 0.3
    # HostToDevice at large sizes runs at 13.2 GB/s in memcpy.csv (4451017664 B in 338134239 ns): the fitted
    # PCIe efficiency times the L40S's 32 GB/s must land there.
    assert curves.params["memcpy_h2d"]["e_host"] * 32e9 == pytest.approx(4451017664 / 0.338134239, rel=0.03)
    errors = (tmp_path / "err.csv").read_text().splitlines()
    assert errors[0].startswith("class,op,source") and len(errors) - 1 == curves.meta["test_errors"]["overall"]["rows"]
    again = tmp_path / "again.json"
    assert main(argv + ["--out", str(again)]) == 0
    assert json.loads(again.read_text())["params"] == json.loads(out.read_text())["params"]


def test_calibrate_bad_input_exits_cleanly(tmp_path, capsys):
    table = tmp_path / "t.csv"
    table.write_text('op,shapes,dtypes,extra,nanos\naten::mm,"[[2,2],[2,2]]","[""bf16"",""bf16""]",,4\n')
    assert main(["calibrate", str(table), "--gpu", "v100"]) == 2
    assert "unknown GPU 'v100'" in capsys.readouterr().err
    table.write_text('op,shapes,dtypes,extra,nanos\naten::mm,"[[2,2],[2,2]]",oops,,4\n')
    assert main(["calibrate", str(table), "--gpu", "l40s"]) == 2
    assert f"{table}:2" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_profile_without_cuda_fails_clearly(tmp_path, capsys):
    assert main(["profile", "--out", str(tmp_path / "t.csv")]) == 2
    err = capsys.readouterr().err
    assert "torch.cuda.is_available() is False" in err and "Traceback" not in err
    assert not (tmp_path / "t.csv").exists()


def test_profile_specs_run_on_meta_and_record_matching_calls():
    """Each built-in measurement runs its op (shape-checked on the meta device) and records the call it ran."""
    specs = default_specs()
    assert {s.op_class for s in specs} >= {"gemm", "attention_fwd", "attention_bwd", "elementwise", "foreach"}
    for spec in specs:
        if spec.op_class.startswith("memcpy"):
            continue  # needs pinned host memory
        fn, call = spec.build("meta")
        out = fn()
        assert compute_features(call).op_class == spec.op_class
        if spec.op_class == "gemm":
            assert tuple(out.shape) == (call.shapes[0][0], call.shapes[1][1])
