"""A call the simulated device cannot run ends the run with one line naming the call and what to do, never
with torch's dispatcher error (some hundred lines listing every backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import BridgeError
from phantora.launcher import RunConfig, launch
from phantora.runtime.unsupported import explain

DISPATCHER = (
    "Could not run '{op}' with arguments from the '{backend}' backend. This could be because the operator doesn't "
    "exist for this backend ... '{op}' is only available for these backends: [CPU, Meta, BackendSelect, Python]."
)

NO_META = "attempted to run this operator with Meta tensors, but there was no fake impl or Meta kernel registered."


def raised(message: str) -> NotImplementedError:
    try:
        raise NotImplementedError(message)
    except NotImplementedError as exc:
        return exc


def test_torchs_missing_kernel_errors_become_one_line_with_what_to_do() -> None:
    cuda = explain(raised(DISPATCHER.format(op="aten::empty_strided", backend="CUDA")))
    assert cuda is not None and cuda.startswith("NotSimulatedError: `raise NotImplementedError(message)` reached")
    assert "aten::empty_strided" in cuda and "'cuda:N'" in cuda and "\n" not in cuda
    meta = explain(raised(DISPATCHER.format(op="aten::histc", backend="Meta")))
    assert meta is not None and "aten::histc" in meta and "without --phantom" in meta
    no_fake = explain(raised(f"aten::bincount: {NO_META}"))
    assert no_fake is not None and "aten::bincount, which has no meta kernel" in no_fake
    assert explain(NotImplementedError("a program's own abstract method")) is None
    assert explain(ValueError(DISPATCHER.format(op="aten::add", backend="CUDA"))) is None


PHANTOM_BINCOUNT = """
import torch
x = torch.randn(16, device="cuda")
counts = torch.bincount((x > 0).long(), minlength=2)
"""


def test_an_op_phantom_mode_cannot_run_ends_the_run_with_one_line(tmp_path: Path) -> None:
    """bincount has no meta kernel (torch's error is a page on torch.compile), and its length is the data's largest
    value + 1 (runtime/data_shapes.py): the run's last line names the program's call, the fixed-length form and
    real mode (without --phantom)."""
    script = tmp_path / "counts.py"
    script.write_text(PHANTOM_BINCOUNT)
    with pytest.raises(BridgeError) as info:
        cfg = RunConfig(str(script), [], "testbed16", nproc=1, tensors="phantom", out_dir=tmp_path / "out")
        launch(cfg)
    log = (tmp_path / "out" / "logs" / "rank0.log").read_text()
    last = log.strip().splitlines()[-1]
    assert last.startswith("phantora: rank 0 failed (at ") and "counts.py:4" in last
    assert "PhantomValueError: phantom mode: `counts = torch.bincount((x > 0).long(), minlength=2)` counts" in last
    assert "index_add_" in last and "without --phantom" in last and "fake impl" not in log
    assert "PhantomValueError" in str(info.value)
